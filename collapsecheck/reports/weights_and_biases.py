"""The diagnosis into the trainer's own W&B run (SPEC "Dashboards"), where `wandb` is
installed (the `wandb` extra).

- While the trainer still holds its run (its state on the server is "running"), collapsecheck
  writes as a second writer in W&B's shared mode: not the primary writer, never updating the
  run's finish state, labelled `collapsecheck`. Once the trainer has ended, it resumes the
  run by its id.
- W&B drops a point logged at a step below the run's current step, and a sidecar always lags
  the trainer: the collapse keys get a step metric of their own (`collapse/global_step`, by
  `define_metric`), so each lands at its checkpoint's global step on that axis.
- With WANDB_MODE=offline (no server), the keys go to an offline run of the same id, for
  `wandb sync`; shared mode needs a server. Tested here offline only (docs/runs.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.reports.dashboard import Dashboard

STEP_KEY = "collapse/global_step"
LABEL = "collapsecheck"
OFFLINE_MODES = ("offline", "dryrun")


def parse_run_path(run_path: str) -> tuple[str, str, str]:
    parts = run_path.split("/")
    if len(parts) != 3 or not all(parts):
        raise CollapsecheckError(f"--wandb must be ENTITY/PROJECT/RUN_ID, got {run_path!r}")
    return parts[0], parts[1], parts[2]


class WandbWriter(Dashboard):
    """Scalars into the W&B run `entity/project/run_id`; its ledger of steps written under
    `ledger_dir` (the results cache)."""

    def __init__(self, run_path: str, ledger_dir: Path) -> None:
        self.entity, self.project, self.run_id = parse_run_path(run_path)
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise CollapsecheckError(
                "--wandb needs the wandb package (pip install 'collapsecheck[wandb]')"
            ) from None
        self.ledger_dir = ledger_dir
        self._run: Any = None

    def ledger(self) -> Path:
        return (
            self.ledger_dir
            / "dashboards"
            / f"wandb-{self.entity}-{self.project}-{self.run_id}.json"
        )

    def run(self) -> Any:
        """The W&B run, joined at the first write (see the module's note on the modes)."""
        if self._run is not None:
            return self._run
        import wandb

        # a service inherited from the trainer's process would refuse its own run's id
        os.environ.pop("WANDB_SERVICE", None)
        where = {"entity": self.entity, "project": self.project, "id": self.run_id}
        if os.environ.get("WANDB_MODE") in OFFLINE_MODES:
            run = wandb.init(**where, settings=wandb.Settings(mode="offline", silent=True))
        elif self.trainer_holds_run():
            shared = wandb.Settings(
                mode="shared", x_primary=False, x_label=LABEL, x_update_finish_state=False,
                silent=True,
            )  # fmt: skip
            run = wandb.init(**where, settings=shared)
        else:
            run = wandb.init(**where, resume="must", settings=wandb.Settings(silent=True))
        run.define_metric(STEP_KEY)
        run.define_metric("collapse/*", step_metric=STEP_KEY)
        self._run = run
        return run

    def trainer_holds_run(self) -> bool:
        import wandb

        path = f"{self.entity}/{self.project}/{self.run_id}"
        try:
            return wandb.Api().run(path).state == "running"
        except Exception as err:  # the API raises several kinds, none of them ours
            raise CollapsecheckError(f"--wandb {path}: cannot read the run ({err})") from None

    def emit(self, step: int, scalars: dict[str, float]) -> None:
        self.run().log({**scalars, STEP_KEY: step})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
