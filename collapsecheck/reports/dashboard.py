"""A dashboard the team already watches, as one more report: each checkpoint's numbers at its
global step (SPEC "Dashboards"). A dashboard writes a step once: a ledger keeps each step's
digest of values, so a restarted watcher, or `scan RUN` run again, adds no second point at a
step. TensorBoard (`reports.tensorboard`) and W&B (`reports.weights_and_biases`) are the two;
each says where its ledger lives and how it emits one step."""

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

# SPEC "Dashboards": the verdict as a number a curve can show
VERDICT_CODES = {GROUNDED: 0, INCONCLUSIVE: 1, TEMPLATE_COLLAPSE: 2, LOW_ENTROPY_COLLAPSE: 3}


def dashboard_scalars(report: Report) -> dict[str, float]:
    """The keys a dashboard gets for one checkpoint: `Report.scalars()` less the run-smoothed
    ones (`_ema`: they change as earlier steps join the run, and a dashboard smooths a curve
    itself), and the verdict's code."""
    scalars = {key: value for key, value in report.scalars().items() if "_ema" not in key}
    return {**scalars, "collapse/verdict_code": float(VERDICT_CODES[report.verdict.regime])}


class Dashboard:
    """One dashboard: `ledger` (the file of the steps written) and `emit` (one step's
    scalars) are each dashboard's own."""

    def ledger(self) -> Path:
        raise NotImplementedError

    def emit(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Let the dashboard go (a W&B run is finished)."""

    def _written(self) -> dict[str, str]:
        try:
            return json.loads(self.ledger().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def write(self, step: int, report: Report) -> bool:
        """One checkpoint's scalars at `step`; False where that step was written already
        with the same values."""
        scalars = dashboard_scalars(report)
        digest = hashlib.sha256(json.dumps(scalars, sort_keys=True).encode()).hexdigest()
        written = self._written()
        if written.get(str(step)) == digest:
            return False
        self.emit(step, scalars)
        written[str(step)] = digest
        write_text_atomic(self.ledger(), json.dumps(written, indent=1, sort_keys=True) + "\n")
        return True

    def write_run(self, run: RunReport | Report | None) -> None:
        """Every step of a run (`scan RUN`); rows without a step number are left out."""
        if not isinstance(run, RunReport):
            raise CollapsecheckError(
                "a dashboard takes a run's checkpoints at their global steps: give a run directory"
            )
        for step in run.steps:
            if step.checkpoint.step is not None:
                self.write(step.checkpoint.step, step.report)
