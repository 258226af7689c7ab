"""Rollouts in the trainers' own files, scored with `score`: TRL's completions parquet (written
by a real GRPOTrainer run on CPU, tests/fixtures/trl-grpo-completions, `make fixtures`) and
veRL's rollout_data_dir JSONL (written by veRL's own dumping code,
tests/fixtures/verl-rollouts, `make verl-fixtures`)."""

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import plain_value
from collapsecheck.inputs.trainer_rollouts import trainer_rollouts
from tests.conftest import ROOT

TRL_RUN = ROOT / "tests" / "fixtures" / "trl-grpo-completions"
TRL_FILE = TRL_RUN / "completions" / "completions_00004.parquet"
# step 4 was sampled by the policy after update 3, last saved at step 2
CHECKPOINT = TRL_RUN / "checkpoint-2"


def score(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck", "score", *map(str, args), "--fail-on", "none"],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_trls_completions_file_is_read_as_trl_wrote_it():
    read = trainer_rollouts(TRL_FILE)
    assert read.trainer == "trl" and read.step == 4
    frame = pd.read_parquet(TRL_FILE)
    assert len(read.rows) == len(frame) == 32
    where, first, number = read.rows[0]
    assert where == f"{TRL_FILE}, row 1" and number == 1
    # chat messages as TRL logged them; the completion is the assistant message's text
    assert first["prompt"][0]["role"] == "system"
    assert first["response"] == frame["completion"][0][0]["content"]
    assert first["reward"] == pytest.approx(
        frame["answer_correct"][0] + frame["deliberate_phrasing"][0]
    )
    assert "equal weights" in read.notes[1]


def test_score_reads_trls_completions_with_the_files_rewards(tmp_path):
    result = score(TRL_FILE, "-c", CHECKPOINT, "--json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    assert "TRL completions of step 4: 32 completions" in result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["trainer_rollouts"]["step"] == 4
    assert report["settings"]["num_prompts"] == 4 and report["settings"]["samples_per_prompt"] == 8
    assert report["settings"]["rewards"] == "per response"
    assert report["snr"]["rollout/in_group_reward_std"] > 0


def test_reward_field_picks_one_reward_column(tmp_path):
    result = score(TRL_FILE, "-c", CHECKPOINT, "--reward-field", "answer_correct",
                   "--json", tmp_path / "r.json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(TRL_FILE)
    report = json.loads((tmp_path / "r.json").read_text())
    means = frame.groupby(frame["prompt"].astype(str))["answer_correct"].mean()
    assert report["snr"]["rollout/in_group_reward_mean"] == pytest.approx(means.mean())


def test_a_bad_completion_row_is_one_line_before_any_model_loads(tmp_path):
    frame = pd.read_parquet(TRL_FILE)
    frame.loc[2, "answer_correct"] = float("inf")
    bad = tmp_path / "completions" / "completions_00004.parquet"
    bad.parent.mkdir()
    frame.to_parquet(bad)
    result = score(bad, "-c", tmp_path / "no-such-checkpoint")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {bad}, row 3: field 'answer_correct' is not a finite number: inf"
    ]


def test_a_trl_file_with_text_prompts_and_completions(tmp_path):
    """Standard (not conversational) datasets log text, which is read as text."""
    frame = pd.read_parquet(TRL_FILE)
    frame["prompt"] = [m[-1]["content"] for m in frame["prompt"]]
    frame["completion"] = [m[0]["content"] for m in frame["completion"]]
    path = tmp_path / "completions_00004.parquet"
    frame.to_parquet(path)
    read = trainer_rollouts(path)
    assert read.rows[0][1]["prompt"] == frame["prompt"][0]
    assert read.rows[0][1]["response"] == frame["completion"][0]
    copied = tmp_path / "other.parquet"
    shutil.copy(path, copied)
    assert trainer_rollouts(copied) is None  # not TRL's file name: a generic rollout file


VERL_FILE = ROOT / "tests" / "fixtures" / "verl-rollouts" / "2.jsonl"
DEMO_POLICY = ROOT / "examples" / "demo-run" / "global_step_100"  # the policy that sampled them


def test_verls_rollout_dump_is_read_as_verl_wrote_it():
    read = trainer_rollouts(VERL_FILE)
    assert read.trainer == "verl" and read.step == 2
    lines = [json.loads(line) for line in VERL_FILE.read_text().splitlines()]
    assert len(read.rows) == len(lines) == 64
    where, first, number = read.rows[0]
    assert where == f"{VERL_FILE}:1" and number == 1
    assert first["prompt"] == lines[0]["input"] and first["response"] == lines[0]["output"]
    assert first["reward"] == lines[0]["score"]
    # veRL decodes its prompt ids with special tokens skipped: the chat markers are gone
    assert "<|" not in first["prompt"] and "special tokens skipped" in read.notes[0]


def test_score_reads_verls_dump_grouped_by_input(tmp_path):
    result = score(VERL_FILE, "-c", DEMO_POLICY, "--json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["num_prompts"] == 8 and report["settings"]["samples_per_prompt"] == 8
    assert report["settings"]["trainer_rollouts"]["trainer"] == "verl"
    lines = [json.loads(line) for line in VERL_FILE.read_text().splitlines()]
    mean = sum(line["score"] for line in lines) / len(lines)
    assert report["snr"]["rollout/in_group_reward_mean"] == pytest.approx(mean)


def test_a_bad_verl_row_names_the_file_line_and_field(tmp_path):
    lines = VERL_FILE.read_text().splitlines()
    row = json.loads(lines[4])
    row["score"] = "high"
    lines[4] = json.dumps(row)
    bad = tmp_path / "2.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = score(bad, "-c", tmp_path / "no-such-checkpoint")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {bad}:5: field 'score' is not a finite number: 'high'"
    ]


def test_verls_inputs_are_matched_to_the_training_rows_and_rendered_as_veRL_did(tmp_path):
    plain, matched = tmp_path / "plain", tmp_path / "matched"
    assert score(VERL_FILE, "-c", DEMO_POLICY, "--dump", plain).returncode == 0
    result = score(VERL_FILE, "-c", DEMO_POLICY, "--dump", matched,
                   "--prompts", ROOT / "examples" / "prompts" / "gridworld.jsonl")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "8 of 8 inputs matched a row of" in result.stderr
    rendered = [json.loads(line)["text"] for line in (matched / "prompts.jsonl").open()]
    decoded = [json.loads(line)["text"] for line in (plain / "prompts.jsonl").open()]
    # the context the policy saw, chat markers included; without --prompts the decoded text
    assert all(t.startswith("<|system|>") for t in rendered)
    assert not any("<|" in t for t in decoded)


def test_prompts_with_a_trl_file_is_refused_before_any_model_loads(tmp_path):
    result = score(TRL_FILE, "-c", tmp_path / "none", "--prompts", tmp_path / "train.parquet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --prompts {tmp_path / 'train.parquet'}: score matches it to a veRL rollout "
        f"dump's decoded inputs; {TRL_FILE} holds its prompts itself"
    ]


def test_keep_prompts_from_trl_completions_writes_their_own_rows(tmp_path):
    kept = tmp_path / "kept.parquet"
    result = score(
        TRL_FILE, "-c", CHECKPOINT, "--keep-prompts", kept, "--json", tmp_path / "r.json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    rows = pd.read_parquet(kept)
    assert len(rows) == len(report["snr"]["kept_prompts"]) > 0
    assert f"kept {len(rows)} of 4 prompts" in result.stderr
    # each kept prompt is one row of the file as TRL logged it, every column kept, its prompt
    # (chat messages) ready for a dataset
    logged = pd.read_parquet(TRL_FILE)
    assert list(rows.columns) == list(logged.columns)
    prompts = [json.dumps(plain_value(p)) for p in rows["prompt"]]
    assert len(set(prompts)) == len(rows)  # one row per kept prompt
    assert set(prompts) <= {json.dumps(plain_value(p)) for p in logged["prompt"]}


def test_keep_prompts_from_verl_rollouts_writes_the_training_rows(tmp_path):
    kept = tmp_path / "kept.jsonl"
    prompts = ROOT / "examples" / "prompts" / "gridworld.jsonl"
    result = score(VERL_FILE, "-c", DEMO_POLICY, "--prompts", prompts, "--keep-prompts", kept)
    assert result.returncode == 0, result.stderr
    training = set(prompts.read_text().splitlines())
    rows = kept.read_text().splitlines()
    assert rows and all(row in training for row in rows)  # verbatim lines of the training file
    assert f"kept {len(rows)} of 8 prompts" in result.stderr


def test_keep_prompts_refusals_come_before_any_model_loads(tmp_path):
    parquet = score(TRL_FILE, "-c", tmp_path / "none", "--keep-prompts", tmp_path / "k.jsonl")
    assert parquet.returncode == 2
    assert f"the prompts are parquet ({TRL_FILE}); give a file of that format" in parquet.stderr
    unrewarded = tmp_path / "r.jsonl"
    rows = [{"prompt": "a", "response": "x"}, {"prompt": "b", "response": "y"}]
    unrewarded.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = score(unrewarded, "-c", tmp_path / "none", "--keep-prompts", tmp_path / "k.jsonl")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --keep-prompts needs rewards: {unrewarded} has no reward or score field "
        "(--reward-field NAME names another)"
    ]


def test_a_reward_function_that_did_not_apply_is_skipped_as_trl_skips_it(tmp_path):
    """TRL writes NaN where a reward function returned None (it did not apply): the reward is
    the sum of the others (TRL's nansum); a completion no function scored is an error."""
    frame = pd.read_parquet(TRL_FILE)
    frame.loc[0, "deliberate_phrasing"] = float("nan")
    path = tmp_path / "completions_00004.parquet"
    frame.to_parquet(path)
    read = trainer_rollouts(path)
    assert read.rows[0][1]["reward"] == frame["answer_correct"][0]
    frame.loc[0, "answer_correct"] = float("nan")
    frame.to_parquet(path)
    with pytest.raises(CollapsecheckError, match=r"row 1: no reward function scored"):
        trainer_rollouts(path)
