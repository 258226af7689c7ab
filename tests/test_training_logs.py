"""Training logs beside the diagnosis (SPEC "Training logs beside the diagnosis"): readers on
files written by the libraries themselves (transformers' TrainerState, TensorBoard's
SummaryWriter, veRL's file logger), window means,
the findings, and bad logs refused before any model loads."""

import json
import math
import re

import matplotlib.image
import pytest
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.training_logs import find_log, read_log
from collapsecheck.measures.findings import (
    Window,
    find,
    series_keys,
    shown_series,
    step_windows,
    window,
)
from collapsecheck.measures.metrics import Estimate
from tests.conftest import PROMPTS, ROOT, RUN


def test_trl_trainer_state_written_by_transformers(tmp_path):
    from transformers import TrainerState

    state = TrainerState(global_step=40)
    state.log_history = [
        {"step": 10, "reward": 0.3, "entropy": 0.5, "frac_reward_zero_std": 0.0, "loss": 0.1},
        {"step": 20, "reward": 0.5, "entropy": 0.48, "frac_reward_zero_std": float("nan")},
        {"step": 40, "reward": 0.8, "entropy": 0.45, "frac_reward_zero_std": 0.3},
    ]
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    log = read_log(tmp_path / "trainer_state.json")
    assert log.series("reward") == [(10, 0.3), (20, 0.5), (40, 0.8)]
    assert log.skipped_nonfinite == 1
    assert series_keys(list(log.points), {}) == {
        "reward": "reward", "entropy": "entropy", "frac_reward_zero_std": "frac_reward_zero_std",
    }  # fmt: skip
    found, _ = find_log(tmp_path, None)
    assert found is not None and found.format == "trl trainer_state.json"


def test_verl_file_logger_lines_and_a_resumed_run(tmp_path):
    path = tmp_path / "experiment.jsonl"
    rows = [
        {"step": s, "data": {"critic/score/mean": s / 10, "actor/entropy": 1.0}} for s in (1, 2, 3)
    ]
    rows.append({"step": 2, "data": {"critic/score/mean": 9.0}})  # resumed: the later value wins
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_log(path)
    assert log.format == "veRL file logger"
    assert dict(log.series("critic/score/mean")) == {1: 0.1, 2: 9.0, 3: 0.3}
    assert series_keys(list(log.points), {})["reward"] == "critic/score/mean"


def test_a_log_written_by_veRLs_own_file_logger():
    """Written by veRL 0.9.1's Tracking(default_backend=["file"]) (tests/fixtures): numpy
    values, and a NaN that its JSON writer turns into null."""
    path = ROOT / "tests" / "fixtures" / "verl-0.9.1" / "file_logger" / "gridworld" / "grpo.jsonl"
    log = read_log(path)
    assert log.series("critic/score/mean")[0] == (1, pytest.approx(0.35))
    assert len(log.series("actor/entropy")) == 10
    assert len(log.series("actor/pg_loss")) == 9 and log.skipped_nonfinite == 1
    assert series_keys(list(log.points), {}) == {
        "reward": "critic/score/mean", "entropy": "actor/entropy",
    }  # fmt: skip


