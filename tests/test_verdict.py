"""The verdict (SPEC "The verdict") on hand-made metric values."""

import pytest

from collapsecheck.measures.metrics import Estimate
from collapsecheck.measures.verdict import Support, Thresholds, decide

LOG_N = 2.772588722239781  # 16 prompts
TOKENS = 20  # reasoning tokens per trace
ENOUGH = Support(responses=128, scored_traces=128, scored_prompts=16)  # 16 prompts x K 8


def metrics(skill, nmi, entropy, width=0.0):
    """Hand-made metrics; `entropy` is H(Z|X) per token."""

    def est(v):
        return Estimate(v, v - width, v + width)

    return {
        "retrieval_skill": est(skill),
        "normalized_mi": est(nmi),
        "mi_seq_estimate": est(nmi * LOG_N),
        "mi_upper_bound": LOG_N,
        "conditional_entropy_est": est(entropy),
        "effective_traces_per_prompt": est(2.718281828 ** (entropy * TOKENS)),
        "retrieval_accuracy": est(skill),
        "retrieval_chance_level": 0.1,
    }


@pytest.mark.parametrize(
    ("skill", "nmi", "entropy", "regime", "style", "partial"),
    [
        (0.95, 0.9, 0.3, "grounded", "diverse", False),
        (0.95, 0.9, 0.02, "grounded", "compressed", False),
        (0.05, 0.02, 0.9, "template_collapse", None, False),
        (0.05, 0.02, 0.01, "low_entropy_collapse", None, False),
        (0.5, 0.45, 0.6, "template_collapse", None, True),
        (0.9, 0.5, 0.6, "template_collapse", None, True),
        (0.5, 0.45, 0.03, "low_entropy_collapse", None, True),
    ],
)
def test_regimes(skill, nmi, entropy, regime, style, partial):
    verdict = decide(metrics(skill, nmi, entropy), ENOUGH)
    assert (verdict.regime, verdict.style, verdict.partial) == (regime, style, partial)


def test_thresholds_are_inclusive_as_specified():
    assert decide(metrics(0.7, 0.7, 0.2), ENOUGH).regime == "grounded"
    assert decide(metrics(0.9, 0.9, 0.05), ENOUGH).style == "diverse"  # low is strictly below 0.05
    collapsed = decide(metrics(0.3, 0.3, 0.2), ENOUGH)
    assert (collapsed.regime, collapsed.partial) == ("template_collapse", False)


def test_interval_straddling_the_high_threshold_is_inconclusive():
    verdict = decide(metrics(0.75, 0.8, 0.3, width=0.1), ENOUGH)
    assert verdict.regime == "inconclusive"
    assert "raise the number of prompts" in verdict.reason
    assert "retrieval_skill interval [0.65, 0.85] straddles 0.7" in verdict.reason


def test_collapse_of_uncertain_kind_is_still_a_collapse():
    # the GRPO run's checkpoint-60: dependence collapsed beyond its interval, entropy 0.031
    # [0.008, 0.066] across the 0.05 line: a collapse, its kind open
    values = metrics(0.0, 0.003, 0.031)
    values["conditional_entropy_est"] = Estimate(0.031, 0.008, 0.066)
    verdict = decide(values, ENOUGH)
    assert verdict.is_collapse and verdict.kind_uncertain
    assert verdict.regime == "low_entropy_collapse"  # the point estimate's kind
    assert verdict.label == "low_entropy_collapse (kind uncertain)"
    assert "conditional entropy interval [0.01, 0.07] straddles 0.05" in verdict.reason
    above = decide(metrics(0.05, 0.05, 0.06, width=0.02), ENOUGH)
    assert (above.regime, above.kind_uncertain) == ("template_collapse", True)
    partial = decide(metrics(0.5, 0.45, 0.05, width=0.02), ENOUGH)
    assert partial.label == "template_collapse (partial, kind uncertain)"
    # a kind the interval settles is not uncertain
    assert not decide(metrics(0.05, 0.05, 0.5, width=0.02), ENOUGH).kind_uncertain
    # for a grounded policy the entropy only changes the style, never the regime
    grounded = decide(metrics(0.95, 0.95, 0.05, width=0.02), ENOUGH)
    assert (grounded.regime, grounded.style, grounded.kind_uncertain) == (
        "grounded",
        "diverse",
        False,
    )


