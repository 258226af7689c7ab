"""The GRPO demo run, written by TRL 1.16's own GRPOTrainer (scripts/make_grpo_run.py): its
checkpoints and trainer_state.json files read as TRL wrote them, and the three findings of SPEC
"Training logs beside the diagnosis" where they hold."""

import pytest

from collapsecheck.inputs.discovery import find_checkpoints
from collapsecheck.inputs.training_logs import read_log
from collapsecheck.runs.run import scan_run
from tests.conftest import EXAMPLES, PROMPTS, ROOT

GRPO = EXAMPLES / "grpo-run"
BASELINE = EXAMPLES / "demo-run" / "global_step_200"  # where the GRPO run started
REWARD = EXAMPLES / "rewards" / "gridworld.py"


def test_trl_wrote_a_run_with_its_log_in_every_checkpoint():
    _, checkpoints = find_checkpoints(GRPO)
    assert [c.step for c in checkpoints] == list(range(20, 201, 20))
    log = read_log(GRPO / "checkpoint-200" / "trainer_state.json")
    assert {"reward", "entropy", "frac_reward_zero_std", "rewards/deliberate_phrasing/mean"} <= set(
        log.points
    )
    assert [step for step, _ in log.series("reward")] == list(range(5, 201, 5))


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """The run scanned from its baseline at the first, the next-to-last and the last
    checkpoint: the first and last windows are those of the full run."""
    _, checkpoints = find_checkpoints(GRPO)
    chosen = [c for c in checkpoints if c.step in (20, 180, 200)]
    log = read_log(GRPO / "checkpoint-200" / "trainer_state.json")
    return scan_run(
        GRPO, PROMPTS, checkpoints=chosen, baseline=BASELINE, reward_fn=str(REWARD),
        training_log=log,
        train_keys={"shortcut": "rewards/deliberate_phrasing/mean"},
        cache_root=tmp_path_factory.mktemp("cache"), num_prompts=16, k=8, max_new_tokens=64,
        device="cpu", bootstrap=200, no_flow=True,
    )  # fmt: skip


def test_the_dashboard_missed_what_the_scan_sees(grpo_run):
    assert [f.kind for f in grpo_run.findings] == [
        "entropy_blind", "reward_without_input", "zero_variance_rising",
    ]  # fmt: skip
    first, last = grpo_run.steps[1], grpo_run.steps[-1]
    # the trainer's entropy held still while input dependence went
    assert abs(last.training_log["entropy"].mean / first.training_log["entropy"].mean - 1) < 0.25
    assert last.report.metrics["normalized_mi"].high < 0.1
    assert grpo_run.steps[0].report.verdict.regime == "grounded"
    # the shortcut's own series, named with --train-key, is shown beside the others
    assert grpo_run.logged_series == ["reward", "entropy", "shortcut"]
    assert last.training_log["shortcut"].mean > 0.95


CONTROL = ROOT / "tests" / "fixtures" / "trl-grpo-task-only"


def test_a_trl_output_dir_after_save_model_is_a_run_with_its_log(tmp_path):
    """TRL's output_dir as users leave it (written by GRPOTrainer: checkpoint-30/, checkpoint-60/
    and `trainer.save_model(output_dir)`): a run whose last row is the root's model, its log
    found in the highest step's trainer_state.json (the root has none)."""
    notes = []
    single, checkpoints = find_checkpoints(CONTROL, notes=notes)
    assert single is None and [c.step for c in checkpoints] == [30, 60, None]
    assert any("holds 2 step checkpoints" in note for note in notes)
    run = scan_run(
        CONTROL, PROMPTS, checkpoints=checkpoints, cache_root=tmp_path, num_prompts=8, k=4,
        max_new_tokens=48, device="cpu", bootstrap=100, no_flow=True,
    )  # fmt: skip
    assert run.training_log["source"].endswith("checkpoint-60/trainer_state.json")
    assert run.steps[1].training_log["reward"].n == 6  # steps 35..60, logged every 5
    assert run.steps[-1].training_log == {}  # the root's model has no step: no window
    # the root's model is the model of the last step: the same numbers
    for key in ("normalized_mi", "retrieval_accuracy", "conditional_entropy_est"):
        assert run.steps[-1].report.metrics[key] == run.steps[-2].report.metrics[key]
