"""The command line: a thin typer layer over the Python API (`scan`, `scan_run`,
`compare_reports`).

Exit codes: 0 ok; 1 a gate rule failed (the verdict is in `--fail-on`, a `--min-*` metric is
too low, or `compare` found that B lost input dependence); 2 usage or input error (one line on
stderr naming the file, line or option at fault).
"""

from __future__ import annotations

import functools
import inspect
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from collapsecheck.backends.base import DEFAULT_BATCH_TOKENS, DEFAULT_SAMPLE_ROWS
from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import DEFAULT_RESAMPLES
from collapsecheck.reasoning import REGEX, WHOLE, ReasoningSpec

EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Detect template collapse in RL-trained LLM agents (see docs/SPEC.md).",
)
stdout = Console()
stderr = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn bad input into one line on stderr and exit code 2; Ctrl-C into exit code 130."""
    try:
        yield
    except CollapsecheckError as error:
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        stderr.print("[bold red]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def reasoning_spec(tags: str | None, regex: str | None, whole: bool) -> ReasoningSpec:
    given = [
        name
        for name, value in (
            ("--reasoning-tags", tags),
            ("--reasoning-regex", regex),
            ("--whole-response", whole),
        )
        if value
    ]
    if len(given) > 1:
        raise CollapsecheckError(f"choose one of {' and '.join(given)}, not both")
    if tags:
        return ReasoningSpec.from_tags(tags)
    if regex:
        return ReasoningSpec(REGEX, regex=regex)
    return ReasoningSpec(WHOLE) if whole else ReasoningSpec()


# -- options shared by `scan` and `compare` ------------------------------------------------

Prompts = Annotated[
    Path | None,
    typer.Option("--prompts", "-p", help="Prompt set: JSONL, parquet (veRL) or plain text."),
]
Samples = Annotated[int, typer.Option("-k", "--samples", help="Samples per prompt.")]
NumPrompts = Annotated[
    int | None, typer.Option("--num-prompts", "-n", help="Use the first N prompts.")
]
MaxNewTokens = Annotated[int, typer.Option(help="Length limit per response.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature.")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling threshold.")]
Seed = Annotated[int, typer.Option(help="Seed of sampling and bootstrap.")]
ReasoningTags = Annotated[
    str | None, typer.Option(help="Reasoning between OPEN,CLOSE (default <think>,</think>).")
]
ReasoningRegex = Annotated[
    str | None, typer.Option(help="Reasoning matched by a regex (its group 1 if any).")
]
WholeResponse = Annotated[
    bool, typer.Option("--whole-response", help="Score the whole response as reasoning.")
]
AsChat = Annotated[
    bool, typer.Option("--as-chat", help="Wrap plain-string prompts as one user message.")
]
SystemPrompt = Annotated[
    str | None, typer.Option(help="Add this system message to prompts that have none.")
]
TruncatePrompts = Annotated[
    bool,
    typer.Option(
        "--truncate-prompts",
        help="Cut prompts too long for the model's context to their last tokens (reported).",
    ),
]
PromptField = Annotated[
    str | None, typer.Option(help="JSONL field holding the prompt (default prompt/messages).")
]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")]
Dtype = Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")]
Scorer = Annotated[
    str,
    typer.Option(help="auto, cached or naive (transformers), vllm (prompt log-probabilities)."),
]
BackendChoice = Annotated[
    str, typer.Option(help="transformers, vllm, or auto (vLLM when installed and on a GPU).")
]
TensorParallel = Annotated[int, typer.Option(help="vLLM: GPUs to split the model over.")]
GpuMemory = Annotated[
    float | None, typer.Option(help="vLLM: share of GPU (CPU build: host) memory to use.")
]
MaxModelLen = Annotated[int | None, typer.Option(help="vLLM: context length to allocate.")]
BatchTokens = Annotated[
    str, typer.Option(help="Tokens per scoring batch (batch x length), or auto (fit the memory).")
]
SampleBatch = Annotated[int, typer.Option(help="Sequences decoded together while sampling.")]
Bootstrap = Annotated[int, typer.Option(help="Bootstrap resamples.")]
DependenceHigh = Annotated[
    float | None, typer.Option(help="Input dependence is high at or above this [0.7].")
]
DependenceCollapsed = Annotated[
    float | None, typer.Option(help="Input dependence is collapsed at or below this [0.3].")
]
EntropyLow = Annotated[
    float | None, typer.Option(help="H(Z|X) below this (nats/trace) is low [1.0].")
]
FailOn = Annotated[
    str | None,
    typer.Option(help="Regimes that fail the gate, comma-separated, or none [the collapses]."),
]
BaseModel = Annotated[
    Path | None, typer.Option(help="Base model directory of a LoRA/PEFT adapter checkpoint.")
]
TrustRemoteCode = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Run the model code a checkpoint ships (off)."),
]
TrustPickle = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint-pickle",
        help="Unpickle veRL shards that hold more than tensors (can run code; off).",
    ),
]
Negatives = Annotated[
    int | None,
    typer.Option(help="Score each trace under its own prompt and M sampled others, not all N."),
]
Config = Annotated[
    Path | None,
    typer.Option(help="Gate settings (default: ./collapsecheck.toml or ./pyproject.toml)."),
]
Out = Annotated[
    Path | None,
    typer.Option(help="Results cache directory (default ~/.cache/collapsecheck for runs)."),
]
Rescan = Annotated[bool, typer.Option("--rescan", help="Ignore cached results.")]
JsonPath = Annotated[Path | None, typer.Option("--json", help="Write the JSON report.")]
Junit = Annotated[Path | None, typer.Option(help="Write JUnit XML, one test case per rule.")]
Markdown = Annotated[Path | None, typer.Option(help="Write a Markdown summary.")]


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


@dataclass(frozen=True)
class OptionGroup:
    """Options declared once and shared by several commands: the command receives them as one
    keyword argument, `name`, built from their values by `build`."""

    name: str
    parameters: list[inspect.Parameter]
    build: Callable[[dict[str, Any]], Any]


def sampling_options(values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `collapsecheck.scan` that only sampling needs."""
    return {
        "k": values["samples"],
        "num_prompts": values["num_prompts"],
        "max_new_tokens": values["max_new_tokens"],
        "temperature": values["temperature"],
        "top_p": values["top_p"],
        "sample_rows": values["sample_batch"],
    }


