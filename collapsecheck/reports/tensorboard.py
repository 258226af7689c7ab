"""The diagnosis into TensorBoard, beside the trainer's own curves: each checkpoint's
`Report.scalars()` (RAGEN-2's keys under `collapse/`, the names `CollapseCallback` logs) and
its verdict as a code (SPEC "Dashboards"), at the checkpoint's global step, into the folder
given, as a run of its own (`DIR/collapsecheck/`): TensorBoard lists it beside the trainer's
run, and the trainer's event file stays the only writer of its folder (TensorBoard's
directory loader follows one event file per folder). Written with torch's `SummaryWriter`,
which needs the `tensorboard` package (the `logs` extra).

A step is written once: a ledger in the folder keeps each step's digest of values, so a
restarted watcher, or `scan RUN --tensorboard` run again, adds no second point at a step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_text_atomic
from collapsecheck.measures.verdict import (
    GROUNDED,
    INCONCLUSIVE,
    LOW_ENTROPY_COLLAPSE,
    TEMPLATE_COLLAPSE,
)
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport

AUTO = "auto"
RUN_NAME = "collapsecheck"  # the sub-folder, a TensorBoard run of its own
LEDGER = ".collapsecheck-steps.json"
EVENTS = "events.out.tfevents"
# SPEC "Dashboards": the verdict as a number a curve can show
VERDICT_CODES = {GROUNDED: 0, INCONCLUSIVE: 1, TEMPLATE_COLLAPSE: 2, LOW_ENTROPY_COLLAPSE: 3}


def require_writer() -> None:
    """Refuse --tensorboard before any work where the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise CollapsecheckError(
            "--tensorboard needs the tensorboard package (pip install 'collapsecheck[logs]')"
        ) from None


def find_trainer_folder(run_dir: Path) -> Path:
    """--tensorboard auto: the folder under the run directory where the trainer's own event
    files are (veRL's tensorboard_log/PROJECT/EXPERIMENT, the HF Trainer's runs/...), the one
    written last where there are several."""
    files = [p for p in run_dir.rglob(f"{EVENTS}*") if p.parent.name != RUN_NAME]
    if not files:
        raise CollapsecheckError(
            f"--tensorboard auto: no TensorBoard event files under {run_dir}; name the "
            "trainer's log folder (--tensorboard DIR)"
        )
    return max(files, key=lambda p: p.stat().st_mtime).parent


def dashboard_scalars(report: Report) -> dict[str, float]:
    """The keys a dashboard gets for one checkpoint: `Report.scalars()` less the run-smoothed
    ones (`_ema`: they change as earlier steps join the run, and TensorBoard smooths a curve
    itself), and the verdict's code."""
    scalars = {key: value for key, value in report.scalars().items() if "_ema" not in key}
    return {**scalars, "collapse/verdict_code": float(VERDICT_CODES[report.verdict.regime])}


class TensorBoardWriter:
    """Scalars at global steps into `folder`/collapsecheck (`folder` None: the trainer's own
    log folder under `run_dir`, found at the first write), each step once."""

    def __init__(self, folder: Path | None, run_dir: Path) -> None:
        require_writer()
        self.folder, self.run_dir = folder, run_dir

    @property
    def target(self) -> Path:
        if self.folder is None:
            self.folder = find_trainer_folder(self.run_dir)
        return self.folder / RUN_NAME

    def _ledger(self) -> dict[str, str]:
        try:
            return json.loads((self.target / LEDGER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def write_run(self, run: RunReport | Report | None) -> None:
        """Every step of a run (`scan RUN --tensorboard`); a run's rows without a step
        number are left out, and so said."""
        if not isinstance(run, RunReport):
            raise CollapsecheckError(
                "--tensorboard writes a run's checkpoints at their global steps: give a run "
                "directory"
            )
        for step in run.steps:
            if step.checkpoint.step is not None:
                self.write(step.checkpoint.step, step.report)

    def write(self, step: int, report: Report) -> bool:
        """Write one checkpoint's scalars at `step`; False where that step was written
        already with the same values."""
        scalars = dashboard_scalars(report)
        digest = hashlib.sha256(json.dumps(scalars, sort_keys=True).encode()).hexdigest()
        ledger = self._ledger()
        if ledger.get(str(step)) == digest:
            return False
        from torch.utils.tensorboard import SummaryWriter

        self.target.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(self.target), filename_suffix=".collapsecheck")
        try:
            for key, value in sorted(scalars.items()):
                writer.add_scalar(key, value, global_step=step)
        finally:
            writer.close()
        ledger[str(step)] = digest
        write_text_atomic(self.target / LEDGER, json.dumps(ledger, indent=1, sort_keys=True) + "\n")
        return True
