"""The diagnosis into TensorBoard, beside the trainer's own curves (SPEC "Dashboards"): the
scalars at each checkpoint's global step, into the folder given, as a run of its own
(`DIR/collapsecheck/`): TensorBoard lists it beside the trainer's run, and the trainer's
event file stays the only writer of its folder (TensorBoard's directory loader follows one
event file per folder). Written with torch's `SummaryWriter`, which needs the `tensorboard`
package (the `logs` extra)."""

from __future__ import annotations

import os
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.reports.dashboard import Dashboard

AUTO = "auto"
RUN_NAME = "collapsecheck"  # the sub-folder, a TensorBoard run of its own
LEDGER = ".collapsecheck-steps.json"
EVENTS = "events.out.tfevents"
LOGGING_DIR_ENV = "TENSORBOARD_LOGGING_DIR"  # where the Hugging Face Trainer logs, when set


def require_writer() -> None:
    """Refuse --tensorboard before any work where the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise CollapsecheckError(
            "--tensorboard needs the tensorboard package (pip install 'collapsecheck[logs]')"
        ) from None


def find_trainer_folder(run_dir: Path) -> Path:
    """--tensorboard auto: the Hugging Face Trainer's $TENSORBOARD_LOGGING_DIR where it is
    set, else the folder under the run directory where the trainer's own event files are
    (veRL's tensorboard_log/PROJECT/EXPERIMENT, the HF Trainer's runs/...), the one written
    last where there are several."""
    named = os.environ.get(LOGGING_DIR_ENV)
    if named:
        return Path(named)
    files = [p for p in run_dir.rglob(f"{EVENTS}*") if p.parent.name != RUN_NAME]
    if not files:
        raise CollapsecheckError(
            f"--tensorboard auto: no TensorBoard event files under {run_dir}; name the "
            "trainer's log folder (--tensorboard DIR)"
        )
    return max(files, key=lambda p: p.stat().st_mtime).parent


class TensorBoardWriter(Dashboard):
    """Scalars into `folder`/collapsecheck (`folder` None: the trainer's own log folder
    under `run_dir`, found at the first write)."""

    def __init__(self, folder: Path | None, run_dir: Path) -> None:
        require_writer()
        self.folder, self.run_dir = folder, run_dir

    @property
    def target(self) -> Path:
        if self.folder is None:
            self.folder = find_trainer_folder(self.run_dir)
        return self.folder / RUN_NAME

    def ledger(self) -> Path:
        return self.target / LEDGER

    def emit(self, step: int, scalars: dict[str, float]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.target.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(self.target), filename_suffix=".collapsecheck")
        try:
            for key, value in sorted(scalars.items()):
                writer.add_scalar(key, value, global_step=step)
        finally:
            writer.close()
