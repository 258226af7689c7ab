"""The report object of a scan, and report.json (SPEC "Dump format", report.json)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.measures.by_turn import TurnDependence
from collapsecheck.measures.early_answer import EarlyAnswer
from collapsecheck.measures.episodes import (
    EPISODE_KEYS,
    LOOPING,
    NO_EPISODES,
    STALLING,
    EpisodeReading,
)
from collapsecheck.measures.flow import NOT_MEASURED, FlowThresholds, FlowVerdict
from collapsecheck.measures.metrics import Estimate, MetricValue, point_value
from collapsecheck.measures.prior import NO_PRIOR, PriorReading
from collapsecheck.measures.token_information import WhereInputShows, position_key
from collapsecheck.measures.verdict import Thresholds, Verdict

REPORT_FORMAT = 1
NO_FLOW = {"regime": NOT_MEASURED, "reason": "a report written before the flow was measured"}
NO_EARLY_ANSWER = {
    "regime": NOT_MEASURED,
    "reason": "a report written before early answering was measured",
}
NO_WHERE = {
    "regime": NOT_MEASURED,
    "reason": "a report written before where the input shows was measured",
}

# The metrics shown in the terminal and in `Report.summary()`, in reading order.
KEY_METRICS = (
    "normalized_mi",
    "retrieval_skill",
    "retrieval_accuracy",
    "mi_seq_estimate",
    "mi_estimate",
    "conditional_entropy_est",
    "conditional_entropy_seq_est",
    "effective_traces_per_prompt",
    "distinct_reasoning_rate",
    "valid_reasoning_rate",
    "truncated_rate",
)
# The flow's metrics, shown where it was measured (SPEC "Information flow").
FLOW_METRICS = (
    "action_state_share",
    "action_reasoning_share",
    "action_input_share",
    "action_state_nmi",
    "distinct_action_rate",
    "valid_action_rate",
)


def _json_number(x: float) -> float | None:
    """JSON has no NaN: an undefined number is written as null."""
    return None if math.isnan(x) or math.isinf(x) else x


def _fields_of(kind: type, values: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in values.items() if k in names}


def metric_to_json(metric: MetricValue) -> Any:
    if isinstance(metric, Estimate):
        return {k: _json_number(v) for k, v in metric.to_dict().items()}
    return _json_number(float(metric))


def to_json(value: Any) -> Any:
    """A structure of metrics (the snr section) in JSON: estimates as value/low/high."""
    if isinstance(value, Estimate | float):
        return metric_to_json(value)
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def from_json(value: Any) -> Any:
    """The inverse of `to_json`: value/low/high objects back into estimates."""
    if isinstance(value, dict):
        if set(value) == {"value", "low", "high"}:
            return metric_from_json(value)
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def metric_from_json(raw: Any) -> MetricValue:
    def number(x: Any) -> float:
        return float("nan") if x is None else float(x)

    if isinstance(raw, dict):
        return Estimate(number(raw.get("value")), number(raw.get("low")), number(raw.get("high")))
    return number(raw)


def episodes_from_dict(data: dict[str, Any]) -> EpisodeReading:
    """report.json's episodes section, its metrics from the report's metrics."""
    section = data.get("episodes")
    if not section:
        return NO_EPISODES
    metrics = {
        k: metric_from_json(data["metrics"][k]) for k in EPISODE_KEYS if k in data["metrics"]
    }
    return EpisodeReading(section["regime"], section["reason"], int(section.get("episodes", 0)),
                          int(section.get("starts", 0)), metrics,
                          dict(section.get("info") or {}))  # fmt: skip


@dataclass
class Report:
    """Everything a scan found: metrics with intervals, the verdict, and how it was run."""

    metrics: dict[str, MetricValue]
    verdict: Verdict
    flow: FlowVerdict
    thresholds: Thresholds
    settings: dict[str, Any]
    counts: dict[str, int | float]
    flow_thresholds: FlowThresholds = field(default_factory=FlowThresholds)
    # SPEC "Early answering": the curve and its regime (summaries in `metrics`)
    early_answer: EarlyAnswer = field(default_factory=lambda: EarlyAnswer(**NO_EARLY_ANSWER))
    # SPEC "Scored under the start": the reading (its numbers in `metrics`)
    prior: PriorReading = field(default_factory=lambda: PriorReading(**NO_PRIOR))
    # SPEC "Where the input shows": the reading and the profile (summaries in `metrics`)
    token_information: WhereInputShows = field(default_factory=lambda: WhereInputShows(**NO_WHERE))
    # SPEC "Agents across turns": the episodes' reading (their numbers in `metrics` too) and
    # input dependence by turn (multi-turn pairs; empty for single-turn prompts)
    episodes: EpisodeReading = NO_EPISODES
    by_turn: list[TurnDependence] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, Any] = field(default_factory=dict)
    # what a reader of the numbers must know (sampling other than the policy's own, say)
    warnings: list[str] = field(default_factory=list)
    snr: dict[str, Any] | None = None  # SPEC "Why: reward variance", None without rewards
    snr_reason: str | None = None  # why there is no snr section
    # SPEC "Per-prompt table" (kept in the dump's per_prompt.jsonl, not in report.json)
    per_prompt: list[dict[str, Any]] = field(default_factory=list, compare=False)
    # where the scan's dump lives (set by a scan with a dump and by `load`; not serialized)
    dump_dir: Path | None = field(default=None, compare=False)
    # the prompts scored, in the order of the per-prompt table and the SNR section's indices
    # (collapsecheck.inputs.prompts.Prompt; set by a scan or score, not serialized)
    prompts: list[Any] = field(default_factory=list, compare=False, repr=False)
    # the episodes behind `episodes` (collapsecheck.inputs.episodes.Episode; set by a scan or
    # score, not serialized: a dump keeps them in episodes.jsonl)
    episode_records: list[Any] = field(default_factory=list, compare=False, repr=False)
    # the matrix and traces behind the numbers, for a scan without a dump to read them from
    # (collapsecheck.reports.evidence.Evidence; not serialized)
    evidence: Any = field(default=None, compare=False, repr=False)

    def value(self, key: str) -> float:
        """Point value of one metric."""
        return point_value(self.metrics[key])

    def scalars(self, prefix: str = "collapse/") -> dict[str, float]:
        """The numbers a trainer's logger takes, under RAGEN-2's key names (SPEC "Metrics",
        "Why: reward variance") after `prefix`: every defined metric's point value, the SNR
        section's numbers, and the verdicts as 0/1 (`collapsed`, `inconclusive`,
        `flow_faithful`); undefined ones (NaN) are left out."""
        values = {key: point_value(v) for key, v in self.metrics.items()}
        values.update(
            (key, point_value(v))
            for key, v in (self.snr or {}).items()
            if isinstance(v, Estimate | float | int) and not isinstance(v, bool)
        )
        values["collapsed"] = float(self.verdict.is_collapse)
        values["inconclusive"] = float(self.verdict.regime == "inconclusive")
        values["kind_uncertain"] = float(self.verdict.kind_uncertain)
        if self.flow.regime != NOT_MEASURED:
            values["flow_faithful"] = float(self.flow.regime == "faithful")
        if self.early_answer.regime != NOT_MEASURED:
            values["early_answer_post_hoc"] = float(self.early_answer.regime == "post_hoc")
            for fraction, agreement in zip(
                self.early_answer.fractions, self.early_answer.agreement, strict=True
            ):
                values[f"early_answer_agreement/{fraction:g}"] = agreement.value
        for position, information in enumerate(self.token_information.by_position):
            values[position_key(position)] = information.value
        if self.episodes.regime != NOT_MEASURED:
            values["episodes_looping"] = float(self.episodes.regime == LOOPING)
            values["episodes_stalling"] = float(self.episodes.regime == STALLING)
        for entry in self.by_turn:
            values.update(
                (f"by_turn/{entry.turn}/{key}", point_value(metric))
                for key, metric in entry.metrics.items()
            )
        return {f"{prefix}{k}": float(v) for k, v in values.items() if not math.isnan(v)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "verdict": self.verdict.to_dict(),
            "flow": self.flow.to_dict(),
            "early_answer": self.early_answer.to_dict(),
            "prior": self.prior.to_dict(),
            "token_information": self.token_information.to_dict(),
            "episodes": self.episodes.to_dict(),
            "by_turn": [entry.to_dict() for entry in self.by_turn],
            "metrics": {k: metric_to_json(v) for k, v in self.metrics.items()},
            "thresholds": {**vars(self.thresholds), **vars(self.flow_thresholds)},
            "counts": self.counts,
            "settings": self.settings,
            "examples": self.examples,
            "warnings": self.warnings,
            "snr": to_json(self.snr),
            "snr_reason": self.snr_reason,
            "timing": self.timing,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def save(self, path: str | Path) -> Path:
        from collapsecheck.files import write_text_atomic

        return write_text_atomic(Path(path), self.to_json())

    def per_prompt_frame(self) -> Any:
        """SPEC "Per-prompt table" as a pandas frame, one row per prompt."""
        from collapsecheck.measures.per_prompt import to_frame

        return to_frame(self.per_prompt)

    def to_frame(self) -> Any:
        """One row per metric: value, low, high (NaN where a metric has no interval)."""
        import pandas as pd

        rows = []
        for key, metric in self.metrics.items():
            low, high = (
                (metric.low, metric.high) if isinstance(metric, Estimate) else (math.nan,) * 2
            )
            rows.append({"metric": key, "value": point_value(metric), "low": low, "high": high})
        return pd.DataFrame(rows).set_index("metric")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        verdict = data["verdict"]
        return cls(
            metrics={k: metric_from_json(v) for k, v in data["metrics"].items()},
            verdict=Verdict(
                verdict["regime"],
                verdict.get("style"),
                bool(verdict["partial"]),
                verdict["reason"],
                bool(verdict.get("kind_uncertain", False)),
            ),
            flow=FlowVerdict(**data.get("flow") or NO_FLOW),
            early_answer=EarlyAnswer.from_dict(data.get("early_answer") or NO_EARLY_ANSWER),
            prior=PriorReading.from_dict(data.get("prior") or NO_PRIOR),
            token_information=WhereInputShows.from_dict(data.get("token_information") or NO_WHERE),
            episodes=episodes_from_dict(data),
            by_turn=[TurnDependence.from_dict(entry) for entry in data.get("by_turn") or []],
            thresholds=Thresholds(**_fields_of(Thresholds, data.get("thresholds", {}))),
            flow_thresholds=FlowThresholds(
                **_fields_of(FlowThresholds, data.get("thresholds", {}))
            ),
            settings=data.get("settings", {}),
            counts=data.get("counts", {}),
            examples=data.get("examples", []),
            timing=data.get("timing", {}),
            warnings=data.get("warnings", []),
            snr=from_json(data.get("snr")),
            snr_reason=data.get("snr_reason"),
        )

    @classmethod
    def load(cls, path: str | Path) -> Report:
        path = Path(path)
        try:
            report = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise CollapsecheckError(f"report not found: {path}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CollapsecheckError(f"{path}: not a collapsecheck report.json ({err})") from None
        report.dump_dir = path.parent
        table = path.parent / "per_prompt.jsonl"
        if table.is_file():
            report.per_prompt = [json.loads(line) for line in table.read_text().splitlines()]
        return report
