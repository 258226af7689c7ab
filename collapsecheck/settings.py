"""Settings: one typed, frozen dataclass per concern, each field named like its CLI flag.

    LoadSettings      what to load, on which engine, in what memory
    SamplingSettings  how to sample (scan, compare)
    PromptSettings    how prompts are read and rendered
    ScoringSettings   what is scored: the reasoning segment, the negatives
    AnalysisSettings  the seed and the bootstrap
    RewardSettings    where rewards come from, and the SNR filter
    OutputSettings    what a command writes (none changes the numbers)
    WatchSettings     how `watch` follows a run that is still training

Every field's metadata says whether it changes the numbers (`numbers`); only those fields
key the results cache (`Settings.numbers`), together with NUMBERS_VERSION and SAMPLES_VERSION
(sampled traces are part of the numbers; a trainer's rollouts drop both the sampling group and
SAMPLES_VERSION). Those that change the sampled traces (`samples`: the engine, what is
sampled and how, the prompts' rendering, the seed) key the samples cache alone
(`Settings.sampling_key`), with SAMPLES_VERSION: a scan that differs only in what it scores
re-scores the traces already sampled. The CLI builds its options from these fields
(`collapsecheck.cli`), so a flag is declared once, here.

This module is the floor: it imports nothing of the package but its errors. It checks what a
value is on its own (a number's range, flags that exclude each other) where a dataclass is
built; the layers that own a set of names check a value against them when they use it
(`collapsecheck.setting_checks`: backend and scorer names, reasoning and action specs), still
before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError

# Bump when a code change alters the numbers of a scan whose settings are unchanged: the
# results cache then recomputes instead of answering with stale numbers.
NUMBERS_VERSION = 6
# Bump when a code change alters the traces sampled with unchanged settings.
SAMPLES_VERSION = 2  # 2: tokens drawn by inverse CDF from uniforms drawn up front (issue 57)

AUTO = "auto"
ALL = "all"
# a bare --ray: what ray.init() does with no address (RAY_ADDRESS, else a cluster running on
# this machine, else a new local one)
RAY_DEFAULT = "default"
SCAN, SCORE, COMPARE, WATCH = "scan", "score", "compare", "watch"
SAMPLING_COMMANDS = (SCAN, COMPARE, WATCH)
ENV_COMMANDS = (SCAN, WATCH, COMPARE)  # the commands that play checkpoints in an environment
# --negatives auto: each trace under its own prompt and 15 others, each action with
# SWAPS_PER_NEGATIVE x 15 swapped traces beside its own prompt's (SPEC "Sampled negatives and
# swaps"); up to 16 prompts, the X->Z matrix is full. docs/benchmarks.md measures the
# agreement with the full matrices.
DEFAULT_NEGATIVES = 15
# swapped traces per action for each of the M negatives: the action marginals they estimate
# need more draws than the reasoning's (docs/decisions.md)
SWAPS_PER_NEGATIVE = 2
# SPEC "Early answering": the fractions of the reasoning after which the action is forced
EARLY_FRACTIONS = "0,0.25,0.5,0.75,1"
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's strategies
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# --sample-batch auto: at most this many sequences decoded together, fewer where the memory
# says so. CPU: the rate flattens from 64 rows and peaks at 128 (docs/benchmarks.md, "A real
# pretrained model"); GPU: not measured, a bound that the memory fit usually undercuts.
SAMPLE_BATCH_CAP = {"cpu": 128, "cuda": 512}


# `keyed_unset=UNKEYED`: a field added after caches were written is left out of their keys
# while it is unset, so every entry written before it stays valid
UNKEYED = "<unkeyed>"


def setting(
    default: Any, help: str, *, numbers: bool, samples: bool = False, flags: tuple[str, ...] = (),
    cli_type: Any = None, in_config: bool = False, commands: tuple[str, ...] | None = None,
    keyed_unset: Any = None, metavar: str | None = None,
) -> Any:  # fmt: skip
    """A settings field: its default, its --help text, whether it changes the numbers, whether
    it changes the sampled traces (`samples`: those key the samples cache), (where they
    differ from `--field-name`) its flags and the type the command line parses, whether
    the config file may set it (`in_config`: a key of the field's name stands in for the flag
    where the command line does not give it), the commands that offer it (None: every command
    that takes its group) and, for a field that may be left unset (None), the value it keys
    the caches as then (`keyed_unset`: the value a scan uses in its place, so that leaving it
    unset and giving that value share a cache entry) and what --help shows for its value
    (`metavar`; None: the type's name)."""
    meta = {
        "help": help, "numbers": numbers, "samples": samples, "flags": flags,
        "cli_type": cli_type, "in_config": in_config, "keyed_unset": keyed_unset,
        "metavar": metavar,
    }  # fmt: skip
    if commands is not None:
        meta["commands"] = commands
    return field(default=default, metadata=meta)


def output(
    help: str, *, commands: tuple[str, ...], directory: bool = False, flags: tuple[str, ...] = ()
) -> Any:
    """An output field: a path (None: not written), the commands that offer it, and whether
    it names a directory. Outputs never change the numbers."""
    return field(
        default=None,
        metadata={
            "help": help, "numbers": False, "flags": flags, "cli_type": None,
            "commands": commands, "directory": directory,
        },
    )  # fmt: skip


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CollapsecheckError(message)


def _at_least(value: int | float | None, minimum: int | float, name: str) -> None:
    if value is not None:
        _require(value >= minimum, f"{flag_name(name)} must be at least {minimum}, got {value}")


@dataclass(frozen=True)
class LoadSettings:
    """What to load: the engine, the device and dtype, and how the engine batches."""

    backend: str = setting(
        AUTO, "auto (vLLM when installed and on a GPU, else transformers), transformers or vllm.",
        numbers=True, samples=True,
    )  # fmt: skip
    scorer: str = setting(
        AUTO, "auto, cached or naive (transformers), vllm (prompt log-probabilities).",
        numbers=True,
    )  # fmt: skip
    device: str = setting("auto", "auto, cpu or cuda[:N].", numbers=True, samples=True)
    device_map: str | None = setting(
        None, "transformers: spread the model over the visible GPUs (auto, balanced, sequential; "
        "needs accelerate).", numbers=False,
    )  # fmt: skip
    dtype: str = setting("auto", "auto, float32, bfloat16 or float16.", numbers=True, samples=True)
    base_model: Path | None = setting(
        None, "Base model directory of a LoRA/PEFT adapter checkpoint.",
        numbers=False,  # its files are part of the checkpoint's fingerprint
    )  # fmt: skip
    trust_remote_code: bool = setting(
        False, "Run the model code a checkpoint ships.", numbers=False
    )
    trust_checkpoint_pickle: bool = setting(
        False, "Unpickle veRL shards that hold more than tensors (can run code).", numbers=False
    )
    batch_tokens: int | str = setting(
        AUTO, "Tokens per scoring batch (batch x length), or auto (fit the memory).",
        numbers=False, cli_type=str,
    )  # fmt: skip
    sample_batch: int | str = setting(
        AUTO, "Sequences decoded together while sampling, or auto (as many as fit the memory, "
        f"up to {SAMPLE_BATCH_CAP['cpu']} on CPU and {SAMPLE_BATCH_CAP['cuda']} on a GPU).",
        numbers=False, cli_type=str,
    )  # fmt: skip
    tensor_parallel_size: int = setting(1, "vLLM: GPUs to split the model over.", numbers=False)
    gpu_memory_utilization: float | None = setting(
        None, "vLLM: share of GPU (CPU build: host) memory to use.", numbers=False
    )
    max_model_len: int | None = setting(
        None, "vLLM: context length to allocate.",
        numbers=True, samples=True,  # decides which prompts fit, and where they are cut
    )  # fmt: skip

    def __post_init__(self) -> None:
        _require(
            DEVICE_PATTERN.fullmatch(self.device) is not None,
            f"--device must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        _require(
            self.dtype in DTYPES,
            f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}",
        )
        _require(
            self.device_map in (None, *DEVICE_MAPS),
            f"--device-map must be one of {', '.join(DEVICE_MAPS)}, got {self.device_map!r}",
        )
        object.__setattr__(self, "batch_tokens", _word_or_count(self.batch_tokens, "batch_tokens"))
        if self.base_model is not None:
            object.__setattr__(self, "base_model", Path(self.base_model))
        object.__setattr__(self, "sample_batch", _word_or_count(self.sample_batch, "sample_batch"))
        _at_least(self.tensor_parallel_size, 1, "tensor_parallel_size")
        _at_least(self.max_model_len, 1, "max_model_len")
        share = self.gpu_memory_utilization
        _require(
            share is None or 0 < share <= 1,
            f"--gpu-memory-utilization must be in (0, 1], got {share}",
        )


