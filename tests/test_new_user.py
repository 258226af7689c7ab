"""What a new user meets first: the README's Python examples run as written, outputs checked
before any work, exit 1 only for a failed gate rule, readable numbers and messages."""

import json
import os
import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.formatting import format_number
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS, ROOT

FAST = ["-p", str(PROMPTS), "-n", "6", "-k", "4", "--max-new-tokens", "48", "--device", "cpu",
        "--bootstrap", "200"]  # fmt: skip
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks():
    """(page, block) for every Python example of the README and the docs pages."""
    found = []
    for page in MANUAL:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)
        # the registry snippet shows a line to add, with a backend that does not exist
        found += [(page.name, b) for b in blocks if "BackendEntry(" not in b]
    return found


def test_the_manuals_python_examples_run_as_written(tmp_path, monkeypatch):
    blocks = python_blocks()
    assert {page for page, _ in blocks} >= {"README.md", "python.md"}
    (tmp_path / "examples").symlink_to(EXAMPLES)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for page, block in blocks:
        exec(compile(block, page, "exec"), namespace)
    assert namespace["report"].verdict.regime == "grounded"
    assert namespace["run"].steps[-1].report.verdict.regime == "template_collapse"
    assert (tmp_path / "out").is_dir()  # the run's cache, where the example said
    assert namespace["metrics"]["retrieval_accuracy"].value == 1.0