def test_grounded_or_collapsed_stays_inconclusive_and_the_default_gate_says_it_passes_it():
    from collapsecheck.config import GateConfig
    from collapsecheck.reports.gate import check_report
    from collapsecheck.reports.report import Report

    verdict = decide(metrics(0.72, 0.75, 0.4, width=0.1), ENOUGH)
    assert verdict.regime == "inconclusive" and not verdict.kind_uncertain
    assert "could be grounded or a collapse" in verdict.reason
    report = Report.from_dict(
        {"metrics": {}, "verdict": verdict.to_dict(), "settings": {}, "counts": {}}
    )
    (regime, _flow, _early) = check_report(report, GateConfig())
    assert regime.passed and regime.undecided
    assert "--fail-on inconclusive fails it" in regime.message
    strict = GateConfig(fail_on=frozenset({"inconclusive"}))
    (regime, _flow, _early) = check_report(report, strict)
    assert not regime.passed and not regime.undecided


def test_reason_names_the_numbers():
    reason = decide(metrics(0.12, 0.03, 1.42), ENOUGH).reason
    assert "retrieval 0.12 vs chance 0.10, normalized MI 0.03" in reason
    assert "does not depend on the input" in reason
    assert "entropy 1.420 nats/token (> 10,000 effective traces per prompt)" in reason  # 2.16e+12
    low = decide(metrics(0.12, 0.03, 0.05), ENOUGH).reason  # 20 tokens at 0.05 nats: e^1 traces
    assert "entropy 0.050 nats/token (2.7 effective traces per prompt)" in low


def test_custom_thresholds():
    loose = Thresholds(dependence_high=0.4, dependence_collapsed=0.1, entropy_low=0.5)
    assert decide(metrics(0.5, 0.45, 0.8), ENOUGH, loose).regime == "grounded"
    with pytest.raises(ValueError):
        Thresholds(dependence_high=0.2, dependence_collapsed=0.5)


def test_matched_far_below_marginal_is_a_mismatch_not_a_collapse():
    mismatch = decide(metrics(0.0, -0.3, 0.5, width=0.05), ENOUGH)
    assert mismatch.regime == "inconclusive"
    assert "unlikely under this checkpoint and these contexts" in mismatch.reason
    # a collapsed policy's own traces sit at MI about 0, within noise: still a collapse
    assert decide(metrics(0.0, -0.01, 0.5, width=0.05), ENOUGH).regime == "template_collapse"
    assert decide(metrics(0.0, -0.04, 0.5, width=0.0), ENOUGH).regime == "template_collapse"


def test_effective_traces_read_as_counts():
    from collapsecheck.formatting import format_metric

    key = "effective_traces_per_prompt"
    shown = [format_metric(key, x) for x in (1.234, 9.96, 12.6, 284.427, 2537.2, 12_000.0)]
    assert shown == ["1.2", "10.0", "13", "284", "2,537", "> 10,000"]


@pytest.mark.parametrize(
    ("support", "reason"),
    [
        (Support(8, 1, 1, 0), "1 trace scored of 8: 7 have no reasoning segment; they come from "
         "1 prompt, and a verdict needs scored traces from at least 4"),
        (Support(24, 9, 3, 5), "9 traces scored of 24: 15 have no reasoning segment (5 of the "
         "responses cut by the length limit); they come from 3 prompts"),
        (Support(6, 6, 2, 0), "6 traces scored of 6; they come from 2 prompts"),
    ],
)  # fmt: skip
def test_too_few_prompts_with_a_scored_trace_carry_no_verdict(support, reason):
    """SPEC "Enough to carry a verdict": below 4 prompts with a scored trace the verdict is
    inconclusive, saying what was scored of what, whatever the numbers say, the clearest
    grounding or the clearest collapse."""
    for numbers in (metrics(1.0, 1.0, 0.3), metrics(0.0, 0.0, 0.01)):
        verdict = decide(numbers, support)
        assert verdict.regime == "inconclusive" and not verdict.is_collapse
        assert verdict.reason.startswith(reason)
    assert decide(metrics(1.0, 1.0, 0.3), Support(8, 4, 4, 0)).regime == "grounded"


def test_support_reads_a_reports_counts():
    counts = {"prompts": 8, "responses": 16, "scored_traces": 1, "scored_prompts": 1,
              "truncated_responses": 0}  # fmt: skip
    assert Support.of(counts) == Support(16, 1, 1, 0)
