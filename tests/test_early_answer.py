"""Early answering (SPEC "Early answering"): the curve and its summaries on hand-made
matrices, E against plain forward passes of each cut context, the three demo policies read
as they were trained, and what the user gets (dump, compare, gate, console, dashboards)."""

import json
import math
import warnings

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from collapsecheck import scan
from collapsecheck.cli import app
from collapsecheck.measures.early_answer import (
    EarlyLogProbs,
    compute_early_answer,
    cut_length,
)
from collapsecheck.reports.compare import compare_reports
from collapsecheck.reports.report import Report
from tests.conftest import EXAMPLES, PROMPTS
from tests.tolerances import metric_atol

DEMOS = EXAMPLES / "checkpoints" / "early-answer"
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
N, K = 4, 3
SETTINGS = {"k": 4, "num_prompts": 16, "max_new_tokens": 96, "device": "cpu"}


def curve(agreements, rows_per_prompt=K):
    """E for N prompts x K rows whose exp is `agreements[f]` in every row."""
    rows = np.repeat(np.arange(N), rows_per_prompt)
    values = np.log(np.tile(np.array(agreements, dtype=float), (len(rows), 1)))
    return EarlyLogProbs(values, FRACTIONS, rows, N)


def test_an_action_there_before_the_reasoning_is_post_hoc():
    early, metrics = compute_early_answer(curve([0.9] * 5), resamples=200)
    assert metrics["early_answer_without_reasoning"].value == pytest.approx(1.0)
    assert metrics["early_answer_aoc"].value == pytest.approx(0.0, abs=1e-12)
    assert metrics["early_answer_decided_at"].value == 0.0
    assert [a.value for a in early.agreement] == pytest.approx([0.9] * 5)
    assert early.regime == "post_hoc"
    assert "decided before the reasoning" in early.reason


def test_an_action_the_reasoning_decides_at_its_end():
    early, metrics = compute_early_answer(curve([0.2, 0.2, 0.2, 0.2, 0.8]), resamples=200)
    # relative 0.25 up to the end: area over the curve 0.25 * (0.75 * 3 + (0.75 + 0) / 2)
    assert metrics["early_answer_aoc"].value == pytest.approx(0.25 * (2.25 + 0.375))
    assert metrics["early_answer_without_reasoning"].value == pytest.approx(0.25)
    assert metrics["early_answer_decided_at"].value == 1.0
    assert [r.value for r in early.relative] == pytest.approx([0.25] * 4 + [1.0])
    assert early.regime == "reasoning_decides"
    assert "only at the end of its reasoning" in early.reason


def test_an_action_decided_a_quarter_into_the_reasoning():
    early, metrics = compute_early_answer(curve([0.25, 1, 1, 1, 1]), resamples=200)
    assert metrics["early_answer_aoc"].value == pytest.approx(0.25 * 0.75 / 2)
    assert metrics["early_answer_decided_at"].value == 0.25
    assert "after 25% of its reasoning" in early.reason


def test_the_agreement_is_a_mean_over_rows_with_intervals_over_prompts():
    """Prompts that differ: the point is the row mean, the interval spans the prompts."""
    rows = np.repeat(np.arange(N), K)
    at_zero = np.repeat([0.1, 0.4, 0.7, 1.0], K)
    values = np.log(np.column_stack([at_zero, *(np.ones(len(rows)),) * 4]))
    early, metrics = compute_early_answer(EarlyLogProbs(values, FRACTIONS, rows, N))
    assert early.agreement[0].value == pytest.approx(at_zero.mean())
    assert early.agreement[0].low < 0.4 and early.agreement[0].high > 0.7
    # 0.55 relative, its interval wide enough to reach past 0.8: not decided
    assert metrics["early_answer_without_reasoning"].high > 0.8
    assert early.regime == "inconclusive"