def scoring_options(values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `collapsecheck.scan` and `collapsecheck.score` for loading the
    model, reading prompts and reasoning, cross-scoring and the bootstrap."""
    if values["bootstrap"] < 0:
        raise CollapsecheckError(f"--bootstrap must be >= 0, got {values['bootstrap']}")
    spec = reasoning_spec(
        values.pop("reasoning_tags"), values.pop("reasoning_regex"), values.pop("whole_response")
    )
    resamples, engine = values.pop("bootstrap"), values.pop("backend")
    return {**values, "engine": engine, "reasoning": spec, "resamples": resamples}


def gate_options(values: dict[str, Any]) -> Any:
    from collapsecheck.config import load_gate

    thresholds = ("dependence_high", "dependence_collapsed", "entropy_low")
    return load_gate(
        values["config"],
        fail_on=values["fail_on"],
        thresholds={key: values[key] for key in thresholds},
        minimums={
            "normalized_mi": values["min_normalized_mi"],
            "retrieval_skill": values["min_retrieval_skill"],
            "valid_reasoning_rate": values["min_valid_reasoning_rate"],
            "conditional_entropy_seq_est": values["min_conditional_entropy"],
        },
    )


MinimumOption = Annotated[float | None, typer.Option(help="Fail below this.")]
SAMPLING = OptionGroup(
    "sampling",
    [
        _keyword("samples", Samples, 8),
        _keyword("num_prompts", NumPrompts, None),
        _keyword("max_new_tokens", MaxNewTokens, 256),
        _keyword("temperature", Temperature, 1.0),
        _keyword("top_p", TopP, 1.0),
        _keyword("sample_batch", SampleBatch, DEFAULT_SAMPLE_ROWS),
    ],
    sampling_options,
)
SCORING = OptionGroup(
    "scoring",
    [
        _keyword("seed", Seed, 0),
        _keyword("reasoning_tags", ReasoningTags, None),
        _keyword("reasoning_regex", ReasoningRegex, None),
        _keyword("whole_response", WholeResponse, False),
        _keyword("as_chat", AsChat, False),
        _keyword("system_prompt", SystemPrompt, None),
        _keyword("prompt_field", PromptField, None),
        _keyword("truncate_prompts", TruncatePrompts, False),
        _keyword("backend", BackendChoice, "transformers"),
        _keyword("device", Device, "auto"),
        _keyword("dtype", Dtype, "auto"),
        _keyword("scorer", Scorer, "auto"),
        _keyword("batch_tokens", BatchTokens, DEFAULT_BATCH_TOKENS),
        _keyword("negatives", Negatives, None),
        _keyword("base_model", BaseModel, None),
        _keyword("trust_remote_code", TrustRemoteCode, False),
        _keyword("trust_checkpoint_pickle", TrustPickle, False),
        _keyword("tensor_parallel_size", TensorParallel, 1),
        _keyword("gpu_memory_utilization", GpuMemory, None),
        _keyword("max_model_len", MaxModelLen, None),
        _keyword("bootstrap", Bootstrap, DEFAULT_RESAMPLES),
    ],
    scoring_options,
)
GATE = OptionGroup(
    "gate",
    [
        _keyword("dependence_high", DependenceHigh, None),
        _keyword("dependence_collapsed", DependenceCollapsed, None),
        _keyword("entropy_low", EntropyLow, None),
        _keyword("fail_on", FailOn, None),
        _keyword("min_normalized_mi", MinimumOption, None),
        _keyword("min_retrieval_skill", MinimumOption, None),
        _keyword("min_valid_reasoning_rate", MinimumOption, None),
        _keyword("min_conditional_entropy", MinimumOption, None),
        _keyword("config", Config, None),
    ],
    gate_options,
)


def with_options(*groups: OptionGroup) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the options of `groups`; it receives each group as one argument."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        names = {group.name for group in groups}
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in signature.parameters.values()
            if p.name not in names
        ]
        # arguments and --prompts first, then the shared options, then the command's own
        leading = [p for p in own if p.default is inspect.Parameter.empty or p.name == "prompts"]
        trailing = [p for p in own if p not in leading]
        shared = [p for group in groups for p in group.parameters]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            built = {}
            with user_errors():
                for group in groups:
                    values = {p.name: kwargs.pop(p.name) for p in group.parameters}
                    built[group.name] = group.build(values)
            command(**built, **kwargs)

        parameters = leading + shared + trailing
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {}
        del wrapper.__wrapped__  # typer must read the new signature, not the command's
        return wrapper

    return decorate


def require_prompts(prompts: Path | None) -> Path:
    if prompts is None:
        raise CollapsecheckError("--prompts FILE is needed to scan a checkpoint")
    return prompts


def finish_gate(
    results: Sequence[Any], junit: Path | None, suite: str, enforce: bool = True
) -> None:
    """Write JUnit if asked; when enforcing, name each failing rule and exit 1 if any failed."""
    from collapsecheck.gate import failures, write_junit

    if junit is not None:
        write_junit(junit, suite, results)
    failed = failures(results) if enforce else []
    for result in failed:
        stderr.print(f"[bold red]failed:[/] {escape(result.name)}: {escape(result.message)}")
    if failed:
        raise typer.Exit(EXIT_FAIL)


def gate_single_report(
    report: Any, gate: Any, title: str, json_path: Path | None, markdown: Path | None,
    junit: Path | None,
) -> None:  # fmt: skip
    """Write a report's outputs, print it, and apply the gate to it."""
    from collapsecheck.console import print_report
    from collapsecheck.dump import write_text_atomic
    from collapsecheck.gate import check_report, markdown_report

    with user_errors():
        results = check_report(report, gate)
        if json_path is not None:
            report.save(json_path)
        if markdown is not None:
            write_text_atomic(markdown, markdown_report(title, report, results))
    print_report(stdout, report)
    with user_errors():
        finish_gate(results, junit, "collapsecheck")


Dump = Annotated[
    Path | None, typer.Option(help="Write the SPEC dump of one checkpoint to this directory.")
]


@app.command()
@with_options(SAMPLING, SCORING, GATE)
def scan(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint directory, or a run directory of checkpoints.")
    ],
    sampling: dict[str, Any],
    scoring: dict[str, Any],
    gate: Any,
    prompts: Prompts = None,
    out: Out = None,
    rescan: Rescan = False,
    json_path: JsonPath = None,
    dump: Dump = None,
    plot: Annotated[Path | None, typer.Option(help="Draw a run's picture to this PNG.")] = None,
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Sample, cross-score and diagnose a checkpoint, or every checkpoint of a run directory."""
    from collapsecheck.cache import default_cache_root
    from collapsecheck.console import print_run, progress_bars
    from collapsecheck.discovery import find_checkpoints
    from collapsecheck.dump import write_text_atomic
    from collapsecheck.gate import check_report, markdown_report
    from collapsecheck.plot import plot_run
    from collapsecheck.runs import cached_scan, scan_run
    from collapsecheck.scan import scan as run_scan

    options = {**sampling, **scoring}
    with user_errors():
        prompt_file = require_prompts(prompts)
        single, run = find_checkpoints(checkpoint, scoring["base_model"])
        if dump is not None and (run or out is not None):
            raise CollapsecheckError(
                "--dump takes one checkpoint without --out (cached scans keep their dump "
                "under --out)"
            )
        if plot is not None and not run:
            raise CollapsecheckError(f"--plot draws a run: {checkpoint} is a single checkpoint")
        with progress_bars(stderr) as progress:
            if run:
                run_report = scan_run(
                    checkpoint, run, prompt_file, cache_root=out or default_cache_root(),
                    rescan=rescan, thresholds=gate.thresholds, progress=progress, **options,
                )  # fmt: skip
            elif out is not None:
                report = cached_scan(
                    single, prompt_file, cache_root=out, rescan=rescan,
                    thresholds=gate.thresholds, progress=progress, **options,
                )  # fmt: skip
            else:
                report = run_scan(
                    single, prompt_file, dump=dump, thresholds=gate.thresholds,
                    progress=progress, **options,
                )  # fmt: skip
    if not run:
        gate_single_report(report, gate, str(checkpoint), json_path, markdown, junit)
        return
    with user_errors():
        report = run_report.steps[-1].report
        results = check_report(report, gate)
        if json_path is not None:
            run_report.save(json_path)
        if plot is not None:
            plot_run(run_report, plot)
        if markdown is not None:
            title = f"{checkpoint} (latest: {run[-1].label})"
            write_text_atomic(markdown, markdown_report(title, report, results, run_report))
    print_run(stdout, run_report)
    with user_errors():
        finish_gate(results, junit, "collapsecheck")


@app.command()
@with_options(SCORING, GATE)
def score(
    rollouts: Annotated[
        Path, typer.Argument(help="Rollouts (JSONL or parquet), or a --dump directory.")
    ],
    scoring: dict[str, Any],
    gate: Any,
    checkpoint: Annotated[
        Path, typer.Option("--checkpoint", "-c", help="The policy that produced the rollouts.")
    ],
    response_field: Annotated[
        str | None, typer.Option(help="Field of the response text [response/output/completion].")
    ] = None,
    response_ids_field: Annotated[
        str | None, typer.Option(help="Field of the response's sampled token ids, if any.")
    ] = None,
    group_field: Annotated[
        str | None, typer.Option(help="Field grouping rows by prompt [uid/group_id/prompt_id].")
    ] = None,
    turn_sampling: Annotated[
        str, typer.Option(help="Multi-turn rollouts: turn, trajectory or first.")
    ] = "turn",
    pairs: Annotated[
        int | None, typer.Option(help="Multi-turn rollouts: (trajectory, turn) pairs to sample.")
    ] = None,
    json_path: JsonPath = None,
    dump: Dump = None,
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Diagnose traces that training already sampled: cross-scoring only, no generation."""
    from collapsecheck.console import progress_bars
    from collapsecheck.rollouts import RolloutOptions
    from collapsecheck.scan import score as run_score

    with user_errors():
        options = RolloutOptions(
            prompt_field=scoring.pop("prompt_field"),
            response_field=response_field,
            response_ids_field=response_ids_field,
            group_field=group_field,
            turn_sampling=turn_sampling,
            pairs=pairs,
            seed=scoring["seed"],
        )
        with progress_bars(stderr) as progress:
            report = run_score(
                checkpoint, rollouts, rollout_options=options, thresholds=gate.thresholds,
                dump=dump, progress=progress, **scoring,
            )  # fmt: skip
    gate_single_report(report, gate, f"{rollouts} under {checkpoint}", json_path, markdown, junit)


@app.command()
@with_options(SAMPLING, SCORING)
def compare(
    a: Annotated[Path, typer.Argument(help="Checkpoint A (the baseline), or its report.json.")],
    b: Annotated[Path, typer.Argument(help="Checkpoint B (the candidate), or its report.json.")],
    sampling: dict[str, Any],
    scoring: dict[str, Any],
    prompts: Prompts = None,
    max_drop: Annotated[
        float | None,
        typer.Option(help="Tolerated drop of normalized MI and retrieval skill [0]."),
    ] = None,
    gate_exit: Annotated[
        bool,
        typer.Option("--gate/--no-gate", help="Exit 1 when B lost input dependence."),
    ] = True,
    config: Config = None,
    out: Out = None,
    rescan: Rescan = False,
    json_path: JsonPath = None,
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Did checkpoint B lose input dependence relative to A, beyond noise?"""
    from collapsecheck.cache import default_cache_root
    from collapsecheck.compare import compare_reports
    from collapsecheck.config import load_gate
    from collapsecheck.console import print_comparison, progress_bars
    from collapsecheck.discovery import find_checkpoints
    from collapsecheck.dump import REPORT_FILE, write_text_atomic
    from collapsecheck.gate import RuleResult, markdown_report
    from collapsecheck.report import Report
    from collapsecheck.runs import cached_scan

    options = {**sampling, **scoring}
    with user_errors():
        gate = load_gate(config, max_drop=max_drop)

        def obtain(path: Path, progress: Any) -> Report:
            if path.is_file():
                return Report.load(path)
            if (path / REPORT_FILE).is_file() and not (path / "config.json").exists():
                return Report.load(path / REPORT_FILE)
            single, run = find_checkpoints(path, scoring["base_model"])
            if run:
                raise CollapsecheckError(f"{path}: compare takes two checkpoints, not a run")
            return cached_scan(
                single, require_prompts(prompts), cache_root=out or default_cache_root(),
                rescan=rescan, thresholds=gate.thresholds, progress=progress, **options,
            )  # fmt: skip

        with progress_bars(stderr) as progress:
            first, second = obtain(a, progress), obtain(b, progress)
        comparison = compare_reports(
            first, second, max_drop=gate.max_drop, resamples=options["resamples"],
            seed=options["seed"],
        )  # fmt: skip
        results = [RuleResult("input dependence kept", not comparison.lost, comparison.reason)]
        if json_path is not None:
            import json

            write_text_atomic(json_path, json.dumps(comparison.to_dict(), indent=2) + "\n")
        if markdown is not None:
            write_text_atomic(markdown, markdown_report(f"{a} vs {b}", second, results))
    print_comparison(stdout, comparison)
    with user_errors():
        finish_gate(results, junit, "collapsecheck.compare", enforce=gate_exit)


@app.callback()
def _root() -> None:
    """collapsecheck: is the reasoning of an RL-trained policy still grounded in its input?"""


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a scan as Ctrl-C does: finished work is kept


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    signal.signal(signal.SIGTERM, _terminated)
    app(prog_name="collapsecheck")


if __name__ == "__main__":
    main()
