"""Start-up (docs/decisions.md, "Start-up"): `--help`, `--version`, `spec`, a mistake in the
arguments, an output that cannot be written and a rerun answered wholly from the results cache
import none of torch, transformers, vLLM or scipy. Each case is run in a fresh process under
`python -X importtime`, whose trace names every module the process imported, so the next eager
import of a model library fails here, not on a user's CI gate."""

import shutil

import pytest

import collapsecheck
from collapsecheck.inputs.baseline import LOAD_RECORD_KEYS, same_tokenizer_files
from collapsecheck.inputs.formats.huggingface import TEXT_READ_FAMILIES
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS, run_collapsecheck
from tests.test_headline import SHIPPED, headline_command

MODEL_LIBRARIES = {"torch", "transformers", "vllm"}
HEAVY = MODEL_LIBRARIES | {"scipy"}
ROLLOUTS = EXAMPLES / "rollouts" / "gridworld.jsonl"


def imported(trace: str) -> set[str]:
    """The top-level packages a `-X importtime` trace names."""
    names = set()
    for line in trace.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            module = line.rsplit("|", 1)[1].strip()
            if module != "package":  # the trace's header line
                names.add(module.split(".")[0])
    return names


def traced(*args, cwd=None):
    """Run the command line with an import trace: its result, and what it imported."""
    where = {"cwd": cwd} if cwd is not None else {}
    result = run_collapsecheck(*args, python=("-X", "importtime"), **where)
    return result, imported(result.stderr)


def said(result) -> str:
    """What the command said on stderr, without the import trace."""
    return " ".join(
        line for line in result.stderr.splitlines() if not line.startswith("import time:")
    )


@pytest.mark.parametrize(
    "args, answer",
    [
        (["--help"], "Usage"),
        (["--version"], "collapsecheck "),
        (["spec"], "# collapsecheck"),
    ],
)
def test_help_version_and_spec_load_no_model_library(args, answer):
    result, modules = traced(*args)
    assert result.returncode == 0, said(result)
    assert answer in result.stdout
    assert not modules & HEAVY, sorted(modules & HEAVY)
    assert "collapsecheck" in modules and "typer" in modules  # the trace is read


def argument_and_output_errors(tmp_path):
    """(arguments, what the one line must say) for mistakes a user makes at the start."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    scan = ["scan", HEALTHY, "-p", PROMPTS]
    return [
        (["scan", HEALTHY, "-n", "-3"], "--num-prompts must be at least 2"),
        ([*scan, "--backend", "nope"], "--backend must be one of"),
        ([*scan, "--fail-on", "nope"], "--fail-on: unknown regime nope"),
        ([*scan, "--json", a_file / "r.json"], f"cannot write there ({a_file} is a file)"),
        ([*scan, "--html", a_file / "page.html"], "--html"),
        ([*scan, "--out", a_file / "cache"], "--out"),
        (["scan", tmp_path / "no-checkpoint", "-p", PROMPTS], "checkpoint not found"),
        (["scan", HEALTHY], "--prompts FILE is needed"),
        (["scan", EXAMPLES / "demo-run", "-p", PROMPTS, "--plot", a_file / "p.png"], "--plot"),
        (["scan", HEALTHY, "--env", "frozenlake", "--json", a_file / "r.json"], "--json"),
        (["score", ROLLOUTS, "--checkpoint", HEALTHY, "--json", a_file / "r.json"], "--json"),
        (["compare", HEALTHY, COLLAPSED, "-p", PROMPTS, "--json", a_file / "r.json"], "--json"),
        (["watch", EXAMPLES / "demo-run", "-p", PROMPTS, "--json", a_file / "r.json"], "--json"),
    ]


def test_argument_and_output_errors_load_no_model_library(tmp_path):
    for args, message in argument_and_output_errors(tmp_path):
        result, modules = traced(*args)
        words = said(result)
        assert result.returncode == 2, (args, words)
        assert message in words, (args, words)
        assert "Traceback" not in words
        assert not modules & HEAVY, (args, sorted(modules & HEAVY))


def test_a_cached_rerun_of_a_run_loads_no_model_library(tmp_path):
    """The README's headline run (11 checkpoints and its baseline), every answer in the
    results cache the repository ships: the table, the findings, the gate and the plot, with
    no model library and no scipy."""
    args = [a for a in headline_command() if a != "--html" and a != "run.html"]
    (tmp_path / "examples").mkdir()
    for child in EXAMPLES.iterdir():
        if child != SHIPPED:
            (tmp_path / "examples" / child.name).symlink_to(child)
    shutil.copytree(SHIPPED, tmp_path / "examples" / SHIPPED.name)
    result, modules = traced(*args, cwd=tmp_path)
    words = " ".join(said(result).split()) + " ".join(result.stdout.split())
    assert result.returncode == 1, words  # the gate fails on the collapsed last step
    assert "11 of 11 checkpoints answered from the cache" in words
    assert "finding (entropy_blind)" in words
    assert (tmp_path / "run.png").stat().st_size > 10_000
    assert not modules & HEAVY, sorted(modules & HEAVY)
    assert "numpy" in modules and "matplotlib" in modules  # the trace sees what the run uses


def test_the_package_names_its_api_without_importing_it():
    result, modules = traced("--version")
    assert result.returncode == 0
    assert not modules & {"numpy"}, "collapsecheck's own import loads numpy"
    assert sorted(collapsecheck.__all__) == sorted(["__version__", *collapsecheck._EXPORTS])
    for name in collapsecheck._EXPORTS:
        assert getattr(collapsecheck, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        collapsecheck.nope  # noqa: B018


def test_the_text_read_classes_are_the_ones_transformers_names():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for model_type, reader in TEXT_READ_FAMILIES.items():
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type] == reader


def tokenizer_copy(source, target, **config_changes):
    import json

    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.update(config_changes)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_the_same_tokenizer_files_are_known_without_loading_them(tmp_path):
    same = tokenizer_copy(HEALTHY, tmp_path / "same")
    assert same_tokenizer_files(HEALTHY, same)
    recorded = tokenizer_copy(HEALTHY, tmp_path / "recorded", **dict.fromkeys(LOAD_RECORD_KEYS, 1))
    assert same_tokenizer_files(HEALTHY, recorded)
    # anything else that differs is left to the vocabularies' own comparison
    other = tokenizer_copy(HEALTHY, tmp_path / "other", model_max_length=7)
    assert not same_tokenizer_files(HEALTHY, other)
    (same / "vocab.json").write_text("{}")
    assert not same_tokenizer_files(HEALTHY, same)  # a file only one of them holds
    assert not same_tokenizer_files(tmp_path / "other", tmp_path / "nothing-here")
