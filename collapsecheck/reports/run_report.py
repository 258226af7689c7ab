"""The report of a run directory: one scan report per checkpoint, in step order, and the
onset of collapse. Types only (no pipeline), so the gate, console and plot can use them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapsecheck.files import write_text_atomic
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.trainer_rollouts import RolloutFile
from collapsecheck.measures.early_answer import EARLY_KEYS
from collapsecheck.measures.findings import Finding, Window, shown_series
from collapsecheck.measures.flow import SHARE_KEYS as FLOW_SHARES
from collapsecheck.measures.metrics import point_value
from collapsecheck.measures.onset import Onset
from collapsecheck.measures.prior import PRIOR_METRICS
from collapsecheck.measures.token_information import WHERE_KEYS, position_key
from collapsecheck.reports.report import KEY_METRICS, Report

RUN_FORMAT = 1
EMA_KEYS = ("mi_zscore_ema", "mi_zscore_ema_seq", "marginal_std_ema", "marginal_std_ema_seq")


@dataclass(frozen=True)
class Pairing:
    """One step's rollouts and the run's checkpoint that scores them."""

    rollouts: RolloutFile
    checkpoint: RunCheckpoint

    @property
    def gap(self) -> int:
        """Updates between the checkpoint and the weights that sampled (0: those weights)."""
        return self.rollouts.policy_step - (self.checkpoint.step or 0)

    @property
    def row(self) -> RunCheckpoint:
        """The run table's row: the rollouts' step, scored by the paired checkpoint."""
        return RunCheckpoint(self.checkpoint.name, self.rollouts.step, self.checkpoint.checkpoint)

    def describe(self) -> str:
        return f"{self.checkpoint.name} (gap {self.gap})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": str(self.rollouts.path),
            "trainer": self.rollouts.trainer,
            "step": self.rollouts.step,
            "checkpoint": self.checkpoint.name,
            "checkpoint_step": self.checkpoint.step,
            "gap": self.gap,
        }


@dataclass
class RunStep:
    """One row of a run: the checkpoint scanned (for a row of the trainer's rollouts, the
    rollouts' step and the checkpoint that scored them, `sampled_by` saying how they pair)."""

    checkpoint: RunCheckpoint
    report: Report
    training_log: dict[str, Window] = field(default_factory=dict)  # the trainer's own series
    sampled_by: Pairing | None = None  # for a row of the trainer's rollouts


@dataclass
class RunReport:
    run_dir: Path | str  # a run's folder, or a served policy's URL (`watch URL`)
    steps: list[RunStep]
    onset: Onset | None
    notes: list[str] = field(default_factory=list)  # checkpoints left out, a root read as a step
    training_log: dict[str, Any] | None = None  # source, format, keys, skipped_nonfinite
    training_log_reason: str | None = None  # why there is none
    findings: list[Finding] = field(default_factory=list)
    traces: str | None = None  # where the traces came from, when the trainer sampled them

    @property
    def name(self) -> str:
        """The run's folder name, or the served policy's URL."""
        return self.run_dir if isinstance(self.run_dir, str) else self.run_dir.name

    @property
    def onset_step(self) -> int | str | None:
        if self.onset is None:
            return None
        checkpoint = self.steps[self.onset.index].checkpoint
        return checkpoint.step if checkpoint.step is not None else checkpoint.name

    @property
    def logged_series(self) -> list[str]:
        """The trainer's series shown beside normalized MI (reward, entropy, --train-key)."""
        return shown_series(name for step in self.steps for name in step.training_log)

    @property
    def hosts(self) -> dict[str, list[str]]:
        """The host each step was scanned on (a run joined from shards names several)."""
        hosts: dict[str, list[str]] = {}
        for step in self.steps:
            host = step.report.timing.get("host", "unknown")
            hosts.setdefault(host, []).append(step.checkpoint.label)
        return hosts

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RUN_FORMAT,
            "hosts": self.hosts,
            "run_dir": str(self.run_dir),
            "onset_step": self.onset_step,
            "onset": self.onset.to_dict() if self.onset else None,
            "notes": self.notes,
            "training_log": self.training_log,
            "training_log_reason": self.training_log_reason,
            "findings": [f.to_dict() for f in self.findings],
            "traces": self.traces or "sampled by collapsecheck from the prompt set",
            "steps": [
                {
                    "name": s.checkpoint.name,
                    "step": s.checkpoint.step,
                    "checkpoint": s.checkpoint.checkpoint.where,
                    "format": s.checkpoint.checkpoint.kind,
                    "dump": str(s.report.dump_dir) if s.report.dump_dir else None,
                    "training_log": {k: w.to_dict() for k, w in s.training_log.items()},
                    "rollouts": s.sampled_by.to_dict() if s.sampled_by else None,
                    "report": s.report.to_dict(),
                }
                for s in self.steps
            ],
        }

    @property
    def scored_under_start(self) -> bool:
        """Whether any step's reasoning was scored under the baseline (SPEC "Scored under
        the start")."""
        return any(s.report.prior.baseline is not None for s in self.steps)

    def to_frame(self) -> Any:
        """One row per checkpoint: key metrics, the run-smoothed z-scores and the regime."""
        import pandas as pd

        rows = []
        for step in self.steps:
            metrics = step.report.metrics
            row: dict[str, Any] = {"step": step.checkpoint.label}
            row.update({key: point_value(metrics[key]) for key in (*KEY_METRICS, *EMA_KEYS)})
            row["regime"] = step.report.verdict.regime
            row["kind_uncertain"] = step.report.verdict.kind_uncertain
            row["flow"] = step.report.flow.regime
            row.update({key: point_value(metrics[key]) for key in FLOW_SHARES if key in metrics})
            row.update(where_columns(step.report))
            row["early_answer"] = step.report.early_answer.regime
            row.update({key: point_value(metrics[key]) for key in EARLY_KEYS if key in metrics})
            row["prior"] = step.report.prior.regime
            row.update({key: point_value(metrics[key]) for key in PRIOR_METRICS if key in metrics})
            rows.append(row)
        return pd.DataFrame(rows).set_index("step")

    def save(self, path: Path) -> Path:
        import json

        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


def where_columns(report: Report) -> dict[str, Any]:
    """A run frame's columns of SPEC "Where the input shows": the reading, the summaries
    and the information in each tenth of the reasoning."""
    where = report.token_information
    columns: dict[str, Any] = {"where_input_shows": where.regime}
    columns.update(
        {key: point_value(report.metrics[key]) for key in WHERE_KEYS if key in report.metrics}
    )
    columns.update((position_key(d), value.value) for d, value in enumerate(where.by_position))
    return columns
