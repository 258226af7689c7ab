"""SPEC "Scored under the start": each checkpoint's reasoning scored under the policy its run
started from. The values against plain forward passes of the baseline (never the project's
own scorer); the two kinds of template (the start's own filler, amplified by GRPO from it; a
template trained apart that the start never wrote) read as the two cases; a baseline that
cannot be read, or whose tokenizer differs, refused before any sampling."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.measures.metrics import Estimate
from collapsecheck.measures.prior import (
    LEARNED,
    START_MODE,
    START_TYPICAL,
    TYPICALITY,
    PriorLogProbs,
    compute_prior,
    read_prior,
    typicality,
)
from collapsecheck.reports.report import Report
from tests.conftest import COLLAPSED, EXAMPLES, PROMPTS
from tests.tolerances import metric_atol, sequence_atol

START = EXAMPLES / "demo-run" / "global_step_200"  # the grounded policy the GRPO run began at
FILLER = EXAMPLES / "grpo-run" / "checkpoint-200"  # GRPO from START into START's own filler
SCAN = ["-p", PROMPTS, "-n", "16", "-k", "8", "--max-new-tokens", "64", "--fail-on", "none"]
# the baseline's forward passes and the policy's are other batches: float32 sums in another
# order (tests/tolerances.py), over traces of at most 64 tokens
TRACE_ATOL, METRIC_ATOL = sequence_atol(64), metric_atol(64)
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def said(result):
    """The output with rich's line wrapping undone."""
    return " ".join(result.output.split())


@pytest.fixture(scope="module")
def under_start(tmp_path_factory):
    """The GRPO run's last checkpoint scanned with --baseline START, with its dump."""
    root = tmp_path_factory.mktemp("prior")
    result = invoke("scan", FILLER, *SCAN, "--baseline", START, "--dump", root / "dump",
                    "--json", root / "report.json")  # fmt: skip
    assert result.exit_code == 0, result.output
    return result, root


