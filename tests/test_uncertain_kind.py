"""A collapse whose kind is uncertain is still a collapse: the default gate fails it on every
route (scan, a run, watch, the TRL callback). The checkpoint is the GRPO demo run's step 40:
its input dependence is gone beyond doubt, its reasoning entropy (at seed 6) straddles the 0.05
line between template and low-entropy collapse (SPEC "The verdict")."""

import json
import logging
import shutil

from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.config import GateSettings
from collapsecheck.integrations.trl import CollapseCallback
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.runs.watch import SampledFrom, Watch
from collapsecheck.settings import Settings, WatchSettings
from tests.conftest import EXAMPLES, PROMPTS
from tests.test_trl_callback import grpo_trainer
from tests.test_watch import mark_saved

STEP_40 = EXAMPLES / "grpo-run" / "checkpoint-40"
# 4 prompts x 4 traces drawn at seed 6: the entropy's interval straddles 0.05 (at seeds 0, 1
# and 3 it lies wholly below it, and the kind is certain: low-entropy collapse)
PROBE = {"k": 4, "num_prompts": 4, "max_new_tokens": 32, "bootstrap": 200, "device": "cpu",
         "seed": 6}  # fmt: skip
FLAGS = ["-p", str(PROMPTS), "-n", "4", "-k", "4", "--max-new-tokens", "32", "--bootstrap",
         "200", "--device", "cpu", "--seed", "6"]  # fmt: skip
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def uncertain_collapse(verdict: dict) -> bool:
    entropy_open = "straddles 0.05, so it is a collapse of either kind" in verdict["reason"]
    collapse = verdict["regime"] in ("template_collapse", "low_entropy_collapse")
    return collapse and verdict["kind_uncertain"] and entropy_open


def test_scan_fails_the_default_gate_and_report_json_keeps_both(tmp_path):
    result = invoke("scan", STEP_40, *FLAGS, "--dump", tmp_path / "dump")
    assert result.exit_code == 1, result.output
    assert "(kind uncertain)" in result.output
    assert "gate failed (rule: regime)" in result.output
    report = json.loads((tmp_path / "dump" / "report.json").read_text())
    assert uncertain_collapse(report["verdict"]), report["verdict"]
    assert report["verdict"]["regime"] == (
        "low_entropy_collapse"
        if report["metrics"]["conditional_entropy_est"]["value"] < 0.05
        else "template_collapse"
    )


def test_a_run_fails_the_default_gate_and_its_onset_counts_it(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(STEP_40, run / "checkpoint-40")
    result = invoke("scan", run, *FLAGS, "--out", tmp_path / "cache", "--json", tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["onset_step"] == 40
    assert uncertain_collapse(report["steps"][-1]["report"]["verdict"])


def test_the_watch_fails_the_default_gate(tmp_path):
    run, lines = tmp_path / "run", []
    shutil.copytree(STEP_40, run / "checkpoint-40")
    mark_saved(run / "checkpoint-40", 40)
    follow = WatchSettings(idle=3.0, poll=0.2, settle=0.5, stop_on_fail=True)
    watch = Watch(run, SampledFrom(PROMPTS), Settings.build(**PROBE), follow,
                  GateSettings().load(), VerdictThresholds(), tmp_path / "cache",
                  lines.append)  # fmt: skip
    assert watch.follow() == 1
    said = "\n".join(lines)
    assert "(kind uncertain)" in said and "gate failed at step 40 (rule: regime)" in said


def test_the_trl_callbacks_gate_stops_training(tmp_path, caplog):
    trainer = grpo_trainer(STEP_40, tmp_path, steps=3)
    callback = CollapseCallback(
        trainer, PROMPTS, every=1, fail_on="template_collapse,low_entropy_collapse", **PROBE
    )
    trainer.add_callback(callback)
    with caplog.at_level(logging.WARNING, logger="collapsecheck"):
        trainer.train()
    assert trainer.state.global_step == 1
    assert uncertain_collapse(callback.reports[1].verdict.to_dict())
    logged = [e for e in trainer.state.log_history if "collapse/kind_uncertain" in e]
    assert logged[0]["collapse/kind_uncertain"] == 1.0 and logged[0]["collapse/collapsed"] == 1.0
    assert "collapsecheck stops training at step 1: rule regime" in caplog.text
