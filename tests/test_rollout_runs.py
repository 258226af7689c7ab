"""`scan RUN` from the rollouts the trainer wrote: each step's rollouts scored under the
checkpoint whose weights sampled them (TRL's completions/ beside a real GRPOTrainer run,
veRL's rollout_data_dir written by veRL's own dumping code), a wrong pairing caught as a
mismatch, and every refusal one line before any model loads."""

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from collapsecheck import score
from collapsecheck.cli import app
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.trainer_rollouts import RolloutFile
from collapsecheck.runs.pairing import pair_rollouts
from tests.conftest import EXAMPLES, PROMPTS, ROOT

TRL_RUN = ROOT / "tests" / "fixtures" / "trl-grpo-completions"  # completions at steps 2, 4, 6
START = EXAMPLES / "demo-run" / "global_step_200"  # the policy that TRL run started from
VERL_ROLLOUTS = ROOT / "tests" / "fixtures" / "verl-rollouts"  # steps 1, 2, by global_step_100
MIRRORED = EXAMPLES / "checkpoints" / "mirrored"  # reads the grid turned half round
FAST = ["--device", "cpu", "--bootstrap", "200", "--fail-on", "none"]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def error_lines(result):
    return [line for line in result.output.strip().splitlines() if line]


def test_each_step_pairs_with_the_checkpoint_before_it():
    files = [RolloutFile(s, ROOT / f"{s}.jsonl", "verl", s - 1) for s in (1, 2, 3, 5, 9)]
    run = [RunCheckpoint(f"global_step_{s}", s, None) for s in (2, 4)]
    run.append(RunCheckpoint("unnumbered", None, None))
    pairings, skipped = pair_rollouts(files, run)
    assert [f.step for f in skipped] == [1, 2]  # sampled before any saved checkpoint
    assert [(p.rollouts.step, p.checkpoint.step, p.gap) for p in pairings] == [
        (3, 2, 0), (5, 4, 0), (9, 4, 4),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache")
    reports = tmp_path_factory.mktemp("reports")
    report = reports / "run.json"
    result = invoke("scan", TRL_RUN, "--baseline", START, "--out", out, "--json", report,
                    "--plot", reports / "run.png", "--markdown", reports / "run.md",
                    *FAST)  # fmt: skip
    return result, json.loads(report.read_text()) if report.is_file() else None, out, reports


def test_a_trl_run_is_diagnosed_from_its_own_completions(trl_run):
    result, run, _, reports = trl_run
    assert result.exit_code == 0, result.output
    assert "the trainer's own rollouts (TRL" in result.output
    assert "plan: 3 rollout steps of the trainer under 3 checkpoints" in result.output
    assert "traces" in run and "TRL" in run["traces"]
    rows = [(s["step"], s["rollouts"]["checkpoint"], s["rollouts"]["gap"]) for s in run["steps"]]
    # step s was sampled by the weights after update s - 1: the baseline, checkpoint-2, -4
    assert rows == [(2, "baseline", 1), (4, "checkpoint-2", 1), (6, "checkpoint-4", 1)]
    for step in run["steps"]:
        settings = step["report"]["settings"]
        assert settings["trainer_rollouts"]["trainer"] == "trl"
        assert settings["trainer_rollouts"]["step"] == step["step"]
        assert step["report"]["snr"]["rewards"] == "rollouts, per response"
        assert "reward" in step["training_log"]  # TRL's own log beside each step
    assert "checkpoint-2 (gap 1)" in result.output
    # the run's outputs as for sampled scans
    assert (reports / "run.png").stat().st_size > 10_000
    assert "latest: 6" in (reports / "run.md").read_text()


def test_a_rollout_step_equals_score_on_its_file_under_its_checkpoint(trl_run):
    run = trl_run[1]
    step = run["steps"][1]
    direct = score(TRL_RUN / "checkpoint-2", step["rollouts"]["file"], device="cpu",
                   bootstrap=200)  # fmt: skip
    assert (
        step["report"]["metrics"]["normalized_mi"] == direct.to_dict()["metrics"]["normalized_mi"]
    )
    assert step["report"]["verdict"] == direct.to_dict()["verdict"]


def test_a_rerun_answers_every_step_from_the_cache(trl_run):
    out = trl_run[2]
    again = invoke("scan", TRL_RUN, "--baseline", START, "--out", out, *FAST)
    assert again.exit_code == 0, again.output
    assert "under 3 checkpoints, 3 cached," in again.output  # the plan counts them
    assert "3 of 3 rollout steps answered from the cache" in again.output


def test_without_a_baseline_the_first_step_is_skipped_and_counted(tmp_path):
    result = invoke("scan", TRL_RUN, "--dry-run", *FAST)
    assert result.exit_code == 0, result.output
    assert "2 rollout steps of the trainer (1 skipped: no checkpoint to pair with)" in result.output


def test_sample_forces_fresh_sampling(tmp_path):
    result = invoke("scan", TRL_RUN, "--sample", "-p", PROMPTS, "--dry-run", *FAST)
    assert result.exit_code == 0, result.output
    assert "plan: 3 checkpoints" in result.output and "rollout" not in result.output


def test_a_verl_run_with_its_rollout_dir_and_training_prompts(tmp_path):
    run_dir = tmp_path / "verl-run"
    run_dir.mkdir()
    (run_dir / "global_step_1").symlink_to(EXAMPLES / "demo-run" / "global_step_100")
    baseline = EXAMPLES / "demo-run" / "global_step_100"  # the weights that sampled both steps
    result = invoke("scan", run_dir, "--rollouts", VERL_ROLLOUTS, "--prompts", PROMPTS,
                    "--baseline", baseline, "--out", tmp_path / "cache",
                    "--json", tmp_path / "run.json", *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "run.json").read_text())
    rows = [(s["step"], s["rollouts"]["checkpoint"], s["rollouts"]["gap"]) for s in run["steps"]]
    assert rows == [(1, "baseline", 0), (2, "global_step_1", 0)]
    for step in run["steps"]:
        assert "8 of 8 inputs matched a row of" in step["report"]["settings"]["prompt_matching"]
        assert step["report"]["verdict"]["regime"] == "grounded"


