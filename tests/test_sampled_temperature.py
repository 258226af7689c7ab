"""Rollouts scored at the temperature they were sampled at where their file does not say it
(SPEC "Traces the trainer sampled: their temperature"): --temperature, else the trainer's saved
configuration beside the rollouts or the checkpoint (saved by Hydra itself, run here as the
Hydra entry points of veRL, RAGEN and skyrl-train run it; prime-rl's and AReaL's as they write
theirs), else one warning naming the trainer's default and --temperature."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.rollouts import RolloutOptions, parse_rollouts
from collapsecheck.inputs.sampled_temperature import FLAG, UNSAID, sampled_temperature
from collapsecheck.inputs.trainer_configs import HYDRA_CONFIG
from collapsecheck.inputs.trainer_rollouts import RolloutFile
from collapsecheck.runs.pairing import RunRollouts
from collapsecheck.runs.plan import plan_run_rollouts
from collapsecheck.settings import Settings
from tests.conftest import EXAMPLES, HEALTHY, ROOT

DUMPS = ROOT / "tests" / "fixtures" / "trainer-dumps"
RAGEN = DUMPS / "ragen" / "val_rollouts_20261125_101500.jsonl"
DEMO_STEP = EXAMPLES / "demo-run" / "global_step_100"  # the policy that sampled VERL_ROLLOUTS
VERL_ROLLOUTS = ROOT / "tests" / "fixtures" / "verl-rollouts"  # steps 1, 2, by global_step_100
FAST = ["--device", "cpu", "--bootstrap", "200", "--fail-on", "none"]
RAGEN_WARNING = (
    "RAGEN validates at val_kwargs.temperature, 0.5 by default: pass --temperature 0.5 if they "
    "were sampled so"
)
runner = CliRunner()

HYDRA_APP = """\
import hydra


@hydra.main(version_base=None, config_path=".", config_name="trainer")
def main(cfg):
    pass


if __name__ == "__main__":
    main()
"""

# the keys RAGEN's config/base.yaml and eval.yaml give its rollouts, with one of its
# interpolations (es_manager's gen_config follows the rollout's temperature)
RAGEN_CONFIG = """\
actor_rollout_ref:
  rollout:
    temperature: 1
    val_kwargs:
      temperature: 0.5
      do_sample: true
es_manager:
  val:
    gen_config:
      temperature: ${actor_rollout_ref.rollout.temperature}
output:
  dir: results/eval
  format: jsonl
"""

# veRL's ppo_trainer.yaml keys for its two dump folders and their temperatures
VERL_CONFIG = """\
actor_rollout_ref:
  rollout:
    temperature: 0.8
    do_sample: true
    val_kwargs:
      temperature: ${actor_rollout_ref.rollout.val_temperature}
      do_sample: true
    val_temperature: 0.3
trainer:
  rollout_data_dir: outputs/rollout_data
  validation_data_dir: outputs/val_data