def swap_count(negatives: int | None) -> int | None:
    """Traces swapped into each action beside its own prompt's (None: every trace)."""
    return None if negatives is None else SWAPS_PER_NEGATIVE * negatives


def parse_fractions(
    value: tuple[float, ...] | str, flag: str = "--early-answer-fractions"
) -> tuple[float, ...]:
    """--early-answer-fractions (or the config file's value, `flag` naming where it was
    read): numbers in [0, 1], given as a list or comma-separated text, 0 and 1 among them
    (the curve runs from no reasoning to all of it); sorted, each once."""
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        numbers = sorted({float(item) for item in items})
    except (TypeError, ValueError):
        raise CollapsecheckError(f"{flag}: expected numbers in [0, 1], got {value!r}") from None
    _require(
        all(0 <= x <= 1 for x in numbers),
        f"{flag}: every fraction must be in [0, 1], got {value!r}",
    )
    _require(
        {0.0, 1.0} <= set(numbers),
        f"{flag} must include 0 and 1 (the curve runs from no reasoning to all of it), "
        f"got {value!r}",
    )
    return tuple(numbers)


def _word_or_count(value: int | str, name: str, words: tuple[str, ...] = (AUTO,)) -> int | str:
    """One of `words`, or a count of at least 1 (given as a number or its text)."""
    if value in words:
        return value
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise CollapsecheckError(
            f"{flag_name(name)} must be {' or '.join(words)} or a number, got {value!r}"
        ) from None
    _at_least(count, 1, name)
    return count


