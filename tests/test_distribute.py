"""A run's work split and planned: --shard I/N and a Slurm array's share scan into the results
cache, a plain scan joins them without loading a model and with the same numbers as one
process; --dry-run prints the plan and loads nothing."""

import json

import pytest
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.errors import CollapsecheckError
from collapsecheck.runs.cost import unit_cost
from collapsecheck.runs.shards import Shard, parse_shard, slurm_shard
from tests.conftest import EXAMPLES, PROMPTS

RUN = EXAMPLES / "demo-run"
FAST = ["-p", str(PROMPTS), "-n", "4", "-k", "2", "--max-new-tokens", "32", "--device", "cpu",
        "--bootstrap", "100", "--fail-on", "none"]  # fmt: skip
runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def test_the_plan_counts_pairs_and_tokens():
    full = unit_cost(16, 8, 64, None, flow=True)
    assert full.xz_pairs == 16 * 8 * 16  # every trace under every prompt
    assert full.flow_pairs == 128 * 16 + 2 * 128 * 128
    assert full.max_tokens == (128 + full.xz_pairs + full.flow_pairs) * 64
    sampled = unit_cost(16, 8, 64, 3, flow=False)
    assert sampled.xz_pairs == 128 * 4 and sampled.flow_pairs == 0
    assert unit_cost(4, 2, 8, 3, flow=False).negatives is None  # 3 others: all of them
    rollouts = unit_cost(3, 4, 0, None, flow=False, responses=10)  # groups of unequal size
    assert rollouts.responses == 10 and rollouts.max_tokens == 0


def test_shards_split_a_run_round_robin_and_cover_it_once():
    steps = list(range(11))
    shares = [Shard(i, 3, "--shard").share(steps) for i in range(3)]
    assert shares[0] == [0, 3, 6, 9]
    assert sorted(step for share in shares for step in share) == steps


@pytest.mark.parametrize("value", ["3/3", "-1/2", "a/2", "2", "1/0"])
def test_a_bad_shard_is_one_line(value):
    with pytest.raises(CollapsecheckError, match="--shard expects I/N"):
        parse_shard(value)


def test_a_slurm_array_task_gives_its_share():
    env = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert slurm_shard(env) == Shard(1, 3, "SLURM_ARRAY_TASK_ID=5 of 3")
    assert slurm_shard({}) is None
    with pytest.raises(CollapsecheckError, match="stepped --array"):
        slurm_shard({**env, "SLURM_ARRAY_TASK_ID": "9"})


def test_dry_run_prints_the_plan_and_loads_nothing(tmp_path):
    result = invoke("scan", RUN, *FAST, "--dry-run", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert (
        "plan: 5 checkpoints, 4 prompts x 2 samples, 32 X->Z pairs (all prompts)" in result.output
    )
    assert "sampling" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_shards_then_a_join_equal_one_process(tmp_path):
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    first = invoke("scan", RUN, *FAST, "--shard", "0/2", "--out", shared)
    assert first.exit_code == 0, first.output
    assert "shard 0/2 (--shard): 3 checkpoint(s)" in first.output
    assert "shard 0/2 (--shard) done: 100, 300, 500 in the results cache" in first.output
    # the second share comes from a Slurm array task, read from its variables
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "2"}
    second = invoke("scan", RUN, *FAST, "--out", shared, env=env)
    assert second.exit_code == 0, second.output
    assert "shard 1/2 (SLURM_ARRAY_TASK_ID=1 of 2)" in second.output
    planned = invoke("scan", RUN, *FAST, "--out", shared, "--dry-run")
    assert "5 checkpoints (5 cached)" in planned.output
    joined = invoke("scan", RUN, *FAST, "--out", shared, "--json", tmp_path / "joined.json")
    assert joined.exit_code == 0, joined.output
    assert "5 of 5 checkpoints answered from the cache" in joined.output
    assert "sampling" not in joined.output  # no model loaded
    one = invoke("scan", RUN, *FAST, "--out", alone, "--json", tmp_path / "one.json")
    assert one.exit_code == 0, one.output
    numbers = [
        [s["report"]["metrics"] for s in json.loads((tmp_path / f).read_text())["steps"]]
        for f in ("joined.json", "one.json")
    ]
    assert numbers[0] == numbers[1]
    steps = json.loads((tmp_path / "joined.json").read_text())["steps"]
    assert json.loads((tmp_path / "joined.json").read_text())["hosts"] == {
        steps[0]["report"]["timing"]["host"]: ["100", "200", "300", "400", "500"]
    }
    assert all(s["report"]["timing"]["tokens_scored_per_s"] > 0 for s in steps)


def test_a_shard_refuses_outputs_that_belong_to_the_join(tmp_path):
    result = invoke("scan", RUN, *FAST, "--shard", "0/2", "--json", tmp_path / "r.json")
    assert result.exit_code == 2
    assert "a shard writes only the results cache: --json belong to the join" in result.output
    single = invoke("scan", RUN / "global_step_100", *FAST, "--shard", "0/2")
    assert single.exit_code == 2 and "--shard splits a run directory" in single.output