def test_wandb_style_csv_with_a_step_column(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("_step,train/reward,note\n5,0.5,a\n10,0.7,b\n")
    log = read_log(path)
    assert log.series("train/reward") == [(5, 0.5), (10, 0.7)]


def test_tensorboard_events_written_by_summary_writer(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    board = tmp_path / "tensorboard_log" / "project" / "experiment"
    with SummaryWriter(str(board)) as writer:
        for step in (1, 2, 3):
            writer.add_scalar("critic/score/mean", step * 0.1, step)
    log = read_log(board)
    assert [s for s, _ in log.series("critic/score/mean")] == [1, 2, 3]
    run = tmp_path / "checkpoints" / "project" / "experiment"
    run.mkdir(parents=True)
    found, reason = find_log(run, None)
    assert found is not None and found.format == "TensorBoard", reason


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("log.jsonl", '{"step": 1, "data": {}}\nnot json\n', "log.jsonl:2: malformed JSON"),
        ("log.jsonl", '{"data": {"reward": 1}}\n', "log.jsonl:1: no step column"),
        ("log.csv", "reward\n1\n", "no step column"),
        ("log.jsonl", '{"step": "x", "reward": 1}\n', "is not a whole number"),
        ("log.txt", "hello\n", "not a training log"),
    ],
)
def test_a_bad_log_is_refused_before_any_model_loads(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(
        app, ["scan", str(RUN), "-p", str(PROMPTS), "--device", "cpu", "--train-log", str(path)]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "sampling" not in result.output
    with pytest.raises(CollapsecheckError, match="not found"):
        read_log(tmp_path / "missing.jsonl")


def test_windows_average_the_steps_since_the_previous_checkpoint():
    values = [(s, float(s)) for s in range(1, 11)]
    assert window(values, 0, 4) == Window(2.5, pytest.approx(math.sqrt(5 / 3) / 2), 4)
    assert window(values, 4, 5).stderr is None  # one value: no standard error
    assert window(values, 10, 20) is None  # a gap: nothing logged there
    windows = step_windows({"reward": values}, [0, 4, 10], baseline=True)
    assert windows[0] == {}  # the baseline has no window
    assert windows[1]["reward"].n == 4 and windows[2]["reward"].n == 6
    every_other = [(s, 1.0) for s in range(2, 11, 2)]
    assert step_windows({"r": every_other}, [5, 10], baseline=False)[0]["r"].n == 2


def test_the_run_shows_reward_entropy_and_every_train_key_series():
    present = ["kl", "entropy", "accuracy", "frac_reward_zero_std", "reward", "format"]
    assert shown_series(present) == ["reward", "entropy", "accuracy", "format"]
    assert shown_series(["kl"]) == []


def est(value, half=0.02):
    return Estimate(value, value - half, value + half)


def test_the_three_findings_fire_where_the_spec_says():
    labels = ["20", "40", "60"]
    fell = [est(0.9), est(0.5), est(0.05)]
    windows = [
        {"reward": Window(0.3, 0.02, 5), "entropy": Window(0.50, None, 5),
         "frac_reward_zero_std": Window(0.0, None, 5)},
        {"reward": Window(0.5, 0.02, 5), "entropy": Window(0.47, None, 5),
         "frac_reward_zero_std": Window(0.1, None, 5)},
        {"reward": Window(0.8, 0.02, 5), "entropy": Window(0.42, None, 5),
         "frac_reward_zero_std": Window(0.26, None, 5)},
    ]  # fmt: skip
    kinds = [f.kind for f in find(labels, fell, windows)]
    assert kinds == ["entropy_blind", "reward_without_input", "zero_variance_rising"]
    blind = find(labels, fell, windows)[0].text
    assert "entropy moved -16% (0.500 -> 0.420 nats/token" in blind
    # a healthy run: MI holds, nothing about MI fires; the zero-variance rule needs no MI
    healthy = [est(0.9), est(0.9), est(0.88)]
    flat = [{**w, "frac_reward_zero_std": Window(0.0, None, 5)} for w in windows]
    assert find(labels, healthy, flat) == []
    # entropy that moved with the collapse: the dashboard did see it
    moving = [
        {**w, "entropy": Window(e, None, 5)} for w, e in zip(windows, (0.5, 0.3, 0.1), strict=True)
    ]
    assert "entropy_blind" not in [f.kind for f in find(labels, fell, moving)]


def test_a_run_with_a_log_shows_it_beside_the_diagnosis(tmp_path):
    """The demo run with a log whose reward rises and entropy stays: the findings name what
    the dashboard missed; reading the log changes no number of the scan."""
    log = tmp_path / "metrics.csv"
    rows = ["step,reward,entropy,frac_reward_zero_std"] + [
        f"{s},{0.3 + s / 1000},{0.5 - s / 10000},{s / 1000}" for s in range(10, 501, 10)
    ]
    log.write_text("\n".join(rows) + "\n")
    args = ["scan", str(RUN), "-p", str(PROMPTS), "-n", "8", "-k", "4", "--max-new-tokens", "48",
            "--device", "cpu", "--bootstrap", "100", "--out", str(tmp_path / "cache"),
            "--fail-on", "none", "--json", str(tmp_path / "run.json")]  # fmt: skip
    plot = tmp_path / "run.png"
    result = CliRunner().invoke(app, [*args, "--train-log", str(log), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "reward (log)" in result.output and "finding (entropy_blind)" in result.output
    # a piped console is wide enough for the table: every step's row is there, uncut
    rows = [re.search(rf"^\s*{s}00\s+│\s+-?[0-9.]+\s", result.output, re.M) for s in range(1, 6)]
    assert all(rows), result.output
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["training_log"]["keys"]["reward"] == "reward"
    assert run["steps"][0]["training_log"]["reward"]["n"] == 10
    assert {f["kind"] for f in run["findings"]} == {
        "entropy_blind", "reward_without_input", "zero_variance_rising",
    }  # fmt: skip
    plain_plot = tmp_path / "plain.png"
    plain = CliRunner().invoke(
        app,
        [*args, "--no-train-log", "--json", str(tmp_path / "p.json"), "--plot", str(plain_plot)],
    )
    # the plot gains the trainer's panel: three panels where the plain run has two
    width = matplotlib.image.imread(plot).shape[1]
    assert width > 1.3 * matplotlib.image.imread(plain_plot).shape[1]
    again = json.loads((tmp_path / "p.json").read_text())
    assert [s["report"]["metrics"] for s in again["steps"]] == [
        s["report"]["metrics"] for s in run["steps"]
    ]
    assert again["training_log"] is None and "--no-train-log" in again["training_log_reason"]
    assert plain.exit_code == 0