"""


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def hydra_saves(config: str, run_dir: Path, *overrides: str) -> Path:
    """A Hydra entry point composes `config` and, as every Hydra run does, saves it to
    `{hydra.run.dir}/.hydra/config.yaml` (unresolved); returns that file."""
    app_dir = run_dir.parent / f"{run_dir.name}-hydra-app"
    app_dir.mkdir(parents=True)
    (app_dir / "trainer.yaml").write_text(config)
    (app_dir / "main.py").write_text(HYDRA_APP)
    subprocess.run(
        [sys.executable, str(app_dir / "main.py"), f"hydra.run.dir={run_dir}", *overrides],
        check=True, capture_output=True, cwd=app_dir, timeout=120,
    )  # fmt: skip
    saved = run_dir / HYDRA_CONFIG
    assert saved.is_file()
    return saved


def plain_logprob(model, context, continuation, temperature):
    """The continuation's log-probability in one forward pass, the logits divided by the
    temperature (veRL's compute_log_prob)."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double() / temperature
    picked = torch.log_softmax(logits, -1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    return float(picked[len(context) - 1 :].sum())


def matrix_of(dump):
    with np.load(dump / "cross_logprobs.npz") as npz:
        return npz["sum"], npz["row_trace_index"]


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(HEALTHY, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ragen_at_half(tmp_path_factory, model):
    """RAGEN's export (the file its own writer wrote, scripts/make_ragen_trajectories.py), each
    response sampled afresh by the healthy demo policy at temperature 0.5, turn by turn in the
    conversation before it, as RAGEN's validation samples at val_kwargs.temperature 0.5."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(HEALTHY)
    torch.manual_seed(0)
    rows = [json.loads(line) for line in RAGEN.open()]
    for row in rows:
        messages = row["messages"]
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            text = tokenizer.apply_chat_template(
                messages[:index], add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(
                ids, do_sample=True, temperature=0.5, top_k=0, top_p=1.0, max_new_tokens=48,
            )  # fmt: skip
            message["content"] = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    folder = tmp_path_factory.mktemp("ragen") / "results" / "eval"
    folder.mkdir(parents=True)
    export = folder / RAGEN.name
    export.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return export


@pytest.fixture(scope="module")
def scored_with_flag(ragen_at_half, tmp_path_factory):
    dump = tmp_path_factory.mktemp("flag") / "dump"
    result = invoke("score", ragen_at_half, "-c", HEALTHY, "--temperature", "0.5", "--dump",
                    dump, *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    return result, dump


def test_a_ragen_export_sampled_at_half_is_scored_there_with_the_flag(scored_with_flag, model):
    result, dump = scored_with_flag
    report = json.loads((dump / "report.json").read_text())
    settings = report["settings"]
    assert settings["sampled_temperature"] == 0.5
    assert settings["sampled_temperature_source"] == FLAG
    assert settings["scoring_temperature"] == 0.5
    assert RAGEN_WARNING not in " ".join(result.output.split())
    prompts = [json.loads(line)["ids"] for line in (dump / "prompts.jsonl").open()]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    matrix, rows = matrix_of(dump)
    for r in (0, 7, -1):
        trace = traces[rows[r]]
        own = trace["prompt_index"]
        other = next(j for j in range(len(prompts)) if j != own and np.isfinite(matrix[r, j]))
        for j in (own, other):
            context = prompts[j] + trace["prefix_ids"]
            at_half = plain_logprob(model, context, trace["reasoning_ids"], 0.5)
            assert abs(matrix[r, j] - at_half) < 1e-4, (r, j)
            at_one = plain_logprob(model, context, trace["reasoning_ids"], 1.0)
            assert abs(at_half - at_one) > 1e-3  # another distribution: the test can tell


def test_with_nothing_to_say_it_one_warning_names_ragens_default(ragen_at_half, tmp_path):
    dump = tmp_path / "dump"
    result = invoke("score", ragen_at_half, "-c", HEALTHY, "--dump", dump, *FAST)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert said.count("nothing says the temperature these rollouts were sampled at") == 1
    assert f"(no {HYDRA_CONFIG} beside them or the checkpoint): scored at 1; " in said
    assert RAGEN_WARNING in said
    settings = json.loads((dump / "report.json").read_text())["settings"]
    assert settings["sampled_temperature_source"] == UNSAID
    assert settings["scoring_temperature"] == 1.0
    # a dump of rollouts whose temperature was assumed does not name it when scored again
    again = invoke("score", dump, "-c", HEALTHY, *FAST)
    assert "nothing says the temperature" in " ".join(again.output.split())


def test_hydras_saved_config_beside_the_export_gives_it(ragen_at_half, scored_with_flag, tmp_path):
    export = tmp_path / "results" / "eval" / ragen_at_half.name
    export.parent.mkdir(parents=True)
    shutil.copy(ragen_at_half, export)
    saved = hydra_saves(RAGEN_CONFIG, tmp_path)  # hydra.run.dir: the folder the export is in
    assert "${actor_rollout_ref.rollout.temperature}" in saved.read_text()  # saved unresolved
    dump = tmp_path / "dump"
    result = invoke("score", export, "-c", HEALTHY, "--dump", dump, *FAST)
    assert result.exit_code == 0, result.output
    key = "actor_rollout_ref.rollout.val_kwargs.temperature"
    assert f"rollouts sampled at temperature 0.5, as {saved} ({key}) says" in " ".join(
        result.output.split()
    )
    settings = json.loads((dump / "report.json").read_text())["settings"]
    assert settings["sampled_temperature_source"] == f"{saved} ({key})"
    assert settings["scoring_temperature"] == 0.5
    flagged, _ = matrix_of(scored_with_flag[1])
    assert np.array_equal(matrix_of(dump)[0], flagged, equal_nan=True)
    # the flag still wins, and says what the config said
    other = invoke("score", export, "-c", HEALTHY, "--temperature", "0.7", *FAST)
    assert f"--temperature 0.7 is used, though {saved} ({key}) says 0.5" in " ".join(
        other.output.split()
    )


def test_rows_that_name_another_temperature_refuse_the_flag(tmp_path):
    rows = [json.loads(line) for line in (VERL_ROLLOUTS / "1.jsonl").open()]
    named = tmp_path / "named.jsonl"
    named.write_text("".join(
        json.dumps({"prompt": r["input"], "response": r["output"], "temperature": 0.7}) + "\n"
        for r in rows
    ))  # fmt: skip
    result = invoke("score", named, "-c", HEALTHY, "--temperature", "0.5", *FAST)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"error: --temperature 0.5: {named} names 0.7 as the temperature its responses were "
        "sampled at (drop --temperature, or score other rollouts)"
    ]
    agreeing = sampled_temperature(named, parse(named), 0.7, None)
    assert (agreeing.value, agreeing.source) == (0.7, "the rollouts' rows")


def parse(path):
    return parse_rollouts(path, RolloutOptions())


def verl_run(tmp_path, config=VERL_CONFIG, *overrides):
    """A veRL run folder: the Hydra config main_ppo saved, its rollout and validation dumps."""
    run = tmp_path / "verl-run"
    for folder in ("rollout_data", "val_data"):
        shutil.copytree(VERL_ROLLOUTS, run / "outputs" / folder)
    hydra_saves(config, run, *overrides)
    return run


def test_verls_config_gives_its_training_and_its_validation_temperature(tmp_path):
    run = verl_run(tmp_path)
    training = run / "outputs" / "rollout_data" / "1.jsonl"
    validation = run / "outputs" / "val_data" / "1.jsonl"
    saved = run / HYDRA_CONFIG
    at = sampled_temperature(training, parse(training), None, None)
    assert (at.value, at.keyed, at.warnings) == (0.8, True, ())
    assert at.source == f"{saved} (actor_rollout_ref.rollout.temperature)"
    val = sampled_temperature(validation, parse(validation), None, None)
    assert val.value == 0.3  # its ${...} followed to the key it names
    assert val.source == f"{saved} (actor_rollout_ref.rollout.val_kwargs.temperature)"


def test_verls_greedy_validation_is_temperature_zero(tmp_path):
    run = verl_run(tmp_path, VERL_CONFIG, "actor_rollout_ref.rollout.val_kwargs.do_sample=false")
    validation = run / "outputs" / "val_data" / "2.jsonl"
    val = sampled_temperature(validation, parse(validation), None, None)
    assert val.value == 0.0
    assert val.source.endswith("(actor_rollout_ref.rollout.val_kwargs.do_sample)")


def test_a_config_above_the_checkpoint_is_read_too(tmp_path):
    run = verl_run(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "3.jsonl"
    elsewhere.parent.mkdir()
    shutil.copy(VERL_ROLLOUTS / "1.jsonl", elsewhere)
    checkpoint = run / "global_step_1" / "actor" / "huggingface"
    checkpoint.mkdir(parents=True)
    assert sampled_temperature(elsewhere, parse(elsewhere), None, None).source == UNSAID
    found = sampled_temperature(elsewhere, parse(elsewhere), None, checkpoint)
    assert found.value == 0.8 and found.source.startswith(str(run / HYDRA_CONFIG))


def test_a_value_only_running_the_trainer_resolves_is_said_not_guessed(tmp_path):
    config = VERL_CONFIG.replace("temperature: 0.8", "temperature: ${oc.env:ROLLOUT_T,0.9}")
    run = verl_run(tmp_path, config)
    training = run / "outputs" / "rollout_data" / "1.jsonl"
    at = sampled_temperature(training, parse(training), None, None)
    assert at.value == 1.0 and at.source == UNSAID
    (warning,) = at.warnings
    assert "actor_rollout_ref.rollout.temperature is '${oc.env:ROLLOUT_T,0.9}', which only " in (
        warning
    )
    assert warning.endswith(
        "scored at 1; veRL samples at actor_rollout_ref.rollout.temperature, 1.0 by default: "
        "pass --temperature T if they were sampled at another"
    )


def test_a_runs_rollouts_take_the_config_and_key_the_cache_by_it(tmp_path):
    run = verl_run(tmp_path)
    rows = [RunCheckpoint("global_step_1", 1, require_checkpoint(DEMO_STEP))]
    folder = run / "outputs" / "rollout_data"
    files = [RolloutFile(s, folder / f"{s}.jsonl", "verl", s - 1) for s in (1, 2)]
    found = RunRollouts(folder, files)
    settings = Settings.build(device="cpu")
    plan = plan_run_rollouts(found, rows, settings, cache=tmp_path / "cache")
    saved = run / HYDRA_CONFIG
    assert f"rollouts sampled at temperature 0.8, as {saved} " in plan.notes[-1]
    assert all(u.traces.sampled.value == 0.8 for u in plan.units)
    told = plan_run_rollouts(
        found, rows, Settings.build(device="cpu", temperature=0.8), cache=tmp_path / "cache"
    )
    other = plan_run_rollouts(
        found, rows, Settings.build(device="cpu", temperature=0.5), cache=tmp_path / "cache"
    )
    # the same temperature from the config or the flag: one cache entry; another: another
    assert [u.dump for u in told.units] == [u.dump for u in plan.units]
    assert {u.dump for u in other.units}.isdisjoint(u.dump for u in plan.units)


def test_unset_temperature_keys_the_caches_as_one():
    assert Settings().numbers() == Settings.build(temperature=1.0).numbers()
    assert Settings().sampling_key() == Settings.build(temperature=1).sampling_key()
    assert Settings().numbers() != Settings.build(temperature=0.5).numbers()
    assert Settings().sampling.sampling_temperature == 1.0


# -- every other trainer: its own files, its own keys -----------------------------------------

# skyrl-train's ppo_base_config.yaml keys of its two kinds of sampling
SKYRL_CONFIG = """\
generator:
  sampling_params:
    temperature: 0.9
    top_p: 1.0
  eval_sampling_params:
    temperature: 0.6
trainer:
  export_path: ${trainer.run_dir}/exports
  run_dir: .
"""


def test_skyrl_trains_and_evaluates_at_its_own_keys(tmp_path):
    shutil.copytree(DUMPS / "skyrl", tmp_path / "skyrl")
    saved = hydra_saves(SKYRL_CONFIG, tmp_path / "skyrl")  # hydra.run.dir: the export path
    evals = tmp_path / "skyrl" / "dumped_evals" / "global_step_2_evals"
    batch = tmp_path / "skyrl" / "dumped_data" / "global_step_2_training_input.pkl"
    at_eval = sampled_temperature(evals, parse(evals), None, None)
    assert at_eval.value == 0.6
    assert at_eval.source == f"{saved} (generator.eval_sampling_params.temperature)"
    at_training = sampled_temperature(batch, parse(batch), None, None)
    assert at_training.value == 0.9
    assert at_training.source == f"{saved} (generator.sampling_params.temperature)"


def prime_rl_run(tmp_path, config_name, config_text):
    """prime-rl's run folder: its rollouts as the file monitor writes them, and the resolved
    orchestrator config the `rl` launcher writes beside them in configs/."""
    run = tmp_path / "prime-run"
    shutil.copytree(DUMPS / "prime-rl" / "rollouts", run / "rollouts")
    step = run / "rollouts" / "step_5"
    shutil.copytree(step / "train", step.parent / "step_6" / "eval")  # an evaluation's traces
    (run / "configs").mkdir()
    (run / "configs" / config_name).write_text(config_text)
    return run


def test_prime_rls_orchestrator_config_json_and_toml(tmp_path):
    config = {
        "train": {"sampling": {"temperature": 0.7, "max_tokens": 64}},
        "eval": {"sampling": {"temperature": None}},
    }
    run = prime_rl_run(tmp_path, "orchestrator.json", json.dumps(config, indent=2))
    train = run / "rollouts" / "step_5"
    at = sampled_temperature(train, parse(train), None, None)
    assert (at.value, at.source) == (0.7, f"{run}/configs/orchestrator.json (train.sampling"
                                          ".temperature)")  # fmt: skip
    evaluation = run / "rollouts" / "step_6"
    unsaid = sampled_temperature(evaluation, parse(evaluation), None, None)
    assert unsaid.source == UNSAID  # null: the inference server's default, not known here
    assert "sets none of eval.sampling.temperature" in unsaid.warnings[0]
    assert "else at the inference server's default: pass --temperature T" in unsaid.warnings[0]
    older = prime_rl_run(tmp_path / "older", "orchestrator.toml", "[sampling]\ntemperature = 0.4\n")
    step = older / "rollouts" / "step_5" / "train" / "effective" / "traces.jsonl"
    assert sampled_temperature(step, parse(step), None, None).value == 0.4


def test_areals_trial_config_gives_training_and_evaluation(tmp_path):
    trial = tmp_path / "logs" / "user" / "experiment" / "trial"
    shutil.copytree(DUMPS / "areal" / "rollout", trial / "rollout")
    shutil.copytree(DUMPS / "areal" / "rollout", trial / "eval-rollout")
    # as AReaL's save_config writes the resolved experiment config (yaml of its dataclasses)
    (trial / "config.yaml").write_text(
        "experiment_name: experiment\ntrial_name: trial\ngconfig:\n  n_samples: 4\n"
        "  temperature: 0.85\n  max_new_tokens: 64\neval_gconfig: null\n"
    )
    training = trial / "rollout" / "4" / "0.jsonl"
    evaluation = trial / "eval-rollout" / "5"
    assert sampled_temperature(training, parse(training), None, None).value == 0.85
    at_eval = sampled_temperature(evaluation, parse(evaluation), None, None)
    assert at_eval.value == 0.85  # eval_gconfig unset: gconfig's, as AReaL copies it
    assert at_eval.source == f"{trial / 'config.yaml'} (gconfig.temperature)"


@pytest.mark.parametrize(
    "path, default",
    [
        (ROOT / "tests" / "fixtures" / "trl-grpo-completions" / "completions"
         / "completions_00002.parquet",
         "trl saves no configuration that can be read without running code): scored at 1; TRL "
         "samples at GRPOConfig.temperature, 1.0 by default (its training_args.bin is a "
         "pickle, left unread): pass --temperature T if they were sampled at another"),
        (DUMPS / "slime" / "rollout_data" / "eval_3.pt",
         "scored at 1; slime evaluates at --eval-temperature (or its --eval-config's), else at "
         "--rollout-temperature, 1.0 by default: pass --temperature T"),
        (RAGEN, RAGEN_WARNING),
    ],
)  # fmt: skip
def test_where_nothing_says_it_the_warning_names_the_trainers_default(path, default):
    at = sampled_temperature(path, parse(path), None, None)
    assert (at.value, at.source, at.keyed) == (1.0, UNSAID, False)
    (warning,) = at.warnings
    assert warning.startswith(f"{path}: nothing says the temperature these rollouts were sampled")
    assert default in warning
