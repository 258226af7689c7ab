"""The command line: a thin typer layer over the Python API (`scan`, `scan_run`,
`compare_reports`).

Exit codes: 0 ok; 1 a gate rule failed (the verdict is in `--fail-on`, a `--min-*` metric is
too low, or `compare` found that B lost input dependence); 2 usage or input error (one line on
stderr naming the file, line or option at fault).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from collapsecheck.backends.base import DEFAULT_BATCH_TOKENS, DEFAULT_SAMPLE_ROWS
from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import DEFAULT_RESAMPLES
from collapsecheck.reasoning import REGEX, WHOLE, ReasoningSpec

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

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
PromptField = Annotated[
    str | None, typer.Option(help="JSONL field holding the prompt (default prompt/messages).")
]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")]
Dtype = Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")]
Scorer = Annotated[str, typer.Option(help="cached (default) or naive (reference).")]
BatchTokens = Annotated[
    str, typer.Option(help="Tokens per scoring batch (batch x length), or auto (fit the memory).")
]
SampleBatch = Annotated[int, typer.Option(help="Sequences decoded together while sampling.")]
Bootstrap = Annotated[int, typer.Option(help="Bootstrap resamples.")]
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


# The options shared by `scan` and `compare`, declared once (name, typer annotation, default).
SCAN_PARAMETERS = [
    _keyword("samples", Samples, 8),
    _keyword("num_prompts", NumPrompts, None),
    _keyword("max_new_tokens", MaxNewTokens, 256),
    _keyword("temperature", Temperature, 1.0),
    _keyword("top_p", TopP, 1.0),
    _keyword("seed", Seed, 0),
    _keyword("reasoning_tags", ReasoningTags, None),
    _keyword("reasoning_regex", ReasoningRegex, None),
    _keyword("whole_response", WholeResponse, False),
    _keyword("as_chat", AsChat, False),
    _keyword("system_prompt", SystemPrompt, None),
    _keyword("prompt_field", PromptField, None),
    _keyword("device", Device, "auto"),
    _keyword("dtype", Dtype, "auto"),
    _keyword("scorer", Scorer, "cached"),
    _keyword("batch_tokens", BatchTokens, DEFAULT_BATCH_TOKENS),
    _keyword("sample_batch", SampleBatch, DEFAULT_SAMPLE_ROWS),
    _keyword("negatives", Negatives, None),
    _keyword("base_model", BaseModel, None),
    _keyword("trust_remote_code", TrustRemoteCode, False),
    _keyword("trust_checkpoint_pickle", TrustPickle, False),
    _keyword("bootstrap", Bootstrap, DEFAULT_RESAMPLES),
]


def scan_options(values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `collapsecheck.scan` from the shared options' values."""
    if values["bootstrap"] < 0:
        raise CollapsecheckError(f"--bootstrap must be >= 0, got {values['bootstrap']}")
    return {
        "k": values["samples"],
        "num_prompts": values["num_prompts"],
        "max_new_tokens": values["max_new_tokens"],
        "temperature": values["temperature"],
        "top_p": values["top_p"],
        "seed": values["seed"],
        "reasoning": reasoning_spec(
            values["reasoning_tags"], values["reasoning_regex"], values["whole_response"]
        ),
        "as_chat": values["as_chat"],
        "system_prompt": values["system_prompt"],
        "prompt_field": values["prompt_field"],
        "device": values["device"],
        "dtype": values["dtype"],
        "scorer": values["scorer"],
        "batch_tokens": values["batch_tokens"],
        "sample_rows": values["sample_batch"],
        "negatives": values["negatives"],
        "base_model": values["base_model"],
        "trust_remote_code": values["trust_remote_code"],
        "trust_checkpoint_pickle": values["trust_checkpoint_pickle"],
        "resamples": values["bootstrap"],
    }