def test_rollouts_scored_by_the_wrong_checkpoint_are_called_a_mismatch(tmp_path):
    """A run whose only checkpoint is not the policy that sampled the rollouts (one that reads
    the grid turned half round): each trace is likelier under other prompts than its own, and
    the off-policy check says so instead of a verdict."""
    run_dir = tmp_path / "wrong-run"
    shutil.copytree(TRL_RUN / "completions", run_dir / "completions")
    (run_dir / "checkpoint-3").symlink_to(MIRRORED)
    result = invoke("scan", run_dir, "--out", tmp_path / "cache", "--json", tmp_path / "r.json",
                    *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "r.json").read_text())
    assert [s["step"] for s in run["steps"]] == [4, 6]
    for step in run["steps"]:
        report = step["report"]
        assert report["metrics"]["mi_seq_estimate"]["high"] < 0
        assert report["verdict"]["regime"] == "inconclusive"
        assert "unlikely under this checkpoint" in report["verdict"]["reason"]


def test_a_bad_completion_file_in_a_run_is_one_line_before_any_model_loads(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(TRL_RUN / "completions", run_dir / "completions")
    (run_dir / "checkpoint-3").symlink_to(MIRRORED)
    bad = run_dir / "completions" / "completions_00006.parquet"
    frame = pd.read_parquet(bad).drop(columns=["completion"])
    frame.to_parquet(bad)
    result = invoke("scan", run_dir, *FAST)
    assert result.exit_code == 2
    assert error_lines(result) == [f"error: {bad}, row 1: no 'completion' field"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sample", "--rollouts", VERL_ROLLOUTS],
         "--rollouts scores the trainer's rollouts, --sample samples: choose one"),
        (["-p", PROMPTS], f"--prompts {PROMPTS}: the rollouts in {TRL_RUN / 'completions'} hold"),
        (["--keep-prompts", "kept.jsonl"],
         f"--keep-prompts kept.jsonl: the prompts are parquet ({TRL_RUN / 'completions'}"),
        (["--shard", "0/2", "--json", "run.json"],
         "a shard writes only the results cache: --json belong to the join"),
    ],
)  # fmt: skip
def test_options_that_do_not_fit_a_runs_rollouts_are_refused(extra, message):
    result = invoke("scan", TRL_RUN, *extra, *FAST)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output


def test_rollouts_folder_errors_name_the_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("scan", TRL_RUN, "--rollouts", empty, *FAST)
    assert result.exit_code == 2
    assert error_lines(result)[0].startswith(f"error: --rollouts {empty}: no trainer rollout")
    single = invoke("scan", START, "--rollouts", VERL_ROLLOUTS, *FAST)
    assert single.exit_code == 2 and "--rollouts goes with a run directory" in single.output
    early = tmp_path / "early"
    early.mkdir()
    shutil.copy(VERL_ROLLOUTS / "1.jsonl", early / "1.jsonl")
    result = invoke("scan", TRL_RUN, "--rollouts", early, *FAST)
    assert result.exit_code == 2
    assert "cannot score 1 rollout step(s)" in result.output