def plain_reasoning_logprob(model, prompt_ids, trace):
    """log p(Z | prompt, pre) by one unpadded forward pass, summed by hand."""
    context = list(prompt_ids) + trace["prefix_ids"]
    ids = torch.tensor([context + trace["reasoning_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    return sum(logprobs[t - 1, ids[0, t]].item() for t in range(len(context), ids.shape[1]))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_row_under_the_start_equals_a_plain_forward_pass(under_start):
    _, root = under_start
    dump = root / "dump"
    prompts = {row["index"]: row["ids"] for row in read_jsonl(dump / "prompts.jsonl")}
    traces = read_jsonl(dump / "traces.jsonl")
    with np.load(dump / "prior_logprobs.npz") as saved:
        prior, rows = saved["prior"], saved["row_trace_index"]
    with np.load(dump / "cross_logprobs.npz") as saved:
        matrix, row_prompt = saved["sum"], saved["row_prompt_index"]
    model = AutoModelForCausalLM.from_pretrained(START, dtype=torch.float32).eval()
    expected = [
        plain_reasoning_logprob(model, prompts[traces[t]["prompt_index"]], traces[t]) for t in rows
    ]
    assert len(prior) == len(matrix) == 128
    assert np.abs(prior - np.array(expected)).max() < TRACE_ATOL
    # the report's means are these rows' (the KL against the policy's own matrix entries)
    report = Report.load(dump / "report.json")
    own = matrix[np.arange(len(matrix)), row_prompt]
    assert report.value("prior_logprob_seq") == pytest.approx(prior.mean())
    assert report.value("prior_kl_seq") == pytest.approx((own - prior).mean())
    tokens = np.array([len(traces[t]["reasoning_ids"]) for t in rows])
    assert report.value("prior_logprob") == pytest.approx((prior / tokens).mean())


def test_the_start_s_own_filler_reads_as_its_mode(under_start, tmp_path):
    result, root = under_start
    report = json.loads((root / "report.json").read_text())
    assert report["verdict"]["regime"] == "low_entropy_collapse"
    assert report["prior"]["regime"] == START_MODE, report["prior"]["reason"]
    assert report["prior"]["baseline"] == str(START)
    # typicality is against the start's own scan of the same prompts and settings
    start = invoke("scan", START, *SCAN, "--json", tmp_path / "start.json")
    assert start.exit_code == 0, start.output
    entropy = json.loads((tmp_path / "start.json").read_text())["metrics"]
    expected = (
        report["metrics"]["prior_logprob_seq"]["value"]
        + entropy["conditional_entropy_seq_est"]["value"]
    )
    assert report["metrics"][TYPICALITY]["value"] == pytest.approx(expected)
    assert report["metrics"][TYPICALITY]["low"] > 0
    assert "where from: start mode" in said(result)
    assert "a stronger KL term will not stop it" in said(result)
    # the dump's report.json holds it too
    saved = json.loads((root / "dump" / "report.json").read_text())
    assert saved["prior"]["regime"] == START_MODE


def test_a_template_trained_apart_reads_as_text_the_start_would_not_write(tmp_path):
    result = invoke("scan", COLLAPSED, *SCAN, "--baseline", START, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"]["regime"] == "template_collapse"
    assert report["prior"]["regime"] == LEARNED, report["prior"]["reason"]
    metrics = report["metrics"]
    assert metrics["prior_kl_seq"]["value"] > 5  # what the KL term already charges
    assert "fix the reward that taught it" in said(result)


def test_a_baseline_with_another_tokenizer_is_one_line_before_sampling(tmp_path):
    other = EXAMPLES / "checkpoints" / "families" / "llama3-style"
    result = invoke("scan", COLLAPSED, *SCAN, "--baseline", other, "--out", tmp_path)
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith(f"error: --baseline {other}: its tokenizer is not that of {COLLAPSED}")
    assert not (tmp_path / "samples").exists()  # nothing was sampled


def test_a_missing_or_unreadable_baseline_is_one_line_before_sampling(tmp_path):
    result = invoke("scan", COLLAPSED, *SCAN, "--baseline", tmp_path / "nowhere")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: --baseline: checkpoint not found: {tmp_path}/nowhere"
    broken = tmp_path / "broken"
    shutil.copytree(START, broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    result = invoke("scan", COLLAPSED, *SCAN, "--baseline", broken, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.output.startswith(
        f"error: --baseline {broken}: model.safetensors is not readable"
    )
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "samples").exists()


def test_another_baseline_is_not_answered_from_the_cache(tmp_path):
    first = invoke("scan", FILLER, *SCAN, "--baseline", START, "--out", tmp_path,
                   "--json", tmp_path / "a.json")  # fmt: skip
    other = EXAMPLES / "demo-run" / "global_step_100"
    second = invoke("scan", FILLER, *SCAN, "--baseline", other, "--out", tmp_path,
                    "--json", tmp_path / "b.json")  # fmt: skip
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert a["prior"]["baseline"] == str(START) and b["prior"]["baseline"] == str(other)
    assert a["metrics"]["prior_logprob_seq"] != b["metrics"]["prior_logprob_seq"]


def test_a_run_reads_each_step_against_its_start(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step in ("checkpoint-20", "checkpoint-200"):
        shutil.copytree(EXAMPLES / "grpo-run" / step, run / step)
    result = invoke("scan", run, *SCAN, "--baseline", START, "--no-train-log",
                    "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md",
                    "--html", tmp_path / "run.html", "--out", tmp_path / "cache")  # fmt: skip
    assert result.exit_code == 0, result.output
    steps = json.loads((tmp_path / "run.json").read_text())["steps"]
    readings = [s["report"]["prior"]["regime"] for s in steps]
    assert readings == ["not_measured", LEARNED, START_MODE]  # the start, then 20 and 200
    table = (tmp_path / "run.md").read_text()
    assert "from the start: typicality, KL nats/trace" in table
    assert "| 0 |" in table and "| start |" in table
    page = (tmp_path / "run.html").read_text()
    assert "From the start along the run" in page and "learned template" in page


def test_compare_reads_b_under_a(tmp_path):
    result = invoke("compare", START, COLLAPSED, *SCAN[:8], "--no-gate",
                    "--json", tmp_path / "c.json", "--out", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    under_a = json.loads((tmp_path / "c.json").read_text())["b_prior"]
    assert under_a["regime"] == LEARNED and under_a["baseline"] == str(START)
    assert f"B under {START}, where from: learned template" in said(result)


def test_watch_scans_the_start_first_and_reads_each_step_under_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(FILLER, run / "checkpoint-200")
    result = invoke("watch", run, *SCAN, "--baseline", START, "--idle", "0.5",
                    "--out", tmp_path / "cache")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"step 0 (the start, {START})" in said(result)
    assert "step 200: low_entropy_collapse" in said(result)
    assert "from the start: start mode" in said(result)


def estimate(value, low, high):
    return Estimate(value, low, high)


def test_the_means_and_intervals_are_over_prompts():
    """Hand-made rows: two prompts, the values each key averages."""
    logprobs = PriorLogProbs(
        prior=np.array([-2.0, -4.0, -10.0, -12.0]), own=np.array([-1.0, -1.0, -2.0, -2.0]),
        tokens=np.array([2, 2, 5, 5]), row_prompt=np.array([0, 0, 1, 1]), num_prompts=2,
    )  # fmt: skip
    metrics = compute_prior(logprobs, resamples=200, seed=0)
    assert metrics["prior_logprob_seq"].value == pytest.approx(-7.0)
    assert metrics["prior_logprob"].value == pytest.approx((-1 - 2 - 2 - 2.4) / 4)
    assert metrics["prior_kl_seq"].value == pytest.approx((1 + 3 + 8 + 10) / 4)
    assert metrics["prior_kl"].value == pytest.approx((0.5 + 1.5 + 1.6 + 2.0) / 4)
    # resampling the two prompts: all of prompt 0 (-3), all of prompt 1 (-11), or both
    low, high = metrics["prior_logprob_seq"].low, metrics["prior_logprob_seq"].high
    assert low == pytest.approx(-11.0) and high == pytest.approx(-3.0)


def test_typicality_adds_the_two_intervals_in_quadrature():
    got = typicality(estimate(-2.0, -3.0, -1.5), estimate(7.0, 6.0, 7.5))
    assert got.value == pytest.approx(5.0)
    assert got.low == pytest.approx(5.0 - math.hypot(1.0, 1.0))
    assert got.high == pytest.approx(5.0 + math.hypot(0.5, 0.5))


@pytest.mark.parametrize(
    "typical, regime",
    [((2.0, 0.5, 3.0), START_MODE), ((-20.0, -22.0, -15.0), LEARNED),
     ((1.0, -0.5, 2.0), START_TYPICAL), ((-5.0, -8.0, -2.0), START_TYPICAL)],
)  # fmt: skip
def test_the_reading_needs_its_whole_interval_on_one_side(typical, regime):
    metrics = {
        TYPICALITY: estimate(*typical), "prior_kl_seq": estimate(1.0, 0.5, 1.5),
        "prior_logprob_seq": estimate(-3.0, -4.0, -2.0),
    }  # fmt: skip
    reading = read_prior(metrics, estimate(7.0, 6.5, 7.5), "start")
    assert reading.regime == regime
    assert reading.baseline == "start"


def test_a_vision_policy_under_a_copy_of_itself_costs_no_kl(tmp_path):
    """Images in the prompts: the baseline reads them at the policy's slots through its own
    image processor. Under an identical copy, every row's reasoning has the policy's own
    log-probability (the matrix's entry under its own prompt)."""
    policy = EXAMPLES / "checkpoints" / "vision" / "grounded"
    shutil.copytree(policy, tmp_path / "start")
    prompts = EXAMPLES / "prompts" / "visual-gridworld.jsonl"
    result = invoke("scan", policy, "-p", prompts, *SCAN[2:], "--baseline", tmp_path / "start",
                    "--dump", tmp_path / "dump")  # fmt: skip
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "dump" / "prior_logprobs.npz") as saved:
        prior = saved["prior"]
    with np.load(tmp_path / "dump" / "cross_logprobs.npz") as saved:
        own = saved["sum"][np.arange(len(prior)), saved["row_prompt_index"]]
    assert np.abs(prior - own).max() < TRACE_ATOL
    report = json.loads((tmp_path / "dump" / "report.json").read_text())
    assert report["prior"]["regime"] == START_TYPICAL  # its own text: typicality about 0
    assert abs(report["metrics"][TYPICALITY]["value"]) < METRIC_ATOL
