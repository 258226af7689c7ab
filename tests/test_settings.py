"""Settings: one typed group per concern, flags named like fields, a cache key made of the
settings that change the numbers, the backend registry, --debug."""

import dataclasses

import pytest
from typer.testing import CliRunner

from collapsecheck import scan
from collapsecheck.cli import app
from collapsecheck.engines.backends.registry import BACKENDS, SCORER_NAMES, scorer_backend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.runs.run import cached_scan
from collapsecheck.setting_checks import checked
from collapsecheck.settings import GROUPS, LoadSettings, Settings
from tests.conftest import HEALTHY, PROMPTS

FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 100}


def test_flat_flags_land_in_their_groups():
    settings = Settings.build(k=3, device="cpu", seed=7, negatives=2, as_chat=True)
    assert settings.sampling.k == 3
    assert settings.load.device == "cpu"
    assert settings.analysis.seed == 7
    assert settings.scoring.negatives == 2
    assert settings.prompts.as_chat is True


def test_flag_names_are_unique_across_groups():
    names = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(names) == len(set(names))


def test_an_unknown_setting_fails_at_the_top_naming_it():
    with pytest.raises(CollapsecheckError, match="unknown setting kk"):
        scan(HEALTHY, PROMPTS, kk=4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"dtype": "float8"}, "--dtype must be one of"),
        ({"scorer": "fast"}, "--scorer must be one of"),
        ({"backend": "sglang"}, "--backend must be one of"),
        ({"batch_tokens": "lots"}, "--batch-tokens must be auto or a number"),
        ({"batch_tokens": 0}, "--batch-tokens must be at least 1"),
        ({"device": "gpu"}, "--device must be auto, cpu or cuda"),
        ({"negatives": 0}, "--negatives must be at least 1"),
        ({"num_prompts": 1}, "--num-prompts must be at least 2"),
        ({"bootstrap": -1}, "--bootstrap must be >= 0"),
        ({"reasoning_tags": "a,b", "whole_response": True}, "choose one of"),
        ({"reasoning_regex": "(a)(b)"}, "at most one capture group"),
    ],
)
def test_bad_values_are_refused_before_any_model_loads(flags, message):
    """A value wrong on its own fails where its dataclass is built; a name that only a
    registry knows (a backend, a scorer, a reasoning spec) fails in `checked`, which the CLI
    and the API run before they load anything."""
    with pytest.raises(CollapsecheckError, match=message):
        checked(Settings.build(**flags))


def test_a_name_the_registry_does_not_know_fails_in_the_cli_before_loading():
    result = CliRunner().invoke(app, ["scan", str(HEALTHY), "-p", str(PROMPTS), "--scorer", "x"])
    assert result.exit_code == 2
    assert "--scorer must be one of auto, cached, naive, vllm, got 'x'" in result.output
    assert "sampling" not in result.output


def test_only_settings_that_change_numbers_key_the_cache():
    base = Settings.build(**FAST).numbers()
    for harmless in (
        {"batch_tokens": 64},
        {"sample_batch": 3},
        {"gpu_memory_utilization": 0.5},
        {"tensor_parallel_size": 2},
        {"trust_remote_code": True},
    ):
        assert Settings.build(**FAST, **harmless).numbers() == base, harmless
    for changing in ({"seed": 1}, {"k": 5}, {"temperature": 0.7}, {"dtype": "bfloat16"}):
        assert Settings.build(**{**FAST, **changing}).numbers() != base, changing
    assert base["numbers_version"] >= 1


def test_only_settings_that_change_the_traces_key_the_samples():
    base = Settings.build(**FAST).sampling_key()
    for scoring_only in (
        {"whole_response": True},
        {"negatives": 3},
        {"no_flow": True},
        {"bootstrap": 50},
        {"scorer": "naive"},
        {"snr_top_p": 0.5},
        {"sample_batch": 3},
    ):
        assert Settings.build(**{**FAST, **scoring_only}).sampling_key() == base, scoring_only
    for changing in (
        {"seed": 1}, {"k": 5}, {"temperature": 0.7}, {"top_p": 0.9}, {"max_new_tokens": 9},
        {"dtype": "bfloat16"}, {"as_chat": True}, {"system_prompt": "x"},
        {"chat_template_kwargs": '{"enable_thinking": true}'}, {"num_prompts": 3},
    ):  # fmt: skip
        assert Settings.build(**{**FAST, **changing}).sampling_key() != base, changing


def test_a_batch_flag_reuses_the_cache_and_a_seed_does_not(tmp_path):
    from collapsecheck.inputs.checkpoint import require_checkpoint

    checkpoint = require_checkpoint(HEALTHY)
    first = cached_scan(checkpoint, PROMPTS, cache_root=tmp_path, **FAST)
    assert not first.timing.get("cached")
    batched = cached_scan(
        checkpoint, PROMPTS, cache_root=tmp_path, batch_tokens=512, sample_batch=2, **FAST
    )
    assert batched.timing.get("cached") is True
    assert batched.metrics == first.metrics
    reseeded = cached_scan(checkpoint, PROMPTS, cache_root=tmp_path, seed=3, **FAST)
    assert not reseeded.timing.get("cached")
    assert not reseeded.timing.get("samples_reused")  # the seed changes the traces too
    assert len([p for p in tmp_path.iterdir() if p.name != "samples"]) == 2
    assert len(list((tmp_path / "samples").iterdir())) == 2


def test_every_scorer_has_one_backend_and_every_backend_loads():
    assert {scorer_backend(s) for s in SCORER_NAMES} == set(BACKENDS)
    for entry in BACKENDS.values():
        backend = entry.load()  # imports the module, not the engine: vLLM need not be here
        assert callable(backend.from_checkpoint) and callable(backend.close)


def test_the_backend_of_a_python_call_builds_from_load_settings():
    from collapsecheck.engines.backends.hf import TransformersBackend

    backend = TransformersBackend.from_checkpoint(HEALTHY, LoadSettings(device="cpu"), "naive")
    assert backend.describe()["scorer"] == "naive"
    backend.close()
    assert backend.model is None


def test_help_groups_the_options_by_concern():
    result = CliRunner().invoke(app, ["scan", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    for heading in ("Sampling", "Prompts", "Reasoning and scoring", "Model and engine", "Gate"):
        assert heading in result.output
    assert "--batch-tokens" in result.output and "--samples" in result.output
    # a repeatable option's value is named for what it is, not by its Python type
    assert "--env-arg" in result.output and "--train-key" in result.output
    assert "list[" not in result.output


def test_debug_prints_the_traceback_of_a_wrapped_error(tmp_path):
    broken = tmp_path / "ckpt"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((HEALTHY / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    args = ["scan", str(broken), "-p", str(PROMPTS), "--device", "cpu"]
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 2
    assert "could not load the model weights" in plain.output
    assert "Traceback" not in plain.output
    debug = CliRunner().invoke(app, ["--debug", *args])
    assert debug.exit_code == 2
    assert "Traceback (most recent call last)" in debug.output
    assert "could not load the model weights" in debug.output