def step_metrics(report: dict) -> dict:
    return {s["step"]: s["report"]["metrics"] for s in report["steps"]}


def test_a_rollout_run_in_shards_then_joined_equals_one_process(trl_run, tmp_path):
    """The trainer's rollouts take the sampled route's executors: each shard scores its
    checkpoints' steps into the results cache, the join reads them, and the numbers are those
    of one process (the `trl_run` fixture)."""
    _, one_process, _, _ = trl_run
    shared = tmp_path / "cache"
    common = ["--baseline", START, "--out", shared, *FAST]
    first = invoke("scan", TRL_RUN, *common, "--shard", "0/2")
    assert first.exit_code == 0, first.output
    # round robin over checkpoints: the baseline (step 2) and checkpoint-4 (step 6)
    assert "shard 0/2 (--shard): 2 checkpoint(s) of this run" in first.output
    assert "shard 0/2 (--shard) done: 2, 6 in the results cache" in first.output
    second = invoke("scan", TRL_RUN, *common, "--shard", "1/2")
    assert second.exit_code == 0 and "done: 4 in the results cache" in second.output
    planned = invoke("scan", TRL_RUN, *common, "--dry-run")
    assert "under 3 checkpoints, 3 cached," in planned.output
    joined = invoke("scan", TRL_RUN, *common, "--json", tmp_path / "run.json")
    assert joined.exit_code == 0, joined.output
    assert step_metrics(json.loads((tmp_path / "run.json").read_text())) == step_metrics(
        one_process
    )


def test_a_checkpoints_rollout_steps_stay_in_one_shard(tmp_path):
    """veRL steps 1 and 2 both pair with the baseline here: one model load, one shard."""
    run_dir = tmp_path / "verl-run"
    run_dir.mkdir()
    (run_dir / "global_step_5").symlink_to(EXAMPLES / "demo-run" / "global_step_100")
    common = ["--rollouts", VERL_ROLLOUTS, "--baseline", EXAMPLES / "demo-run" / "global_step_100",
              "--out", tmp_path / "cache", *FAST]  # fmt: skip
    empty = invoke("scan", run_dir, *common, "--shard", "1/2")
    assert empty.exit_code == 0 and "done: nothing in the results cache" in empty.output
    both = invoke("scan", run_dir, *common, "--shard", "0/2")
    assert both.exit_code == 0 and "done: 1, 2 in the results cache" in both.output


def rollout_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_keep_prompts_from_jsonl_rollouts_writes_their_own_rows_every_column(tmp_path):
    """Rollouts with veRL's dataset columns: each kept prompt is its group's first row of
    the input file, verbatim (uid, data_source, extra_info and all)."""
    source = [json.loads(line) for line in (EXAMPLES / "rollouts" / "gridworld.jsonl").open()]
    rows = [
        {**row, "data_source": "gridworld", "extra_info": {"index": n, "split": "train"}}
        for n, row in enumerate(source)
    ]
    rollouts = rollout_rows(tmp_path / "rollouts.jsonl", rows)
    kept = tmp_path / "kept.jsonl"
    result = invoke("score", rollouts, "-c", START, "--keep-prompts", kept,
                    "--json", tmp_path / "r.json", *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    lines = kept.read_text().splitlines()
    assert len(lines) == len(report["snr"]["kept_prompts"]) > 0
    firsts = {}
    for line in rollouts.read_text().splitlines():
        firsts.setdefault(json.loads(line)["uid"], line)
    assert set(lines) <= set(firsts.values())  # verbatim: each group's first row
    assert len({json.loads(line)["uid"] for line in lines}) == len(lines)
    assert f"kept {len(lines)} of {len(firsts)} prompts" in result.output


def test_scan_run_keeps_the_last_steps_prompts_as_its_rollout_rows(tmp_path):
    run_dir = tmp_path / "verl-run"
    run_dir.mkdir()
    (run_dir / "global_step_1").symlink_to(EXAMPLES / "demo-run" / "global_step_100")
    kept = tmp_path / "kept.jsonl"
    result = invoke("scan", run_dir, "--rollouts", VERL_ROLLOUTS, "--baseline",
                    EXAMPLES / "demo-run" / "global_step_100", "--out", tmp_path / "cache",
                    "--keep-prompts", kept, *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    last = (VERL_ROLLOUTS / "2.jsonl").read_text().splitlines()
    lines = kept.read_text().splitlines()
    assert lines and set(lines) <= set(last)  # the last step's own rows, every column
    assert len({json.loads(line)["input"] for line in lines}) == len(lines)
    assert f"rows of {VERL_ROLLOUTS / '2.jsonl'}" in result.output
