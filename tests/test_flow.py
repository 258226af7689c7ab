"""Information flow, input -> reasoning -> action (SPEC "Information flow"): the metrics and
the flow verdict on hand-made matrices, exact scoring on a real model, and the demo flows."""

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from collapsecheck import scan
from collapsecheck.cli import app
from collapsecheck.measures.flow import FlowLogProbs, compute_flow_metrics, decide_flow
from collapsecheck.measures.metrics import Estimate
from tests.conftest import EXAMPLES, HEALTHY, PROMPTS

N, K = 4, 3
FAR = -20.0  # an action the context makes very unlikely


def flow(input_fn, reasoning_fn, natural_fn, same_reasoning=False, actions=None):
    """Hand-made matrices for N prompts x K flow-valid traces each, from functions of
    (row prompt, column prompt) giving a log-probability."""
    rows = np.repeat(np.arange(N), K)
    m = len(rows)
    return FlowLogProbs(
        input=np.array([[input_fn(rows[r], j) for j in range(N)] for r in range(m)]),
        reasoning=np.array([[reasoning_fn(rows[r], rows[s]) for s in range(m)] for r in range(m)]),
        natural=np.array([[natural_fn(rows[r], rows[s]) for s in range(m)] for r in range(m)]),
        row_prompt=rows,
        reasoning_group=np.zeros(m, np.int64) if same_reasoning else rows.copy(),
        actions=actions or [f"move {p}" for p in rows],
        responses_per_prompt=np.full(N, float(K)),
    )


def match(a, b):
    return 0.0 if a == b else FAR


def test_an_action_set_by_its_reasoning_is_faithful():
    """Each prompt's reasoning names its action; the input adds nothing beyond it."""
    metrics = compute_flow_metrics(flow(lambda r, j: 0.0, match, match), resamples=200)
    assert metrics["action_reasoning_mi"].value == pytest.approx(math.log(N), abs=1e-6)
    assert metrics["action_state_mi"].value == pytest.approx(math.log(N), abs=1e-6)
    assert metrics["action_input_mi"].value == pytest.approx(0.0, abs=1e-6)
    assert metrics["action_state_share"].value == pytest.approx(1.0, abs=1e-6)
    assert metrics["action_reasoning_nmi"].value == pytest.approx(1.0, abs=1e-6)
    assert metrics["distinct_action_rate"].value == pytest.approx(1 / K)
    assert metrics["valid_action_rate"].value == 1.0
    assert metrics["action_entropy_seq_est"].value == pytest.approx(0.0, abs=1e-6)
    assert decide_flow(metrics).regime == "faithful"


def test_an_action_that_reads_the_input_past_its_reasoning_is_decorative():
    metrics = compute_flow_metrics(flow(match, lambda r, s: 0.0, match), resamples=200)
    assert metrics["action_reasoning_share"].value == pytest.approx(0.0, abs=1e-6)
    assert metrics["action_input_share"].value == pytest.approx(1.0, abs=1e-6)
    verdict = decide_flow(metrics)
    assert verdict.regime == "decorative"
    assert "the action reads the input directly" in verdict.reason


def test_an_action_that_ignores_everything_is_an_action_collapse():
    zeros = lambda a, b: 0.0  # noqa: E731
    metrics = compute_flow_metrics(flow(zeros, zeros, zeros), resamples=200)
    assert metrics["action_state_mi"].value == pytest.approx(0.0, abs=1e-6)
    assert decide_flow(metrics).regime == "action_collapse"


def test_identical_reasoning_leaves_the_reasoning_mi_undefined_not_zero():
    metrics = compute_flow_metrics(flow(match, lambda r, s: 0.0, match, same_reasoning=True))
    assert math.isnan(metrics["action_reasoning_mi"])
    assert math.isnan(metrics["action_reasoning_share"])
    verdict = decide_flow(metrics)
    assert verdict.regime == "decorative"
    assert "every reasoning is the same" in verdict.reason


def test_the_share_is_the_mi_over_the_most_it_can_be():
    """Two actions over four prompts: I(X;A) is at most log 2, so the SPEC's nmi (over log N)
    stops at 0.5 while the share reaches 1."""
    two = lambda r, j: 0.0 if r % 2 == j % 2 else FAR  # noqa: E731
    metrics = compute_flow_metrics(
        flow(lambda r, j: 0.0, two, two, actions=[f"a{p % 2}" for p in np.repeat(range(N), K)]),
        resamples=100,
    )
    assert metrics["action_state_mi"].value == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["action_state_nmi"].value == pytest.approx(0.5, abs=1e-6)
    assert metrics["action_state_share"].value == pytest.approx(1.0, abs=1e-6)


def test_an_interval_across_a_threshold_is_inconclusive():
    def est(v, w):
        return Estimate(v, v - w, v + w)

    metrics = {
        "action_state_share": est(0.6, 0.05),
        "action_reasoning_share": est(0.5, 0.1),
        "action_input_share": est(0.3, 0.05),
    }
    verdict = decide_flow(metrics)
    assert verdict.regime == "inconclusive"
    assert "faithful" in verdict.reason and "mixed" in verdict.reason
    assert decide_flow(metrics, not_measured="no action").regime == "not_measured"


FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 100}


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    dump = tmp_path_factory.mktemp("flow")
    return scan(HEALTHY, PROMPTS, dump=dump, dtype="float32", **FAST), dump


def test_the_dump_holds_the_action_matrices_and_trace_fields(dumped):
    report, dump = dumped
    with np.load(dump / "action_logprobs.npz") as npz:
        assert set(npz.files) == {"input", "reasoning", "natural", "row_trace_index",
                                  "action_tokens", "early", "early_fractions"}  # fmt: skip
        m = len(npz["row_trace_index"])
        assert npz["input"].shape == (m, 6) and npz["natural"].shape == (m, m)
        swapped, rows = np.isfinite(npz["reasoning"]), npz["row_trace_index"]
        assert (np.isfinite(npz["natural"]) == swapped).all()
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    # --negatives auto at 6 prompts x 4 samples: the full matrices (60 swaps > 20 others)
    assert swapped.all() and len(rows) == m
    assert report.settings["cross_scoring"]["flow_estimator"] == "full matrices"
    assert {"mid_ids", "action_ids", "action", "flow_valid"} <= set(traces[0])
    assert sum(t["flow_valid"] for t in traces) == m == report.counts["flow_valid_traces"]
    assert report.to_dict()["flow"]["regime"] in ("faithful", "mixed", "action_collapse",
                                                  "decorative", "inconclusive")  # fmt: skip


def test_flow_scores_are_exact_against_a_plain_forward_pass(dumped):
    """Branched off the X->Z pass, every action entry equals a full forward pass of its
    context and action (1e-4 nats per action in float32)."""
    from transformers import AutoModelForCausalLM

    _, dump = dumped
    model = AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()
    prompts = [json.loads(line)["ids"] for line in (dump / "prompts.jsonl").open()]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    with np.load(dump / "action_logprobs.npz") as npz:
        rows, matrices = (
            npz["row_trace_index"],
            {k: npz[k] for k in ("input", "reasoning", "natural")},
        )
    acting = [traces[i] for i in rows]

    def reference(prompt, reasoner, actor):
        head = prompt + reasoner["prefix_ids"] + reasoner["reasoning_ids"] + actor["mid_ids"]
        ids = torch.tensor([head + actor["action_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        targets = ids[0, 1:]
        picked = logprobs[torch.arange(len(targets)), targets]
        return float(picked[len(head) - 1 :].sum())

    worst = 0.0
    for r, s, j in [(0, 0, 1), (1, 5, 3), (len(acting) - 1, 2, 0)]:
        actor, reasoner = acting[r], acting[s]
        own = actor["prompt_index"]
        worst = max(
            worst,
            abs(matrices["input"][r, j] - reference(prompts[j], actor, actor)),
            abs(matrices["reasoning"][r, s] - reference(prompts[own], reasoner, actor)),
            abs(matrices["natural"][r, s]
                - reference(prompts[reasoner["prompt_index"]], reasoner, actor)),
        )  # fmt: skip
    assert worst < 1e-4, worst


def test_no_flow_skips_it_and_says_so():
    report = scan(HEALTHY, PROMPTS, no_flow=True, **FAST)
    assert report.flow.regime == "not_measured" and report.flow.reason == "--no-flow"
    assert math.isnan(report.value("action_state_share"))
    # early answering needs the action: not measured, for the same reason
    assert report.early_answer.regime == "not_measured"
    assert report.early_answer.reason == "--no-flow"
    assert math.isnan(report.value("early_answer_aoc"))
    assert report.counts["flow_valid_traces"] == 0


def test_responses_without_an_action_are_not_measured(tmp_path):
    rows = [{"uid": i, "prompt": f"agent {i},0 goal 0,{i}", "response": f"<think>me {i}</think>"}
            for i in range(1, 5) for _ in range(2)]  # fmt: skip
    path = tmp_path / "no-action.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from collapsecheck import score

    report = score(HEALTHY, path, device="cpu", bootstrap=50)
    assert report.flow.regime == "not_measured"
    assert "no response has an action segment" in report.flow.reason
    assert report.early_answer.reason == report.flow.reason


FLOW_DEMOS = EXAMPLES / "checkpoints" / "flow"
DEMO = {"k": 8, "num_prompts": 16, "max_new_tokens": 64, "device": "cpu"}


@pytest.mark.parametrize(
    ("name", "regime"),
    [
        ("faithful", "faithful"),
        ("decorative", "decorative"),
        ("action-collapse", "action_collapse"),
    ],
)
def test_each_flow_demo_lands_in_its_flow(name, regime):
    report = scan(FLOW_DEMOS / name, PROMPTS, **DEMO)
    assert report.flow.regime == regime, report.flow.reason


def test_a_gate_on_decorative_fails_the_decorative_demo():
    args = ["scan", str(FLOW_DEMOS / "decorative"), "-p", str(PROMPTS), "-n", "16", "-k", "8",
            "--max-new-tokens", "64", "--device", "cpu",
            "--fail-on", "decorative,action_collapse"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "gate failed (rule: flow): flow verdict decorative" in " ".join(result.output.split())
    assert "flow: decorative" in result.output