def with_scan_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared scan options; it receives them as `options`, the keyword
    arguments of `collapsecheck.scan`."""
    signature = inspect.signature(command, eval_str=True)
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in signature.parameters.values()
        if p.name != "options"
    ]
    # arguments and --prompts first, then the shared options, then the command's own
    leading = [p for p in own if p.default is inspect.Parameter.empty or p.name == "prompts"]
    trailing = [p for p in own if p not in leading]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {p.name: kwargs.pop(p.name) for p in SCAN_PARAMETERS}
        with user_errors():
            options = scan_options(values)
        command(options=options, **kwargs)

    parameters = leading + SCAN_PARAMETERS + trailing
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}
    del wrapper.__wrapped__  # typer must read the new signature, not the command's
    return wrapper


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


@app.command()
@with_scan_options
def scan(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint directory, or a run directory of checkpoints.")
    ],
    options: dict[str, Any],
    prompts: Prompts = None,
    dependence_high: Annotated[
        float | None, typer.Option(help="Input dependence is high at or above this [0.7].")
    ] = None,
    dependence_collapsed: Annotated[
        float | None, typer.Option(help="Input dependence is collapsed at or below this [0.3].")
    ] = None,
    entropy_low: Annotated[
        float | None, typer.Option(help="H(Z|X) below this (nats/trace) is low [1.0].")
    ] = None,
    fail_on: Annotated[
        str | None,
        typer.Option(help="Regimes that fail the gate, comma-separated, or none [collapses]."),
    ] = None,
    min_normalized_mi: Annotated[float | None, typer.Option(help="Fail below this.")] = None,
    min_retrieval_skill: Annotated[float | None, typer.Option(help="Fail below this.")] = None,
    min_valid_reasoning_rate: Annotated[float | None, typer.Option(help="Fail below this.")] = None,
    min_conditional_entropy: Annotated[
        float | None, typer.Option(help="Fail when H(Z|X) (nats/trace) is below this.")
    ] = None,
    config: Config = None,
    out: Out = None,
    rescan: Rescan = False,
    json_path: JsonPath = None,
    dump: Annotated[
        Path | None, typer.Option(help="Write the SPEC dump of one checkpoint to this directory.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Draw a run's picture to this PNG.")] = None,
    junit: Junit = None,
    markdown: Markdown = None,
) -> None:
    """Sample, cross-score and diagnose a checkpoint, or every checkpoint of a run directory."""
    from collapsecheck.cache import default_cache_root
    from collapsecheck.config import load_gate
    from collapsecheck.console import print_report, print_run, progress_bars
    from collapsecheck.discovery import find_checkpoints
    from collapsecheck.dump import write_text_atomic
    from collapsecheck.gate import check_report, markdown_report
    from collapsecheck.plot import plot_run
    from collapsecheck.runs import cached_scan, scan_run
    from collapsecheck.scan import scan as run_scan

    with user_errors():
        gate = load_gate(
            config,
            fail_on=fail_on,
            thresholds={
                "dependence_high": dependence_high,
                "dependence_collapsed": dependence_collapsed,
                "entropy_low": entropy_low,
            },
            minimums={
                "normalized_mi": min_normalized_mi,
                "retrieval_skill": min_retrieval_skill,
                "valid_reasoning_rate": min_valid_reasoning_rate,
                "conditional_entropy_seq_est": min_conditional_entropy,
            },
        )
        prompt_file = require_prompts(prompts)
        model_dir, run = find_checkpoints(checkpoint, options["base_model"])
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
                report = run_report.steps[-1].report
            elif out is not None:
                report = cached_scan(
                    model_dir, prompt_file, cache_root=out, rescan=rescan,
                    thresholds=gate.thresholds, progress=progress, **options,
                )  # fmt: skip
            else:
                report = run_scan(
                    model_dir, prompt_file, dump=dump, thresholds=gate.thresholds,
                    progress=progress, **options,
                )  # fmt: skip
        results = check_report(report, gate)
        if run:
            title = f"{checkpoint} (latest: {run[-1].label})"
            if json_path is not None:
                run_report.save(json_path)
            if plot is not None:
                plot_run(run_report, plot)
        else:
            title = str(checkpoint)
            if json_path is not None:
                report.save(json_path)
        if markdown is not None:
            summary = markdown_report(title, report, results, run_report if run else None)
            write_text_atomic(markdown, summary)
    if run:
        print_run(stdout, run_report)
    else:
        print_report(stdout, report)
    with user_errors():
        finish_gate(results, junit, "collapsecheck.scan")


@app.command()
@with_scan_options
def compare(
    a: Annotated[Path, typer.Argument(help="Checkpoint A (the baseline), or its report.json.")],
    b: Annotated[Path, typer.Argument(help="Checkpoint B (the candidate), or its report.json.")],
    options: dict[str, Any],
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

    with user_errors():
        gate = load_gate(config, max_drop=max_drop)

        def obtain(path: Path, progress: Any) -> Report:
            if path.is_file():
                return Report.load(path)
            if (
                path.is_dir()
                and (path / REPORT_FILE).is_file()
                and not (path / "config.json").exists()
            ):
                return Report.load(path / REPORT_FILE)
            model_dir, run = find_checkpoints(path, options["base_model"])
            if run:
                raise CollapsecheckError(f"{path}: compare takes two checkpoints, not a run")
            return cached_scan(
                model_dir, require_prompts(prompts), cache_root=out or default_cache_root(),
                rescan=rescan, thresholds=gate.thresholds, progress=progress, **options,
            )  # fmt: skip

        with progress_bars(stderr) as progress:
            first, second = obtain(a, progress), obtain(b, progress)
        comparison = compare_reports(
            first,
            second,
            max_drop=gate.max_drop,
            resamples=options["resamples"],
            seed=options["seed"],
        )
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


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    app(prog_name="collapsecheck")


if __name__ == "__main__":
    main()