@pytest.mark.parametrize(
    ("option", "path", "message"),
    [
        ("--json", "/proc/nope/r.json", "--json /proc/nope/r.json: cannot write there"),
        ("--markdown", "/proc/nope/s.md", "--markdown /proc/nope/s.md: cannot write there"),
        ("--junit", "/proc/nope/j.xml", "--junit /proc/nope/j.xml: cannot write there"),
        ("--dump", "README.md", "--dump README.md: is a file, not a directory"),
        ("--json", "examples", "--json examples: is a directory, not a file"),
    ],
)
def test_an_unwritable_output_is_refused_before_the_model_loads(option, path, message):
    # a checkpoint path that would fail at load: the output error must come first
    result = runner.invoke(app, ["scan", str(HEALTHY), *FAST, option, path], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "sampling" not in result.output  # no work was done


def test_plot_of_an_unwritable_path_is_refused_before_the_run(tmp_path):
    result = invoke("scan", EXAMPLES / "demo-run", *FAST, "--plot", "/proc/nope/run.png")
    assert result.exit_code == 2
    assert "--plot /proc/nope/run.png: cannot write there" in result.output
    assert "sampling" not in result.output


def test_an_internal_error_is_never_exit_1(tmp_path, monkeypatch):
    import sys

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(sys.modules["collapsecheck.runs.diagnose"], "diagnose", broken)
    result = invoke("scan", HEALTHY, *FAST)
    assert result.exit_code == 3
    assert "internal error: a bug (RuntimeError)" in result.output
    assert "--debug" in result.output


def test_numbers_a_person_can_read():
    assert format_number(5.7e37) == "5.7e+37"
    assert format_number(1_234_567) == "1.23e+06"
    assert format_number(12_345) == "12,345"
    assert format_number(0.12345) == "0.123"
    assert format_number(float("nan")) == "-"


def test_the_collapse_verdict_speaks_per_token_and_says_what_next():
    result = invoke("scan", COLLAPSED, *FAST, "-k", "1", "--fail-on", "none")
    assert result.exit_code == 0, result.output
    assert "nats/token" in result.output
    assert "6 prompts x 1 sample," in result.output
    words = " ".join(result.output.split())
    assert "next:" in words and "When the verdict is a collapse" in words
    assert "docs/measures.md" in words
    assert "## When the verdict is a collapse" in (ROOT / "docs" / "measures.md").read_text()
    assert not re.search(r"\d{1,3}(,\d{3}){2,}", result.output)  # no number past a million


def test_sampling_other_than_the_policy_is_said_and_scored_as_sampled(tmp_path):
    dump = tmp_path / "dump"
    result = invoke("scan", HEALTHY, *FAST, "--temperature", "0.7", "--dump", dump)
    assert result.exit_code == 0, result.output
    assert "warning: sampled at temperature 0.7 and scored there" in " ".join(result.output.split())
    report = json.loads((dump / "report.json").read_text())
    assert report["warnings"] and "temperature 0.7" in report["warnings"][0]
    assert report["settings"]["scoring_temperature"] == 0.7
    # the matrix is the tempered policy's: one entry against a plain forward pass at 0.7
    model = AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()
    matrix = np.load(dump / "cross_logprobs.npz")
    prompts = [json.loads(line) for line in (dump / "prompts.jsonl").read_text().splitlines()]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").read_text().splitlines()]
    trace = traces[int(matrix["row_trace_index"][0])]
    context = prompts[1]["ids"] + trace["prefix_ids"]
    ids = torch.tensor([context + trace["reasoning_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double() / 0.7, dim=-1)
    expected = sum(logprobs[t - 1, ids[0, t]].item() for t in range(len(context), ids.shape[1]))
    assert matrix["sum"][0, 1] == pytest.approx(expected, abs=1e-4)
    plain = invoke("scan", HEALTHY, *FAST, "--json", tmp_path / "plain.json")
    assert json.loads((tmp_path / "plain.json").read_text())["warnings"] == []
    assert "warning" not in plain.output


def test_plain_text_prompts_hint_at_the_chat_template_and_work_with_it():
    prompts = EXAMPLES / "prompts" / "gridworld.txt"
    args = ["scan", HEALTHY, "-p", prompts, "-n", "6", "-k", "2", "--device", "cpu"]
    bare = invoke(*args)
    assert bare.exit_code == 2
    assert "pass --as-chat (and --system-prompt TEXT" in " ".join(bare.output.split())
    chat = invoke(*args, "--as-chat", "--system-prompt", "grid agent.")
    assert chat.exit_code == 0, chat.output
    assert "verdict: grounded" in chat.output


def test_version_short_help_and_the_shipped_spec():
    assert invoke("--version").output.startswith("collapsecheck ")
    assert "Usage" in invoke("scan", "-h").output
    spec = invoke("spec")
    assert spec.exit_code == 0
    assert "## The verdict" in spec.output and "conditional_entropy_est" in spec.output


def test_reports_respect_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        import importlib

        import collapsecheck.files

        importlib.reload(collapsecheck.files)
        collapsecheck.files.write_text_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(previous)
        importlib.reload(collapsecheck.files)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_compare_refuses_reports_of_other_settings_unless_allowed(tmp_path):
    for name, seed in (("a", "0"), ("b", "1")):
        result = invoke("scan", HEALTHY, *FAST, "--seed", seed, "--dump", tmp_path / name)
        assert result.exit_code == 0, result.output
    refused = invoke("compare", tmp_path / "a", tmp_path / "b")
    assert refused.exit_code == 2
    assert "not comparable (seed: A 0, B 1)" in refused.output
    allowed = invoke("compare", tmp_path / "a", tmp_path / "b", "--allow-mismatch")
    assert allowed.exit_code in (0, 1), allowed.output
    assert "warning: not comparable, compared anyway: seed" in " ".join(allowed.output.split())
    assert "retrieval_accuracy" in allowed.output  # metric names are not cut


def test_compare_refuses_reports_scored_at_other_temperatures(tmp_path):
    """Traces sampled at 0.7 are scored at 0.7: their numbers are not those of a scan at 1. A
    report written before the scoring temperature was recorded scored at 1."""
    for name, temperature in (("a", "1"), ("b", "0.7")):
        scanned = invoke("scan", HEALTHY, *FAST, "--temperature", temperature,
                         "--dump", tmp_path / name)  # fmt: skip
        assert scanned.exit_code == 0, scanned.output
    refused = invoke("compare", tmp_path / "a", tmp_path / "b")
    assert refused.exit_code == 2
    assert "not comparable (scoring temperature: A 1.0, B 0.7)" in refused.output
    older = tmp_path / "a" / "report.json"
    report = json.loads(older.read_text())
    assert report["settings"].pop("scoring_temperature") == 1.0
    older.write_text(json.dumps(report))
    assert "scoring temperature" not in invoke("compare", tmp_path / "a", tmp_path / "a").output
    refused = invoke("compare", tmp_path / "a", tmp_path / "b")
    assert "not comparable (scoring temperature: A 1.0, B 0.7)" in refused.output


@pytest.mark.parametrize(
    "checkpoint, prompts",
    [
        (HEALTHY, PROMPTS),
        (EXAMPLES / "checkpoints" / "vision" / "grounded",
         EXAMPLES / "prompts" / "visual-gridworld.jsonl"),
    ],
    ids=["text", "vision"],
)  # fmt: skip
def test_a_scan_prints_no_warning_of_its_own_making(checkpoint, prompts, tmp_path):
    """As a user runs it, in its own process with Python's default warning filters: the
    sampler and scorer use the library's current interface (no FutureWarning about
    `past_key_values`), on the transformers installed."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "collapsecheck", "scan", str(checkpoint), "-p", str(prompts),
               "-n", "4", "-k", "2", "--max-new-tokens", "24", "--device", "cpu",
               "--bootstrap", "50", "--fail-on", "none", "--no-flow"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "default"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "verdict:" in output
    assert "Warning" not in output and "deprecated" not in output, output


def test_effective_traces_read_as_a_count_or_as_more_than_a_person_reads(tmp_path):
    """SPEC "Metrics": exp of a real model's sequence entropy (a 135M instruct model's 128-token
    answers: about 233 nats, 2.46e+101 traces) is shown as `> 10,000` on the console and in
    the Markdown summary; a collapsed policy's few traces as a count. report.json keeps the
    value."""
    import math

    from rich.console import Console

    from collapsecheck.measures.metrics import Estimate
    from collapsecheck.reports.console import print_report
    from collapsecheck.reports.gate import markdown_report
    from collapsecheck.reports.report import Report

    result = invoke("scan", HEALTHY, *FAST, "--json", tmp_path / "r.json", "--fail-on", "none")
    assert result.exit_code == 0, result.output
    report = Report.load(tmp_path / "r.json")
    for entropy, shown in [((233.4, 202.5, 268.8), "> 10,000"), ((1.2, 0.9, 1.5), "3.3")]:
        report.metrics["effective_traces_per_prompt"] = Estimate(*map(math.exp, entropy))
        console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        print_report(console, report)
        text = console.export_text() + markdown_report("scan", report, [])
        lines = [x for x in text.splitlines() if "effective_traces_per_prompt" in x]
        assert len(lines) == 2 and all(shown in x for x in lines), lines
        assert "e+" not in text and not re.search(r"\d{1,3}(,\d{3}){2,}", text)
    saved = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert saved["effective_traces_per_prompt"]["value"] > 0  # the value itself, in the JSON
