"""Why it collapsed (SPEC "Why: reward variance and the SNR report"): hand-made reward
matrices, reward functions and rollouts, the keep set written back, the per-prompt table."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from collapsecheck import scan, score
from collapsecheck.cli import app
from collapsecheck.errors import CollapsecheckError
from collapsecheck.measures.snr import (
    PromptRewards,
    RowStatistics,
    quartile_groups,
    snr_keep,
    snr_section,
    zero_variance_split,
)
from tests.conftest import EXAMPLES, HEALTHY, PROMPTS

REWARD_FN = EXAMPLES / "rewards" / "gridworld.py"


def test_reward_mean_and_sample_std_per_prompt():
    rewards = PromptRewards.of([[1, 0, 1, 0], [1], [0.5, 0.5]])
    assert rewards.mean.tolist() == [0.5, 1.0, 0.5]
    assert rewards.std[0] == pytest.approx(np.std([1, 0, 1, 0], ddof=1))
    assert rewards.std[1] == 0.0  # a single response has no spread
    with pytest.raises(ValueError, match="finite"):
        PromptRewards.of([[1.0, float("nan")]])


def test_zero_variance_splits_into_its_three_causes():
    rewards = PromptRewards.of([[1, 1, 1], [0, 0], [0.5, 0.5], [1, 0], [1]])
    split = zero_variance_split(rewards)
    assert split["zero"].tolist() == [True, True, True, False, True]
    assert split["too_easy"].tolist() == [True, False, False, False, True]
    assert split["too_hard"].tolist() == [False, True, False, False, False]
    assert split["uninformative"].tolist() == [False, False, True, False, False]


def test_a_batch_whose_rewards_all_tie_has_no_extreme():
    split = zero_variance_split(PromptRewards.of([[1, 1], [1, 1]]))
    assert split["uninformative"].all() and not split["too_easy"].any()


def test_the_snr_filter_keeps_the_shortest_prefix_of_highest_std():
    std = np.array([0.5, 0.0, 0.3, 0.2])
    keep = snr_keep(std, 0.9)  # 0.5 + 0.3 = 0.8 >= 0.9 * 1.0 - 0.01 = 0.89? no: all three
    assert keep.tolist() == [True, False, True, True]
    assert snr_keep(std, 0.5).tolist() == [True, False, False, False]
    assert not snr_keep(np.zeros(3), 0.9).any()  # a std of 0 is never kept


def test_quartiles_are_as_equal_as_ties_allow():
    assert quartile_groups(np.arange(8.0)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    tied = quartile_groups(np.array([0.0, 0, 0, 0, 0, 1, 2, 3]))
    assert len(set(tied[:5].tolist())) == 1  # ties stay together
    assert tied[-1] == 3


def test_the_snr_section_on_a_hand_made_batch():
    n = 8
    rewards = PromptRewards.of([[1, 0]] * 4 + [[1, 1]] * 2 + [[0, 0]] * 2)
    rows = RowStatistics(
        row_prompt=np.repeat(np.arange(n), 2),
        mi=np.repeat(np.array([2.0, 1.9, 1.8, 1.7, 0.1, 0.2, 0.0, 0.1]), 2),
        hit=np.repeat(np.array([1.0] * 4 + [0.0] * 4), 2),
    )
    section = snr_section(rewards, rows, np.full(n, 0.5), resamples=200)
    assert section["frac_reward_zero_std"] == 0.5
    assert (section["zero_std_too_easy"], section["zero_std_too_hard"]) == (0.25, 0.25)
    assert section["zero_std_uninformative"] == 0.0
    assert section["distinct_action_rate_at_zero_std"] == 0.5
    assert section["rollout/filter_kept_ratio"] == 0.5
    assert section["kept_prompts"] == [0, 1, 2, 3]
    assert section["rv_mi_spearman"].value > 0.8
    quartiles = section["quartiles"]
    assert [q["prompts"] for q in quartiles] == [4, 4]  # two std values: two groups
    assert quartiles[-1]["normalized_mi"].value > quartiles[0]["normalized_mi"].value
    assert quartiles[-1]["retrieval_accuracy"].value == 1.0


def test_a_scan_with_the_example_reward_function(tmp_path):
    report = scan(HEALTHY, PROMPTS, k=4, num_prompts=8, max_new_tokens=48, device="cpu",
                  bootstrap=100, reward_fn=str(REWARD_FN), dump=tmp_path)  # fmt: skip
    snr = report.snr
    assert snr["rewards"].startswith("--reward-fn")
    assert 0 <= snr["frac_reward_zero_std"] <= 1
    assert math.isclose(
        snr["zero_std_too_easy"] + snr["zero_std_too_hard"] + snr["zero_std_uninformative"],
        snr["frac_reward_zero_std"],
    )
    assert snr["rollout/in_group_reward_mean"] > 0.3  # the healthy policy mostly moves well
    table = [json.loads(line) for line in (tmp_path / "per_prompt.jsonl").open()]
    assert len(table) == 8 and {"own_mi", "reward_mean", "reward_std"} <= set(table[0])
    frame = report.per_prompt_frame()
    assert list(frame.index) == list(range(8))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["snr"]["rv_mi_spearman"].keys() == {"value", "low", "high"}


def test_without_rewards_the_section_is_null_with_the_flag_that_adds_it():
    report = scan(HEALTHY, PROMPTS, k=2, num_prompts=4, max_new_tokens=48, device="cpu",
                  bootstrap=50)  # fmt: skip
    assert report.snr is None
    assert "--reward-fn" in report.snr_reason
    assert report.to_dict()["snr"] is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def compute_score(*a, **k):\n    raise KeyError('x')\n", "raised KeyError"),
        ("def compute_score(*a, **k):\n    return 'good'\n", "is not a number ('good')"),
        ("def compute_score(*a, **k):\n    return float('inf')\n", "is not finite"),
        ("def compute_score(*a, **k):\n    return {'acc': 1}\n", "is not a number (None)"),
        ("def other(*a, **k):\n    return 1\n", "has no function 'compute_score'"),
        ("def compute_score(:\n", "failed to load (SyntaxError"),
    ],
)
def test_a_bad_reward_function_is_one_line_naming_the_row(tmp_path, body, message):
    path = tmp_path / "reward.py"
    path.write_text(body)
    result = CliRunner().invoke(
        app, ["scan", str(HEALTHY), "-p", str(PROMPTS), "-n", "3", "-k", "2", "--device", "cpu",
              "--max-new-tokens", "32", "--reward-fn", str(path)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    words = " ".join(result.output.split())
    assert message in words
    if "raised" in message or "number" in message or "finite" in message:
        assert "gridworld.jsonl:1 (response 0)" in words


def test_a_missing_reward_file_is_refused_before_any_work(tmp_path):
    with pytest.raises(CollapsecheckError, match="file not found"):
        scan(HEALTHY, PROMPTS, reward_fn=str(tmp_path / "nope.py"))


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rollout_rewards_per_response_and_per_trajectory(tmp_path):
    rows = [{"uid": i, "prompt": f"agent {i},0 goal 0,{i}",
             "response": f"<think>me {i},0 goal 0,{i}: up</think><answer>up</answer>",
             "score": float(j % 2)} for i in range(1, 5) for j in range(2)]  # fmt: skip
    report = score(HEALTHY, write_rows(tmp_path / "r.jsonl", rows), device="cpu", bootstrap=50)
    assert report.snr["rewards"] == "rollouts, per response"
    assert report.snr["frac_reward_zero_std"] == 0.0
    turn = {"response": "<think>go up</think><answer>up</answer>"}
    multi = [{"reward": 1.0, "turns": [{**turn, "prompt": f"agent {i},0 goal 0,{i}"}]}
             for i in range(1, 5)]  # fmt: skip
    traj = score(HEALTHY, write_rows(tmp_path / "m.jsonl", multi), device="cpu", bootstrap=50)
    assert traj.snr["rewards"] == "rollouts, per trajectory"
    unscored = {k: v for k, v in rows[1].items() if k != "score"}
    with pytest.raises(CollapsecheckError, match=r"r2.jsonl:2.*no reward"):
        score(HEALTHY, write_rows(tmp_path / "r2.jsonl", [rows[0], unscored]), device="cpu")
    with pytest.raises(CollapsecheckError, match=r"r3.jsonl:2 \('score'\): the reward is not a"):
        score(HEALTHY, write_rows(tmp_path / "r3.jsonl", [rows[0], {**rows[1], "score": None}]),
              device="cpu")  # fmt: skip


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_keep_prompts_round_trips_the_rows_verbatim(tmp_path, suffix):
    """A veRL-style dataset (data_source, prompt, ability, reward_model, extra_info) or JSONL:
    the kept rows come back exactly as they were, every column kept."""
    source = EXAMPLES / "prompts" / f"gridworld{suffix}"
    kept = tmp_path / f"kept{suffix}"
    args = ["scan", str(HEALTHY), "-p", str(source), "-n", "8", "-k", "4", "--device", "cpu",
            "--max-new-tokens", "48", "--reward-fn", str(REWARD_FN), "--keep-prompts", str(kept),
            "--fail-on", "none", "--json", str(tmp_path / "r.json")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    indices = json.loads((tmp_path / "r.json").read_text())["snr"]["kept_prompts"]
    assert kept.is_file()
    if suffix == ".parquet":
        original, written = pd.read_parquet(source), pd.read_parquet(kept)
        assert list(written.columns) == list(original.columns)
        expected = original.iloc[indices].reset_index(drop=True)
        assert written.to_json() == expected.to_json()
    else:
        lines = source.read_text().splitlines()
        assert kept.read_text().splitlines() == [lines[i] for i in indices]


def test_keep_prompts_needs_rewards_and_the_input_format():
    base = ["scan", str(HEALTHY), "-p", str(PROMPTS), "--device", "cpu"]
    no_rewards = CliRunner().invoke(app, [*base, "--keep-prompts", "kept.jsonl"])
    assert no_rewards.exit_code == 2 and "needs rewards" in no_rewards.output
    wrong = CliRunner().invoke(
        app, [*base, "--reward-fn", str(REWARD_FN), "--keep-prompts", "kept.parquet"]
    )
    assert wrong.exit_code == 2 and "give a file of that format" in wrong.output


def test_a_run_with_rewards_shows_the_zero_variance_share_along_its_steps(tmp_path):
    args = ["scan", str(EXAMPLES / "demo-run"), "-p", str(PROMPTS), "-n", "6", "-k", "4",
            "--max-new-tokens", "48", "--device", "cpu", "--bootstrap", "100",
            "--reward-fn", str(REWARD_FN), "--out", str(tmp_path / "cache"), "--fail-on", "none",
            "--json", str(tmp_path / "run.json"), "--plot", str(tmp_path / "run.png")]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "0-var" in result.output and "RV~MI" in result.output
    steps = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert all(0 <= s["report"]["snr"]["frac_reward_zero_std"] <= 1 for s in steps)
    assert (tmp_path / "run.png").stat().st_size > 10_000