DEFAULT_SAMPLES = 8  # -k where it is not given


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample: SPEC "Sampling" (the policy's own distribution by default)."""

    k: int | None = setting(
        None, f"Samples per prompt (default {DEFAULT_SAMPLES}; --env ragen:TAG: RAGEN's "
        "validation group size).", numbers=True, samples=True, flags=("-k", "--samples"),
        commands=SAMPLING_COMMANDS, keyed_unset=DEFAULT_SAMPLES,
    )  # fmt: skip
    num_prompts: int | None = setting(
        None, "Use the first N prompts.", numbers=True, samples=True,
        flags=("--num-prompts", "-n"), commands=SAMPLING_COMMANDS,
    )  # fmt: skip
    max_new_tokens: int = setting(
        256, "Length limit per response.", numbers=True, samples=True, commands=SAMPLING_COMMANDS
    )
    temperature: float | None = setting(
        None, "The temperature the traces are sampled at (default 1). score, and a run's "
        "trainer rollouts: the one they were sampled at, where their rows do not name it "
        "(default: the trainer's saved config where one lies beside them, else 1, warned).",
        numbers=True, samples=True, keyed_unset=1.0,
    )  # fmt: skip
    top_p: float = setting(
        1.0, "Nucleus sampling threshold.", numbers=True, samples=True, commands=SAMPLING_COMMANDS
    )

    def __post_init__(self) -> None:
        _require(self.k is None or self.k >= 1, f"-k/--samples must be at least 1, got {self.k}")
        _at_least(self.num_prompts, 2, "num_prompts")
        _at_least(self.max_new_tokens, 1, "max_new_tokens")
        given = self.temperature
        _require(given is None or given >= 0, f"--temperature must be >= 0, got {given}")
        _require(0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def samples(self) -> int:
        """Samples per prompt: -k, else the default."""
        return DEFAULT_SAMPLES if self.k is None else self.k

    @property
    def sampling_temperature(self) -> float:
        """The temperature a scan samples at: --temperature, else 1."""
        return 1.0 if self.temperature is None else float(self.temperature)


@dataclass(frozen=True)
class PromptSettings:
    """How prompts are read and rendered (SPEC "Inputs")."""

    prompt_field: str | None = setting(
        None, "JSONL field holding the prompt (default prompt/messages).", numbers=True,
        samples=True,
    )  # fmt: skip
    as_chat: bool = setting(
        False, "Wrap plain-string prompts as one user message.", numbers=True, samples=True
    )
    system_prompt: str | None = setting(
        None, "Add this system message to prompts that have none.", numbers=True, samples=True
    )
    truncate_prompts: bool = setting(
        False, "Cut prompts too long for the model's context to their last tokens (reported).",
        numbers=True, samples=True,
    )  # fmt: skip
    chat_template_kwargs: dict[str, Any] | None = setting(
        None, 'Arguments for the chat template, as a JSON object: {"enable_thinking": true}.',
        numbers=True, samples=True, cli_type=str,
    )  # fmt: skip

    def __post_init__(self) -> None:
        value = self.chat_template_kwargs
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise CollapsecheckError(
                    f"--chat-template-kwargs: not valid JSON ({err.msg}): {value}"
                ) from None
        _require(
            value is None or isinstance(value, dict),
            f"--chat-template-kwargs must be a JSON object, got {self.chat_template_kwargs!r}",
        )
        object.__setattr__(self, "chat_template_kwargs", value)


@dataclass(frozen=True)
class ScoringSettings:
    """What is scored: the reasoning segment Z, and under how many prompts."""

    reasoning_tags: str | None = setting(
        None, "Reasoning between OPEN,CLOSE (default <think>,</think>).", numbers=True
    )
    reasoning_regex: str | None = setting(
        None, "Reasoning matched by a regex (its group 1 if any).", numbers=True
    )
    whole_response: bool = setting(False, "Score the whole response as reasoning.", numbers=True)
    negatives: int | str = setting(
        AUTO, f"M other prompts per trace ({SWAPS_PER_NEGATIVE}M swapped traces per action): M, "
        f"auto ({DEFAULT_NEGATIVES}) or all (the full matrices, quadratic in the batch).",
        numbers=True, cli_type=str,
    )  # fmt: skip
    action_tags: str | None = setting(
        None, "Action between OPEN,CLOSE (default <answer>,</answer>).", numbers=True
    )
    action_regex: str | None = setting(
        None, "Action matched by a regex after the reasoning (its group 1 if any).", numbers=True
    )
    action_after_reasoning: bool = setting(
        False, "The action is everything after the reasoning's close tag.", numbers=True
    )
    no_flow: bool = setting(
        False, "Skip the information flow (input -> reasoning -> action).", numbers=True
    )
    no_early_answer: bool = setting(
        False, "Skip early answering (each action scored after its reasoning cut short).",
        numbers=True,
    )  # fmt: skip
    no_token_information: bool = setting(
        False, "Skip where the input shows (each reasoning token's share of the information).",
        numbers=True,
    )  # fmt: skip
    state_regex: str | None = setting(
        None, "Agents across turns: the state in each observation, the regex's first group "
        "(default: the whole observation).", numbers=True, keyed_unset=UNKEYED,
    )  # fmt: skip
    early_answer_fractions: tuple[float, ...] | str = setting(
        EARLY_FRACTIONS, "Fractions of the reasoning after which the action is forced, "
        f"comma-separated, 0 and 1 among them (default {EARLY_FRACTIONS}, or the config "
        "file's early_answer_fractions).", numbers=True, cli_type=str, in_config=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for names in (
            ("reasoning_tags", "reasoning_regex", "whole_response"),
            ("action_tags", "action_regex", "action_after_reasoning", "no_flow"),
        ):
            given = [flag_name(name) for name in names if getattr(self, name)]
            _require(len(given) <= 1, f"choose one of {' and '.join(given)}, not both")
        object.__setattr__(
            self, "negatives", _word_or_count(self.negatives, "negatives", (AUTO, ALL))
        )
        object.__setattr__(
            self, "early_answer_fractions", parse_fractions(self.early_answer_fractions)
        )
        if self.state_regex is not None:
            try:
                re.compile(self.state_regex)
            except re.error as err:
                raise CollapsecheckError(f"--state-regex: invalid regex ({err})") from None

    @property
    def early_fractions(self) -> tuple[float, ...]:
        """The fractions of SPEC "Early answering"; none with --no-early-answer or --no-flow."""
        return () if self.no_early_answer or self.no_flow else self.early_answer_fractions  # type: ignore[return-value]

    @property
    def negatives_bound(self) -> int | None:
        """The M of SPEC "Sampled negatives and swaps"; None: the full matrices."""
        if self.negatives == ALL:
            return None
        return DEFAULT_NEGATIVES if self.negatives == AUTO else int(self.negatives)


@dataclass(frozen=True)
class AnalysisSettings:
    """The seed (of sampling, negatives, turn sampling and the bootstrap) and the bootstrap."""

    seed: int = setting(0, "Seed of sampling and bootstrap.", numbers=True, samples=True)
    bootstrap: int = setting(1000, "Bootstrap resamples.", numbers=True)

    def __post_init__(self) -> None:
        _require(self.bootstrap >= 0, f"--bootstrap must be >= 0, got {self.bootstrap}")


@dataclass(frozen=True)
class RewardSettings:
    """Where the rewards come from, and the SNR-aware filter (SPEC "Why: reward variance")."""

    reward_fn: str | None = setting(
        None, "scan: FILE.py[:NAME], a veRL-style compute_score(data_source, solution_str, "
        "ground_truth, extra_info) fed from the prompt rows.", numbers=True,
    )  # fmt: skip
    reward_field: str | None = setting(
        None, "score: the rollouts' reward field (default reward or score).", numbers=True
    )
    snr_top_p: float = setting(
        0.9, "SNR-aware filter: keep the prompts of highest reward std holding this share of the "
        "total.", numbers=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _require(0 < self.snr_top_p <= 1, f"--snr-top-p must be in (0, 1], got {self.snr_top_p}")


@dataclass(frozen=True)
class WatchSettings:
    """How `watch` follows a run that is still training (docs/runs.md "Watching a run")."""

    idle: float = setting(3600.0, "End (exit 0) after this many seconds with nothing new.",
                          numbers=False)  # fmt: skip
    until: Path | None = setting(
        None, "End (exit 0) once this file exists (one the trainer writes at its end) and every "
        "finished checkpoint is diagnosed.", numbers=False,
    )  # fmt: skip
    poll: float = setting(10.0, "Seconds between looks at the run.", numbers=False)
    settle: float = setting(
        30.0, "Seconds a checkpoint folder without its trainer's own last file must stay "
        "unchanged to count as complete.", numbers=False,
    )  # fmt: skip
    every_step: bool = setting(
        False, "Diagnose every waiting step in order (default: the newest first when the "
        "trainer is faster).", numbers=False,
    )  # fmt: skip
    stop_on_fail: bool = setting(
        False, "A failed gate rule ends the watch with exit 1.", numbers=False
    )
    on_fail: str | None = setting(
        None, "A shell command run once at the first failed gate rule, with COLLAPSECHECK_STEP, "
        "_CHECKPOINT, _RULE and _MESSAGE in its environment (scancel $SLURM_JOB_ID; touch a "
        "stop file the trainer polls).", numbers=False,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("idle", "poll", "settle"):
            _at_least(getattr(self, name), 0, name)
        if self.until is not None:
            object.__setattr__(self, "until", Path(self.until))


DEFAULT_STARTS = 16  # start states of `scan --env` where -n is not given


@dataclass(frozen=True)
class EnvSettings:
    """Agents across turns: the environment `scan --env` plays the checkpoint in (SPEC
    "Agents across turns"). -n start states (seeds --env-seed .. --env-seed + N - 1), -k
    episodes from each. Not part of `Settings`: a played scan's cache key adds them. The seed
    and turns left unset are the environment's adapter's to fill (`inputs.environments`:
    collapsecheck's defaults, or a framework's own config)."""

    env: str | None = setting(
        None, "Play episodes in this environment: ragen:TAG (RAGEN's own, as RAGEN plays it), "
        "a framework's as its trainer plays it (skyrl:ENV_ID, trl:FILE.py:CLASS, textarena:ID, "
        "gem:ID, openenv:FILE.py:CLASS, verifiers:ENV_ID), 'command:COMMAND' (any harness with an "
        "OpenAI client, answered by collapsecheck's endpoint), FILE.py:FACTORY, "
        "package.module:FACTORY or frozenlake (-n start states, -k episodes from each).",
        numbers=True, commands=ENV_COMMANDS,
    )  # fmt: skip
    env_arg: tuple[str, ...] = setting(
        (), "KEY=VALUE passed to the environment's factory (textarena:/gem: to the framework's "
        "make, openenv: to the class, skyrl: its env config; repeatable).", numbers=True,
        cli_type=list[str], commands=ENV_COMMANDS, metavar="KEY=VALUE",
    )  # fmt: skip
    env_config: Path | None = setting(
        None, "ragen:TAG's RAGEN config: a run's saved .hydra/config.yaml or RAGEN's "
        "config/*.yaml (default: the .hydra/config.yaml beside or above the checkpoint).",
        numbers=False, commands=ENV_COMMANDS,
    )  # fmt: skip
    env_seed: int | None = setting(
        None, "The first start state's seed (default 0; ragen:TAG: RAGEN's validation seeds).",
        numbers=True, commands=ENV_COMMANDS,
    )  # fmt: skip
    max_turns: int | None = setting(
        None, "Turns per episode at most (default 5; ragen:TAG: agent_proxy.max_turn).",
        numbers=True, commands=ENV_COMMANDS,
    )  # fmt: skip
    context_window: int = setting(
        -1, "Observations each turn's context keeps, with their responses: -1 all, 1 only the "
        "current one (RAGEN's max_context_window).", numbers=True, commands=ENV_COMMANDS,
    )  # fmt: skip

    env_timeout: float = setting(
        60.0, "Seconds one call into the environment (a reset, a step, a tool) may take before "
        "the scan stops on it (0: no limit; the call then runs in the scan's own thread).",
        numbers=False, commands=ENV_COMMANDS,
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_arg", tuple(self.env_arg or ()))
        if self.env_config is not None:
            object.__setattr__(self, "env_config", Path(self.env_config))
        _at_least(self.max_turns, 1, "max_turns")
        _require(self.env_timeout >= 0, f"--env-timeout must be 0 or more, got {self.env_timeout}")
        window = self.context_window
        _require(
            window == -1 or window >= 1, f"--context-window must be -1 or at least 1, got {window}"
        )
        changed = [flag_name(f.name) for f in fields(self) if getattr(self, f.name) != f.default]
        _require(
            self.env is not None or not changed,
            f"{', '.join(changed)} go{'es' if len(changed) == 1 else ''} with --env SPEC",
        )

    def numbers(self) -> dict[str, Any]:
        """What keys a played scan's cache (its config's file is keyed as the environment's
        code is, by its content; the timeout changes nothing it measures)."""
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["numbers"]}
        return kept | {"env_arg": list(self.env_arg)}


@dataclass(frozen=True)
class OutputSettings:
    """What a command writes beside what it prints. A new output is one field here, its
    writer in `collapsecheck.reports.outputs`; every path is checked writable before any
    model loads."""

    json_path: Path | None = output(
        "Write the JSON report.", flags=("--json",), commands=(SCAN, SCORE, COMPARE, WATCH)
    )
    markdown: Path | None = output("Write a Markdown summary.", commands=(SCAN, SCORE, COMPARE))
    junit: Path | None = output(
        "Write JUnit XML, one test case per rule.", commands=(SCAN, SCORE, COMPARE)
    )
    plot: Path | None = output("Draw a run's picture to this PNG.", commands=(SCAN,))
    html: Path | None = output(
        "Write one self-contained HTML page: the verdict, the cross-scoring matrix, the traces "
        "side by side, the per-prompt table (a run: its plot and every step's matrix; watch: "
        "rewritten after every step).",
        commands=(SCAN, SCORE, COMPARE, WATCH),
    )  # fmt: skip
    per_prompt: Path | None = output(
        "Write the per-prompt table (CSV, or parquet by its extension).", commands=(SCAN, SCORE)
    )
    keep_prompts: Path | None = output(
        "Write the prompts the SNR filter keeps, for the next training round (needs rewards): "
        "scan, the prompt file's rows verbatim in its format; score, the training file's rows "
        "with --prompts, else the rollouts' prompts as JSONL rows.", commands=(SCAN, SCORE),
    )  # fmt: skip
    dump: Path | None = output(
        "Write the SPEC dump of one checkpoint to this directory.",
        commands=(SCAN, SCORE), directory=True,
    )  # fmt: skip
    out: Path | None = output(
        "Results cache directory (default ~/.cache/collapsecheck for runs).",
        commands=(SCAN, COMPARE, WATCH), directory=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, Path(value))


GROUPS = {
    "load": LoadSettings,
    "sampling": SamplingSettings,
    "prompts": PromptSettings,
    "scoring": ScoringSettings,
    "analysis": AnalysisSettings,
    "rewards": RewardSettings,
}


@dataclass(frozen=True)
class Settings:
    """Every setting of a scan, by concern. `Settings.build(k=4, device="cpu")` takes the
    flags' names flat; an unknown name is an error naming it."""

    load: LoadSettings = field(default_factory=LoadSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    prompts: PromptSettings = field(default_factory=PromptSettings)
    scoring: ScoringSettings = field(default_factory=ScoringSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    rewards: RewardSettings = field(default_factory=RewardSettings)

    @classmethod
    def build(cls, **flags: Any) -> Settings:
        return cls().replace(**flags)

    def replace(self, **flags: Any) -> Settings:
        """These settings with some flags changed (flat names, as on the command line)."""
        owner = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}
        unknown = sorted(set(flags) - set(owner))
        if unknown:
            raise CollapsecheckError(
                f"unknown setting {', '.join(unknown)} (known: {', '.join(sorted(owner))})"
            )
        changes: dict[str, dict[str, Any]] = {}
        for name, value in flags.items():
            changes.setdefault(owner[name], {})[name] = value
        return dataclasses.replace(
            self,
            **{g: dataclasses.replace(getattr(self, g), **c) for g, c in changes.items()},
        )

    def numbers(self) -> dict[str, Any]:
        """The settings that change the numbers, in JSON-able form: the cache key's part. The
        traces a scan samples are part of its numbers, so SAMPLES_VERSION keys them too."""
        return {
            "numbers_version": NUMBERS_VERSION,
            "samples_version": SAMPLES_VERSION,
            **self._marked("numbers"),
        }

    def sampling_key(self) -> dict[str, Any]:
        """The settings that change the sampled traces, in JSON-able form: the samples
        cache key's part."""
        return {"samples_version": SAMPLES_VERSION, **self._marked("samples")}

    def _marked(self, mark: str) -> dict[str, Any]:
        """Per group, the fields whose metadata has `mark` set (groups with none left out)."""
        key: dict[str, Any] = {}
        for group in GROUPS:
            values = getattr(self, group)
            marked = {f.name: _keyed(getattr(values, f.name), f) for f in fields(values)
                      if f.metadata[mark] and not _unkeyed(getattr(values, f.name), f)}  # fmt: skip
            if marked:
                key[group] = marked
        return key


def _unkeyed(value: Any, field: dataclasses.Field) -> bool:
    return value is None and field.metadata["keyed_unset"] == UNKEYED


def _keyed(value: Any, field: dataclasses.Field) -> Any:
    """A field's value as the caches key it: JSON-able, an unset one as `keyed_unset` says."""
    if value is None:
        value = field.metadata["keyed_unset"]
    return str(value) if isinstance(value, Path) else value


def resolve_settings(settings: Settings | None, flags: dict[str, Any]) -> Settings:
    """The settings a Python API call asked for: `settings` (or the defaults) with `flags`."""
    return (settings or Settings()).replace(**flags) if flags else settings or Settings()
