"""The CI gate and compare, through the command line: config files, JUnit, Markdown, exits."""

import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from collapsecheck.cli import app
from tests.conftest import HEALTHY, PROMPTS, RUN

FAST = ["-p", str(PROMPTS), "-n", "8", "-k", "4", "--max-new-tokens", "64", "--device", "cpu",
        "--bootstrap", "300"]  # fmt: skip
PARTIAL = RUN / "global_step_300"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


RUN_ARGS = ["-p", str(PROMPTS), "-n", "16", "-k", "8", "--max-new-tokens", "64", "--device",
            "cpu", "--bootstrap", "300"]  # fmt: skip


def test_run_scan_writes_run_json_and_answers_from_cache(tmp_path):
    """16 prompts x 8 samples: enough to see the 15% templates of step 200 beyond noise."""
    out = tmp_path / "results"
    args = ["scan", RUN, *RUN_ARGS, "--out", out, "--json", tmp_path / "run.json",
            "--fail-on", "none"]  # fmt: skip
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "onset: step 200" in first.output
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["onset_step"] == 200
    assert [s["step"] for s in run["steps"]] == [100, 200, 300, 400, 500]
    regimes = [s["report"]["verdict"]["regime"] for s in run["steps"]]
    assert regimes[0] == "grounded" and regimes[-1] == "template_collapse", regimes
    again = invoke(*args)
    assert again.exit_code == 0
    assert "5 of 5 checkpoints answered from the cache" in again.output


def test_gate_on_a_run_uses_its_latest_checkpoint(tmp_path):
    result = invoke("scan", RUN, *FAST, "--out", tmp_path, "--junit", tmp_path / "gate.xml")
    assert result.exit_code == 1
    assert "gate failed (rule: regime): verdict template_collapse is in --fail-on" in result.output
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    # the regime, the flow, early answering
    assert (suite.get("tests"), suite.get("failures")) == ("3", "1")
    assert suite.find("testcase").find("failure") is not None


def test_minimum_rules_and_junit(tmp_path):
    result = invoke(
        "scan", HEALTHY, *FAST, "--min-normalized-mi", "0.5", "--min-retrieval-skill", "1.01",
        "--junit", tmp_path / "gate.xml", "--markdown", tmp_path / "summary.md",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "gate failed (rule: min retrieval_skill)" in result.output
    assert "min normalized_mi" not in result.output.split("gate failed", 1)[1]
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    cases = {c.get("name"): c.find("failure") is None for c in suite.iter("testcase")}
    assert cases == {
        "regime": True, "flow": True, "early answer": True, "min normalized_mi": True,
        "min retrieval_skill": False,
    }  # fmt: skip
    summary = (tmp_path / "summary.md").read_text()
    assert "### Gate: failed" in summary and "| min retrieval_skill | **FAIL** |" in summary


def test_config_file_thresholds_apply(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "collapsecheck.toml").write_text('fail_on = ["grounded"]\n')
    assert invoke("scan", HEALTHY, *FAST).exit_code == 1
    # the command line wins over the file
    assert invoke("scan", HEALTHY, *FAST, "--fail-on", "none").exit_code == 0
    (tmp_path / "collapsecheck.toml").unlink()
    (tmp_path / "pyproject.toml").write_text(
        "[tool.collapsecheck]\ndependence_high = 0.999\n[tool.collapsecheck.min]\n"
        "distinct_reasoning_rate = 0.99\n"
    )
    result = invoke("scan", HEALTHY, *FAST, "--fail-on", "inconclusive,template_collapse")
    assert result.exit_code == 1
    assert "gate failed (rule: min distinct_reasoning_rate)" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('fail_on = ["grounded"]\nsurprise = 1\n', "unknown setting surprise"),
        ('entropy_low = "high"\n', "entropy_low: expected a number"),
        ('fail_on = ["collapsed"]\n', "fail_on: unknown regime collapsed"),
        ("dependence_high = 0.2\n", "dependence_collapsed <= dependence_high"),
        ("not toml [", "invalid TOML"),
    ],
)
def test_bad_config_is_exit_two(tmp_path, text, message):
    config = tmp_path / "gate.toml"
    config.write_text(text)
    result = invoke("scan", HEALTHY, *FAST, "--config", config)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_compare_flags_degradation_not_the_same_checkpoint(tmp_path):
    worse = invoke("compare", HEALTHY, PARTIAL, *FAST, "--out", tmp_path,
                   "--json", tmp_path / "cmp.json")  # fmt: skip
    assert worse.exit_code == 1, worse.output
    assert "B lost input dependence relative to A beyond noise" in worse.output
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert data["paired"] is True and data["lost_input_dependence"] is True
    delta = data["metrics"]["normalized_mi"]["delta"]
    assert delta["high"] < 0 and delta["low"] <= delta["value"] <= delta["high"]

    same = invoke("compare", HEALTHY, HEALTHY, *FAST, "--out", tmp_path)
    assert same.exit_code == 0, same.output
    assert "did not lose input dependence" in same.output
    assert invoke("compare", HEALTHY, PARTIAL, *FAST, "--out", tmp_path, "--no-gate").exit_code == 0


def test_compare_accepts_saved_reports(tmp_path):
    for name, checkpoint in (("a", HEALTHY), ("b", PARTIAL)):
        assert invoke("scan", checkpoint, *FAST, "--dump", tmp_path / name,
                      "--fail-on", "none").exit_code == 0  # fmt: skip
    paired = invoke("compare", tmp_path / "a" / "report.json", tmp_path / "b")
    assert paired.exit_code == 1
    assert "paired bootstrap" in paired.output
    lone = tmp_path / "lone.json"
    lone.write_text((tmp_path / "b" / "report.json").read_text())
    unpaired = invoke("compare", tmp_path / "a" / "report.json", lone)
    assert "unpaired approximation" in unpaired.output
    assert unpaired.exit_code == 1
