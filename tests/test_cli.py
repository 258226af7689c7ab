"""The command line: exit codes, --json, --dump, and one clear line for each bad input."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.measures.early_answer import EARLY_KEYS, compute_early_answer
from collapsecheck.measures.flow import FLOW_KEYS, compute_flow_metrics
from collapsecheck.measures.metrics import compute_metrics
from collapsecheck.measures.token_information import WHERE_KEYS, compute_where, row_summaries
from collapsecheck.reports.dump import read_dump, read_early, read_flow, read_token_information
from collapsecheck.reports.report import Report, metric_to_json
from tests.conftest import COLLAPSED, HEALTHY, PROMPTS

FAST = ["-p", str(PROMPTS), "-n", "6", "-k", "4", "--max-new-tokens", "64", "--device", "cpu"]
runner = CliRunner()


def run(*args):
    return runner.invoke(app, ["scan", *map(str, args)])


def test_healthy_checkpoint_exits_zero_and_writes_json(tmp_path):
    result = run(HEALTHY, *FAST, "--json", tmp_path / "report.json")
    assert result.exit_code == 0, result.output
    assert "verdict: grounded" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"]["regime"] == "grounded"
    assert set(report["verdict"]) == {"regime", "style", "partial", "reason", "kind_uncertain"}
    assert set(report["metrics"]["normalized_mi"]) == {"value", "low", "high"}
    assert report["settings"]["samples_per_prompt"] == 4
    assert len(report["settings"]["prompts_sha256"]) == 64


def test_collapse_fails_the_gate_unless_told_not_to():
    failing = run(COLLAPSED, *FAST)
    assert failing.exit_code == 1, failing.output
    assert "template_collapse" in failing.output
    # the template is shown: reasoning of two different prompts
    assert failing.output.count("prompt ") >= 2
    assert run(COLLAPSED, *FAST, "--fail-on", "none").exit_code == 0
    assert run(HEALTHY, *FAST, "--fail-on", "grounded").exit_code == 1


def test_dump_round_trip_reproduces_the_report(tmp_path):
    dump = tmp_path / "dump"
    assert run(HEALTHY, *FAST, "--dump", dump, "--bootstrap", "200").exit_code == 0
    assert sorted(p.name for p in dump.iterdir()) == [
        "action_logprobs.npz",
        "cross_logprobs.npz",
        "per_prompt.jsonl",
        "prompts.jsonl",
        "report.json",
        "token_information.npz",
        "traces.jsonl",
    ]
    report = Report.load(dump / "report.json")
    matrix, counts = read_dump(dump)
    again = compute_metrics(matrix, counts, resamples=200, seed=0)
    assert {k: metric_to_json(v) for k, v in again.items()} == {
        k: metric_to_json(v)
        for k, v in report.metrics.items()
        if k not in FLOW_KEYS and k not in EARLY_KEYS and k not in WHERE_KEYS
    }
    flow = compute_flow_metrics(read_flow(dump), resamples=200, seed=0)
    assert {k: metric_to_json(v) for k, v in flow.items()} == {
        k: metric_to_json(v) for k, v in report.metrics.items() if k in flow
    }
    early, early_metrics = compute_early_answer(
        read_early(dump, read_flow(dump)), resamples=200, seed=0
    )
    assert early == report.early_answer
    assert {k: metric_to_json(v) for k, v in early_metrics.items()} == {
        k: metric_to_json(report.metrics[k]) for k in EARLY_KEYS
    }
    tokens, _ = read_token_information(dump)
    where, where_metrics = compute_where(
        row_summaries(tokens, matrix.row_prompt, matrix.num_prompts), resamples=200, seed=0
    )
    assert where == report.token_information
    assert {k: metric_to_json(v) for k, v in where_metrics.items()} == {
        k: metric_to_json(report.metrics[k]) for k in WHERE_KEYS
    }
    traces = [json.loads(line) for line in (dump / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 24
    with np.load(dump / "cross_logprobs.npz") as npz:
        assert npz["sum"].shape == (sum(t["valid"] for t in traces), 6)
        for row, trace_index in enumerate(npz["row_trace_index"]):
            assert len(traces[trace_index]["reasoning_ids"]) == npz["reasoning_tokens"][row]


def test_same_command_twice_gives_the_same_report(tmp_path):
    for name in ("a.json", "b.json"):
        assert run(HEALTHY, *FAST, "--json", tmp_path / name).exit_code == 0
    first, second = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    first.pop("timing"), second.pop("timing")  # wall-clock facts live only here
    assert json.dumps(first, indent=2) == json.dumps(second, indent=2)  # byte for byte


@pytest.fixture
def bad_inputs(tmp_path):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(HEALTHY / "config.json", no_weights)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(HEALTHY, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    one = tmp_path / "one.txt"
    one.write_text("agent 1,1 goal 2,2\n")
    return {
        "missing": (tmp_path / "nope", PROMPTS, [], "checkpoint not found"),
        "no weights": (no_weights, PROMPTS, [], "no checkpoint here (found: config.json;"),
        "corrupt": (corrupt, PROMPTS, [], "model.safetensors: could not load the model weights"),
        "malformed": (HEALTHY, malformed, [], "malformed.jsonl:2: malformed JSON"),
        "empty": (HEALTHY, empty, [], "no prompts found"),
        "one prompt": (HEALTHY, one, [], "needs at least 2 prompts"),
        "k=0": (HEALTHY, PROMPTS, ["-k", "0"], "-k/--samples must be at least 1"),
        "no tag": (
            HEALTHY,
            PROMPTS,
            ["--reasoning-tags", "<plan>,</plan>"],
            "has a reasoning segment between '<plan>' and '</plan>', so the scan stopped",
        ),
        "fail-on": (HEALTHY, PROMPTS, ["--fail-on", "nonsense"], "--fail-on: unknown regime"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "no weights",
        "corrupt",
        "malformed",
        "empty",
        "one prompt",
        "k=0",
        "no tag",
        "fail-on",
    ],
)
def test_bad_input_is_one_clear_line_and_exit_two(bad_inputs, case):
    checkpoint, prompts, extra, message = bad_inputs[case]
    args = ["-n", "4", "-k", "2", "--max-new-tokens", "32", "--device", "cpu", *extra]
    result = runner.invoke(app, ["scan", str(checkpoint), "-p", str(prompts), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1


def test_installed_command_reports_errors_without_traceback(tmp_path):
    command = [
        sys.executable,
        "-m",
        "collapsecheck",
        "scan",
        str(tmp_path / "nope"),
        "-p",
        str(PROMPTS),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: checkpoint not found: {tmp_path / 'nope'}"
    ]
    assert result.stdout == ""


def test_negatives_score_own_plus_sampled_prompts_and_round_trip(tmp_path):
    full, sampled = tmp_path / "full", tmp_path / "sampled"
    assert run(HEALTHY, *FAST, "--dump", full, "--fail-on", "none").exit_code == 0
    result = run(HEALTHY, *FAST, "--negatives", "2", "--dump", sampled, "--fail-on", "none")
    assert result.exit_code == 0, result.output
    report = json.loads((sampled / "report.json").read_text())
    assert report["settings"]["cross_scoring"]["negatives"] == 2
    assert report["metrics"]["retrieval_chance_level"] == pytest.approx(1 / 3)
    with np.load(full / "cross_logprobs.npz") as f, np.load(sampled / "cross_logprobs.npz") as s:
        scored = s["scored"]
        assert (scored.sum(axis=1) == 3).all()
        # the sampled entries are the full matrix's entries, computed the same way
        assert np.allclose(s["sum"][scored], f["sum"][scored], atol=1e-4)
        assert np.isnan(s["sum"][~scored]).all()
    matrix, counts = read_dump(sampled)
    again = compute_metrics(matrix, counts, resamples=1000, seed=0)
    assert metric_to_json(again["normalized_mi"]) == report["metrics"]["normalized_mi"]
