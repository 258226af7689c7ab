"""CollapseCallback inside a real TRL GRPOTrainer run on CPU: from the step's own completions
or a probe set, RAGEN-2's keys reach the trainer's log_history at the steps they measure, each
report is written under output_dir, and a gate on a collapsed policy stops training with the
reason in the log."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from collapsecheck.errors import CollapsecheckError
from collapsecheck.integrations.trl import CollapseCallback
from tests.conftest import EXAMPLES, PROMPTS, ROOT

PROBE = {"k": 4, "num_prompts": 4, "max_new_tokens": 32, "bootstrap": 100}


def answered(completions, **_):
    """A reward that varies: 1 when the completion gives an answer."""
    return [float("<answer>" in c[0]["content"]) for c in completions]


def grpo_trainer(policy, out, steps, batch=8, use_cpu=True):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=1e-4,
        per_device_train_batch_size=batch, num_generations=4, max_completion_length=32,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=use_cpu, seed=0,
        bf16=not use_cpu,  # float32 on a CPU (docs/development.md, "Comparing floats")
    )  # fmt: skip
    return GRPOTrainer(
        model=LlamaForCausalLM.from_pretrained(policy, dtype=torch.float32),
        reward_funcs=[answered],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": row["messages"]} for row in rows]),
        processing_class=AutoTokenizer.from_pretrained(policy),
    )


def test_the_keys_land_in_log_history_and_the_reports_under_output_dir(tmp_path):
    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_100", tmp_path, steps=4)
    callback = CollapseCallback(trainer, PROMPTS, every=2, **PROBE)
    trainer.add_callback(callback)
    trainer.train()
    logged = [e for e in trainer.state.log_history if "collapse/mi_estimate" in e]
    assert [e["step"] for e in logged] == [2, 4]
    for entry in logged:
        report = callback.reports[entry["step"]]
        assert entry["collapse/normalized_mi"] == pytest.approx(report.value("normalized_mi"))
        assert entry["collapse/collapsed"] == 0.0 and entry["collapse/gate_failed"] == 0.0
        # SPEC "Where the input shows": the live policy's per-token values, logged too
        tenths = [report.token_information.by_position[d].value for d in range(10)]
        logged_tenths = [entry[f"collapse/information_by_position/{d}"] for d in range(10)]
        assert logged_tenths == pytest.approx(tenths)
        assert entry["collapse/input_named_rate"] == pytest.approx(report.value("input_named_rate"))
        saved = tmp_path / "collapsecheck" / f"step-{entry['step']}" / "report.json"
        assert json.loads(saved.read_text())["verdict"]["regime"] == report.verdict.regime
    assert callback.reports[4].verdict.regime == "grounded"
    # TRL's own metrics still log at every step: the callback did not flush them
    assert all("reward" in e for e in trainer.state.log_history if "loss" in e)
    assert trainer.state.global_step == 4


def test_the_steps_own_completions_are_scored_with_trls_reward_weights(tmp_path):
    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_100", tmp_path, 2, batch=16)
    callback = CollapseCallback(trainer, every=2, bootstrap=100)
    trainer.add_callback(callback)
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "collapse/mi_estimate" in e]
    assert entry["step"] == 2
    report = callback.reports[2]
    # the generation batch TRL keeps: 16 completions, 4 prompts x 4, with their rewards
    assert report.counts["prompts"] == 4 and report.counts["responses"] == 16
    scored = tmp_path / "collapsecheck" / "step-2" / "completions.jsonl"
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert [r["reward"] for r in rows] == [r["answered"] for r in rows]  # one function, weight 1
    assert report.snr["rewards"] == "rollouts, per response"
    assert entry["collapse/retrieval_accuracy"] == pytest.approx(report.value("retrieval_accuracy"))


def test_a_gate_on_a_collapsed_policy_stops_training(tmp_path, caplog):
    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_500", tmp_path, steps=6)
    trainer.add_callback(
        CollapseCallback(trainer, PROMPTS, every=1, fail_on="template_collapse", **PROBE)
    )
    with caplog.at_level(logging.WARNING, logger="collapsecheck"):
        trainer.train()
    assert trainer.state.global_step == 1
    stopped = [e for e in trainer.state.log_history if e.get("collapse/gate_failed") == 1.0]
    assert [e["step"] for e in stopped] == [1]
    assert "collapsecheck stops training at step 1: rule regime: verdict template_collapse" in (
        caplog.text
    )


def test_a_bad_probe_file_or_gate_fails_before_training(tmp_path):
    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_100", tmp_path, steps=1)
    with pytest.raises(CollapsecheckError, match="not found"):
        CollapseCallback(trainer, tmp_path / "missing.jsonl", **PROBE)
    with pytest.raises(CollapsecheckError, match="keeps no completions a callback can read"):
        CollapseCallback(object())
    with pytest.raises(CollapsecheckError, match="unknown regime"):
        CollapseCallback(trainer, PROMPTS, fail_on="collapsed", **PROBE)


def test_under_two_processes_rank_zero_diagnoses_and_every_rank_logs_and_stops(tmp_path):
    """torchrun with 2 processes (DDP over gloo on CPU): rank 0 runs the diagnosis, the other
    waits for its numbers; both log the same keys and stop at the same step."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "-m", "tests.trl_ranks_worker", str(tmp_path), "global_step_500",
               "template_collapse"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["step"] for r in ranks] == [2, 2]  # stopped by the gate at the first diagnosis
    assert ranks[0]["logged"] == ranks[1]["logged"]
    assert ranks[0]["logged"][0]["collapse/gate_failed"] == 1.0
    assert done.stderr.count("collapsecheck stops training at step 2") == 1  # rank 0 says so


def test_a_step_that_cannot_be_diagnosed_is_a_warning_and_training_goes_on(tmp_path, caplog):
    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_100", tmp_path, steps=2)
    trainer.add_callback(CollapseCallback(trainer, every=1, reasoning_tags="<plan>,</plan>"))
    with caplog.at_level(logging.WARNING, logger="collapsecheck"):
        trainer.train()
    assert trainer.state.global_step == 2
    failed = [e["step"] for e in trainer.state.log_history if "collapse/diagnosis_failed" in e]
    assert failed == [1, 2]
    assert "collapsecheck could not diagnose step 1: no response had a reasoning segment" in (
        caplog.text
    )
