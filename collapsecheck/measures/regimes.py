"""The readings' names and the lines they are drawn at: the verdict's regimes and thresholds
(SPEC "The verdict"), the flow's (SPEC "Information flow"), early answering's (SPEC "Early
answering") and the episodes' (SPEC "Agents across turns").

Plain Python, no numpy or scipy: the gate's settings and a config file are read and checked
against these names before any array library loads (docs/decisions.md, "Start-up"); the
measures that decide each reading import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INCONCLUSIVE, NOT_MEASURED = "inconclusive", "not_measured"

# SPEC "The verdict"
GROUNDED = "grounded"
TEMPLATE_COLLAPSE = "template_collapse"
LOW_ENTROPY_COLLAPSE = "low_entropy_collapse"
REGIMES = (GROUNDED, TEMPLATE_COLLAPSE, LOW_ENTROPY_COLLAPSE, INCONCLUSIVE)
COLLAPSES = (TEMPLATE_COLLAPSE, LOW_ENTROPY_COLLAPSE)

# SPEC "Information flow"
ACTION_COLLAPSE, FAITHFUL, DECORATIVE, MIXED = "action_collapse", "faithful", "decorative", "mixed"

# SPEC "Early answering"
POST_HOC, REASONING_DECIDES = "post_hoc", "reasoning_decides"

# SPEC "Agents across turns"
LOOPING, STALLING, PROGRESSING = "looping", "stalling", "progressing"


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (SPEC defaults; every one is a CLI option and a config value)."""

    dependence_high: float = 0.7
    dependence_collapsed: float = 0.3
    entropy_low: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.dependence_collapsed <= self.dependence_high <= 1.0:
            raise ValueError(
                "thresholds need 0 <= dependence_collapsed <= dependence_high <= 1, got "
                f"{self.dependence_collapsed} and {self.dependence_high}"
            )


@dataclass(frozen=True)
class FlowThresholds:
    """Flow verdict thresholds (SPEC defaults; each a CLI option and a config value)."""

    flow_collapsed: float = 0.3  # action_state_share at most this: action collapse
    flow_faithful: float = 0.5  # action_reasoning_share at least this: faithful
    flow_decorative_reasoning: float = 0.2  # action_reasoning_share at most this, and
    flow_decorative_input: float = 0.5  # action_input_share at least this: decorative
    # SPEC "Early answering": post hoc at or above this early_answer_without_reasoning
    early_post_hoc: float = 0.8
    # SPEC "Agents across turns": looping at or above this revisit_rate lower bound, stalling
    # at or above this stall_rate lower bound
    looping_line: float = 0.2
    stalling_line: float = 0.3


@dataclass(frozen=True)
class VerdictThresholds:
    """The thresholds the verdicts are decided with: never part of a cache key, since a
    cached report's verdicts are decided again from its metrics."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    flow: FlowThresholds = field(default_factory=FlowThresholds)

    @classmethod
    def of(cls, thresholds: Thresholds | None, flow: FlowThresholds | None) -> VerdictThresholds:
        return cls(thresholds or Thresholds(), flow or FlowThresholds())