def test_resamples_that_draw_none_of_the_rows_warn_nothing():
    """Rows from 2 of 8 prompts: many resamples draw none of them. They have no curve (left
    out of the intervals), and numpy says nothing on stderr about it."""
    rows = np.array([0, 0, 1, 1])
    values = np.log(np.tile([0.2, 0.4, 0.6, 0.8, 0.9], (4, 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        early, _ = compute_early_answer(EarlyLogProbs(values, FRACTIONS, rows, 8), resamples=200)
    assert all(math.isfinite(a.low) and math.isfinite(a.high) for a in early.agreement)


def test_a_cut_keeps_floor_f_t_tokens():
    assert [cut_length(f, 100) for f in (0.0, 0.29, 0.5, 1.0)] == [0, 29, 50, 100]
    assert [cut_length(f, 3) for f in FRACTIONS] == [0, 0, 1, 2, 3]


@pytest.fixture(scope="module")
def decided_early(tmp_path_factory):
    dump = tmp_path_factory.mktemp("decided-early")
    return scan(DEMOS / "decided-early", PROMPTS, dump=dump, dtype="float32", **SETTINGS), dump


def plain_logprob(model, context, continuation, scored_from):
    """One unpadded forward pass over [context | continuation], the scored tokens summed by
    hand in float64."""
    ids = torch.tensor([list(context) + list(continuation)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    start = len(context) + scored_from
    return sum(logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1]))


def test_e_equals_a_plain_forward_pass_of_each_cut_context(decided_early):
    """Every E[r, f] of the dump against the model run on the cut context itself."""
    _, dump = decided_early
    prompts = [json.loads(line) for line in (dump / "prompts.jsonl").open()]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    with np.load(dump / "action_logprobs.npz") as npz:
        early, fractions = npz["early"], npz["early_fractions"]
        rows, natural = npz["row_trace_index"], npz["natural"]
    assert tuple(fractions) == FRACTIONS and early.shape == (len(rows), 5)
    assert np.array_equal(early[:, -1], np.diag(natural))  # f = 1: the whole reasoning
    model = AutoModelForCausalLM.from_pretrained(DEMOS / "decided-early", dtype=torch.float32)
    for row in range(0, len(rows), 5):  # every fifth flow-valid trace, all its cuts
        trace = traces[rows[row]]
        context = prompts[trace["prompt_index"]]["ids"]
        for column, fraction in enumerate(FRACTIONS):
            kept = math.floor(round(fraction * len(trace["reasoning_ids"]), 9))
            cut = trace["prefix_ids"] + trace["reasoning_ids"][:kept] + trace["mid_ids"]
            expected = plain_logprob(model, context, cut + trace["action_ids"], len(cut))
            assert early[row, column] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("name", "regime", "decided_at"),
    [
        ("decided-early", "reasoning_decides", 0.25),
        ("decided-late", "reasoning_decides", 1.0),
        ("post-hoc", "post_hoc", 0.0),
    ],
)
def test_each_demo_policy_reads_as_trained(name, regime, decided_at, decided_early):
    """decided early: the move is named first, a coin flip before it; decided late: named
    last; post hoc: read from the input whatever the reasoning (scripts/make_fixtures.py)."""
    report = (
        decided_early[0] if name == "decided-early" else scan(DEMOS / name, PROMPTS, **SETTINGS)
    )
    assert report.early_answer.regime == regime, report.early_answer.reason
    assert report.value("early_answer_decided_at") == decided_at
    relative = [r.value for r in report.early_answer.relative]
    if name == "decided-late":  # a coin flip over 4 moves until the move is named
        assert max(relative[:-1]) < 0.4
    if name == "post-hoc":
        assert report.value("early_answer_aoc") < 0.1


def test_without_early_answering_nothing_is_scored_for_it(decided_early):
    report, _ = decided_early
    skipped = scan(DEMOS / "decided-early", PROMPTS, no_early_answer=True, **SETTINGS)
    assert skipped.early_answer.regime == "not_measured"
    assert skipped.early_answer.reason == "--no-early-answer"
    assert math.isnan(skipped.value("early_answer_aoc"))
    # the same traces and scores; the batches differ, so float32 rounding may
    assert skipped.value("normalized_mi") == pytest.approx(
        report.value("normalized_mi"), abs=metric_atol(SETTINGS["max_new_tokens"])
    )
    assert skipped.timing["tokens_scored"] < report.timing["tokens_scored"]
    assert "collapse/early_answer_agreement/0.25" not in skipped.scalars()
    scalars = report.scalars()
    assert scalars["collapse/early_answer_agreement/0.25"] == report.early_answer.agreement[1].value
    assert scalars["collapse/early_answer_post_hoc"] == 0.0


def test_the_report_round_trips_and_compare_pairs_the_curves(decided_early, tmp_path):
    report, dump = decided_early
    loaded = Report.load(dump / "report.json")
    assert loaded.early_answer == report.early_answer
    late_dump = tmp_path / "late"
    late = scan(DEMOS / "decided-late", PROMPTS, dump=late_dump, dtype="float32", **SETTINGS)
    comparison = compare_reports(loaded, Report.load(late_dump / "report.json"))
    assert comparison.paired
    delta = comparison.deltas["early_answer_aoc"]
    expected = late.value("early_answer_aoc") - report.value("early_answer_aoc")
    assert delta.value == pytest.approx(expected)
    assert delta.low > 0  # B waits for its reasoning longer, beyond noise
    assert "B's action waits for its reasoning more than A's beyond noise" in comparison.reason
    assert "early_answer_agreement/0.25" in comparison.deltas


def test_the_console_says_when_the_action_is_decided_and_the_gate_can_fail_on_post_hoc():
    args = ["scan", str(DEMOS / "post-hoc"), "-p", str(PROMPTS), "-n", "16", "-k", "4",
            "--max-new-tokens", "96", "--device", "cpu", "--fail-on", "post_hoc"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 1, output
    assert "early answer: post hoc — forced before any reasoning, the action agrees" in output
    assert "gate failed (rule: early answer): early answer verdict post_hoc" in output


@pytest.mark.parametrize("given", ["0.5,1", "0,0.5", "0,1.5,1", "0,half,1"])
def test_bad_fractions_are_one_clear_line(given):
    args = ["scan", str(DEMOS / "post-hoc"), "-p", str(PROMPTS), "--device", "cpu",
            "--early-answer-fractions", given]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--early-answer-fractions" in result.output
    assert "Traceback" not in result.output


def test_curves_at_other_fractions_are_not_compared_and_compare_says_so(decided_early):
    report, _ = decided_early
    coarse = scan(DEMOS / "decided-early", PROMPTS, early_answer_fractions="0,0.5,1", **SETTINGS)
    assert coarse.early_answer.fractions == (0.0, 0.5, 1.0)
    assert coarse.settings["cross_scoring"]["early_answer_fractions"] == [0.0, 0.5, 1.0]
    comparison = compare_reports(report, coarse)
    assert "early_answer_aoc" not in comparison.deltas
    assert any("early answering was measured at other fractions" in w for w in comparison.warnings)


def test_the_config_file_sets_the_fractions_and_the_flag_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "collapsecheck.toml").write_text(
        "early_answer_fractions = [0, 0.5, 1]\nearly_post_hoc = 0.9\n"
    )
    base = ["scan", str(DEMOS / "decided-early"), "-p", str(PROMPTS), "-n", "16", "-k", "4",
            "--max-new-tokens", "96", "--device", "cpu"]  # fmt: skip
    for extra, fractions in (
        ([], [0.0, 0.5, 1.0]),
        (["--early-answer-fractions", "0,1"], [0.0, 1.0]),
    ):
        out = tmp_path / f"{len(extra)}.json"
        result = CliRunner().invoke(app, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        report = json.loads(out.read_text())
        assert report["early_answer"]["fractions"] == fractions
        assert report["thresholds"]["early_post_hoc"] == 0.9
    (tmp_path / "collapsecheck.toml").write_text("early_answer_fractions = [0.5, 1]\n")
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 2
    assert "collapsecheck.toml: early_answer_fractions must include 0 and 1" in result.output


def test_long_actions_whose_probability_underflows_still_give_a_curve():
    """exp(E) of a 2,000-nat action is 0 in float64: the curve is computed in log space."""
    rows = np.repeat(np.arange(N), K)
    values = np.tile(
        np.array([-2000.0 - np.log(4), -2000.0, -2000.0, -2000.0, -2000.0]), (len(rows), 1)
    )
    early, metrics = compute_early_answer(EarlyLogProbs(values, FRACTIONS, rows, N), resamples=200)
    assert early.agreement[-1].value == 0.0  # the chance itself underflows, and says so
    assert [r.value for r in early.relative] == pytest.approx([0.25, 1, 1, 1, 1])
    assert metrics["early_answer_decided_at"].value == 0.25
    assert early.regime == "reasoning_decides"
