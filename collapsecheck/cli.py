"""The command line: a thin typer layer over the Python API (`scan`, `score`, `scan_run`,
`compare_reports`).

A command's parameter typed with a settings dataclass (`collapsecheck.settings`,
`collapsecheck.config.GateSettings`) stands for that dataclass's fields: each field is one
option, named like the field, shown under the group's heading in --help, and the command
receives the dataclass built from them. So `def scan(..., load: LoadSettings, ...)` reads as
"scan takes every flag of LoadSettings", and a flag is declared once, in its dataclass.

Exit codes: 0 ok; 1 a gate rule failed (the verdict is in `--fail-on`, a `--min-*` metric is
too low, or `compare` found that B lost input dependence); 2 usage or input error (one line on
stderr naming the file, line or option at fault).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import signal
import sys
import traceback
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape

from collapsecheck.config import GateSettings
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import (
    AnalysisSettings,
    LoadSettings,
    PromptSettings,
    RewardSettings,
    SamplingSettings,
    ScoringSettings,
    Settings,
    flag_name,
)

EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130
DEBUG_ENV = "COLLAPSECHECK_DEBUG"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Detect template collapse in RL-trained LLM agents. Every metric and the verdict are "
    "defined in the SPEC: `collapsecheck spec` prints it.",
)


def console(to_stderr: bool = False) -> Console:
    """A terminal keeps its width; a pipe or a CI log, which rich would cut to 80 columns,
    gets room for a run's table (COLUMNS, where set, still wins)."""
    stream = sys.stderr if to_stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=to_stderr, width=PIPED_WIDTH if piped else None)


PIPED_WIDTH = 180
stdout = console()
stderr = console(to_stderr=True)
state = {"debug": os.environ.get(DEBUG_ENV, "") not in ("", "0")}

# The heading each settings group's options appear under in --help.
PANELS = {
    SamplingSettings: "Sampling",
    PromptSettings: "Prompts",
    ScoringSettings: "Reasoning and scoring",
    AnalysisSettings: "Analysis",
    RewardSettings: "Rewards (why it collapsed)",
    LoadSettings: "Model and engine",
    GateSettings: "Gate",
}


def _print_traceback(error: BaseException) -> None:
    stderr.print("".join(traceback.format_exception(error)), markup=False, end="")


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input: one line on stderr, exit code 2. Ctrl-C: exit code 130. A bug in
    collapsecheck: one line, exit code 3 (never 1, which a CI gate reads as a failed rule).
    With --debug (or COLLAPSECHECK_DEBUG=1) the traceback of the error's cause comes too."""
    try:
        yield
    except CollapsecheckError as error:
        if state["debug"]:
            _print_traceback(error.__context__ or error)
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        stderr.print(
            "[bold red]interrupted:[/] finished work is kept; the same command resumes a run "
            "directory or a scan with --out from where it stopped"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise
    except Exception as error:
        if state["debug"]:
            _print_traceback(error)
        message = " ".join(str(error).split()) or type(error).__name__
        stderr.print(
            f"[bold red]internal error:[/] {escape(message)} ({type(error).__name__}); please "
            "report it with the output of the same command run with --debug",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERNAL) from None


# -- settings dataclasses as options -----------------------------------------------------


def _option(field: dataclasses.Field, annotation: Any, panel: str) -> inspect.Parameter:
    meta = field.metadata
    flags = meta["flags"] or (flag_name(field.name),)
    kind = meta["cli_type"] or annotation
    if meta["cli_type"] is not None and field.default is None:
        kind = kind | None
    option = typer.Option(*flags, help=meta["help"], rich_help_panel=panel)
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=field.default,
        annotation=Annotated[kind, option],
    )


def settings_options(group: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group)
    return [_option(f, hints[f.name], PANELS[group]) for f in dataclasses.fields(group)]


def takes_settings(command: Callable[..., None]) -> Callable[..., None]:
    """Expand each parameter typed with a settings dataclass into that dataclass's options;
    the command receives the dataclass, built (and so checked) before it runs."""
    hints = typing.get_type_hints(command)
    signature = inspect.signature(command, eval_str=True)
    groups = {name: hint for name, hint in hints.items() if hint in PANELS}
    own = [p for name, p in signature.parameters.items() if name not in groups]
    # arguments and --prompts first, then the settings' options, then the command's own
    leading = [p for p in own if p.default is inspect.Parameter.empty or p.name == "prompts"]
    trailing = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p not in leading]
    expanded = [option for group in groups.values() for option in settings_options(group)]

    @functools.wraps(command)
    def wrapper(**values: Any) -> None:
        built = {}
        with user_errors():
            for name, group in groups.items():
                names = [f.name for f in dataclasses.fields(group)]
                built[name] = group(**{n: values.pop(n) for n in names})
            command(**built, **values)

    leading = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in leading]
    wrapper.__signature__ = signature.replace(parameters=leading + expanded + trailing)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}
    del wrapper.__wrapped__  # typer must read the expanded signature, not the command's
    return wrapper


# -- outputs and the gate ----------------------------------------------------------------

Prompts = Annotated[
    Path | None,
    typer.Option("--prompts", "-p", help="Prompt set: JSONL, parquet (veRL) or plain text."),
]
Out = Annotated[
    Path | None,
    typer.Option(help="Results cache directory (default ~/.cache/collapsecheck for runs)."),
]
Rescan = Annotated[bool, typer.Option("--rescan", help="Ignore cached results.")]
JsonPath = Annotated[Path | None, typer.Option("--json", help="Write the JSON report.")]
Junit = Annotated[Path | None, typer.Option(help="Write JUnit XML, one test case per rule.")]
Markdown = Annotated[Path | None, typer.Option(help="Write a Markdown summary.")]
Dump = Annotated[
    Path | None, typer.Option(help="Write the SPEC dump of one checkpoint to this directory.")
]
PerPrompt = Annotated[
    Path | None,
    typer.Option(help="Write the per-prompt table (CSV, or parquet by its extension)."),
]
KeepPrompts = Annotated[
    Path | None,
    typer.Option(
        help="Write the prompts the SNR filter keeps, rows verbatim in the prompt file's "
        "format, for the next training round (needs --reward-fn)."
    ),
]


def write_per_prompt_table(report: Any, path: Path | None) -> None:
    """--per-prompt: the table as CSV, or parquet by extension."""
    if path is None:
        return
    from collapsecheck.files import write_atomic

    frame = report.per_prompt_frame()
    if path.suffix.lower() in (".parquet", ".pq"):
        write_atomic(path, "wb", lambda stream: frame.to_parquet(stream))
    else:
        write_atomic(path, "w", lambda stream: frame.to_csv(stream))


def write_kept_prompts(report: Any, prompt_file: Path, settings: Settings, path: Path) -> None:
    """--keep-prompts: the rows of the prompts RAGEN's SNR filter keeps."""
    from collapsecheck.prompts import load_prompts, write_prompt_rows

    prompts = load_prompts(
        prompt_file, num_prompts=settings.sampling.num_prompts,
        field=settings.prompts.prompt_field,
    )  # fmt: skip
    kept = [prompts[i] for i in report.snr["kept_prompts"]]
    write_prompt_rows(prompt_file, kept, path)
    stderr.print(
        f"kept {len(kept)} of {len(prompts)} prompts (SNR filter, top-p "
        f"{settings.rewards.snr_top_p:g}) in {path}",
        style="dim",
    )


def check_combinations(
    checkpoint: Path, is_run: bool, dump: Path | None, out: Path | None, plot: Path | None,
    baseline: Path | None, train_log: Path | None,
) -> None:  # fmt: skip
    """Options that do not go together with what `checkpoint` is, refused before any work."""
    if dump is not None and (is_run or out is not None):
        raise CollapsecheckError(
            "--dump takes one checkpoint without --out (cached scans keep their dump under --out)"
        )
    if plot is not None and not is_run:
        raise CollapsecheckError(f"--plot draws a run: {checkpoint} is a single checkpoint")
    if not is_run and (baseline is not None or train_log is not None):
        raise CollapsecheckError(
            f"--baseline and --train-log go with a run directory, not one checkpoint: {checkpoint}"
        )


def parse_train_keys(values: list[str]) -> dict[str, str]:
    """--train-key NAME=KEY, repeatable."""
    keys = {}
    for value in values:
        name, sep, key = value.partition("=")
        if not (sep and name and key):
            raise CollapsecheckError(f"--train-key expects NAME=KEY, got {value!r}")
        keys[name] = key
    return keys


def check_why_outputs(
    keep_prompts: Path | None, prompts: Path | None, rewards: RewardSettings
) -> None:
    if keep_prompts is None:
        return
    from collapsecheck.prompts import check_same_format

    if rewards.reward_fn is None:
        raise CollapsecheckError("--keep-prompts needs rewards: give --reward-fn FILE.py")
    check_same_format(require_prompts(prompts), keep_prompts, "--keep-prompts")


def check_outputs(files: dict[str, Path | None], directories: dict[str, Path | None]) -> None:
    """Every output the command will write, checked before any model loads: work is never
    lost to a path that cannot be written at the end."""
    from collapsecheck.files import check_output_dir, check_output_file

    for option, path in files.items():
        check_output_file(path, option)
    for option, path in directories.items():
        check_output_dir(path, option)


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
        stderr.print(
            f"[bold red]gate failed[/] (rule: {escape(result.name)}): {escape(result.message)}"
        )
    if failed:
        raise typer.Exit(EXIT_FAIL)


def gate_single_report(
    report: Any, gate: Any, title: str, json_path: Path | None, markdown: Path | None,
    junit: Path | None,
) -> None:  # fmt: skip
    """Write a report's outputs, print it, and apply the gate to it."""
    from collapsecheck.console import print_report
    from collapsecheck.files import write_text_atomic
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


def gate_run_report(
    run_report: Any, gate: Any, title: str, json_path: Path | None, markdown: Path | None,
    junit: Path | None, plot: Path | None,
) -> None:  # fmt: skip
    """Write a run's outputs, print its table, and apply the gate to its latest checkpoint."""
    from collapsecheck.console import print_run
    from collapsecheck.files import write_text_atomic
    from collapsecheck.gate import check_report, markdown_report
    from collapsecheck.plot import plot_run

    with user_errors():
        latest = run_report.steps[-1]
        results = check_report(latest.report, gate)
        if json_path is not None:
            run_report.save(json_path)
        if plot is not None:
            plot_run(run_report, plot)
        if markdown is not None:
            title = f"{title} (latest: {latest.checkpoint.label})"
            text = markdown_report(title, latest.report, results, run_report)
            write_text_atomic(markdown, text)
    print_run(stdout, run_report)
    with user_errors():
        finish_gate(results, junit, "collapsecheck")


# -- commands ----------------------------------------------------------------------------
# Each command is longer than 50 lines only because typer reads its options from its
# signature; the bodies are short.


@app.command()
@takes_settings
def scan(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint directory, or a run directory of checkpoints.")
    ],
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    gate_settings: GateSettings,
    prompts: Prompts = None,
    out: Out = None,
    rescan: Rescan = False,
    json_path: JsonPath = None,
    dump: Dump = None,
    plot: Annotated[Path | None, typer.Option(help="Draw a run's picture to this PNG.")] = None,
    junit: Junit = None,
    markdown: Markdown = None,
    per_prompt: PerPrompt = None,
    keep_prompts: KeepPrompts = None,
    train_log: Annotated[
        Path | None,
        typer.Option(
            help="The run's training log: trainer_state.json, veRL file logger JSONL, "
            "JSONL/CSV with a step column, or TensorBoard events."
        ),
    ] = None,
    no_train_log: Annotated[
        bool, typer.Option("--no-train-log", help="Do not read the run's training log.")
    ] = False,
    train_key: Annotated[
        list[str] | None,
        typer.Option(help="NAME=KEY: read series NAME from log key KEY (repeatable)."),
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="The starting model, scanned as step 0 of the run.")
    ] = None,
) -> None:
    """Sample, cross-score and diagnose a checkpoint, or every checkpoint of a run directory."""
    from collapsecheck.console import print_notes, progress_bars
    from collapsecheck.discovery import find_checkpoints
    from collapsecheck.runs import cached_scan, scan_run
    from collapsecheck.scan import scan as run_scan

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = gate_settings.load()
        prompt_file = require_prompts(prompts)
        check_why_outputs(keep_prompts, prompts, rewards)
        notes: list[str] = []
        single, run = find_checkpoints(checkpoint, load.base_model, notes)
        if not run:
            print_notes(stderr, notes)
        check_combinations(checkpoint, bool(run), dump, out, plot, baseline, train_log)
        keys = parse_train_keys(train_key or [])
        check_outputs(
            {"--json": json_path, "--markdown": markdown, "--junit": junit, "--plot": plot,
             "--per-prompt": per_prompt, "--keep-prompts": keep_prompts},
            {"--dump": dump, "--out": out},
        )  # fmt: skip
        common = {"thresholds": gate.thresholds, "flow_thresholds": gate.flow_thresholds}
        with progress_bars(stderr) as progress:
            common["progress"] = progress
            if run:
                report = scan_run(
                    checkpoint, prompt_file, settings, checkpoints=run, notes=notes,
                    baseline=baseline, training_log=False if no_train_log else (train_log or True),
                    train_keys=keys, cache_root=out, rescan=rescan, **common,
                )  # fmt: skip
            elif out is not None:
                report = cached_scan(
                    single, prompt_file, settings, cache_root=out, rescan=rescan, **common
                )
            else:
                report = run_scan(single, prompt_file, settings, dump=dump, **common)
        latest = report.steps[-1].report if run else report
        write_per_prompt_table(latest, per_prompt)
        if keep_prompts is not None and latest.snr is not None:
            write_kept_prompts(latest, prompt_file, settings, keep_prompts)
    if run:
        gate_run_report(report, gate, str(checkpoint), json_path, markdown, junit, plot)
    else:
        gate_single_report(report, gate, str(checkpoint), json_path, markdown, junit)


@app.command()
@takes_settings
def score(
    rollouts: Annotated[
        Path, typer.Argument(help="Rollouts (JSONL or parquet), or a --dump directory.")
    ],
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    gate_settings: GateSettings,
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
    per_prompt: PerPrompt = None,
) -> None:
    """Diagnose traces that training already sampled: cross-scoring only, no generation."""
    from collapsecheck.console import progress_bars
    from collapsecheck.rollouts import RolloutOptions
    from collapsecheck.scan import score as run_score

    settings = Settings(
        load=load, prompts=rendering, scoring=scoring, analysis=analysis, rewards=rewards
    )
    with user_errors():
        gate = gate_settings.load()
        check_outputs(
            {"--json": json_path, "--markdown": markdown, "--junit": junit,
             "--per-prompt": per_prompt},
            {"--dump": dump},
        )  # fmt: skip
        options = RolloutOptions(
            prompt_field=rendering.prompt_field,
            response_field=response_field,
            response_ids_field=response_ids_field,
            group_field=group_field,
            turn_sampling=turn_sampling,
            pairs=pairs,
            seed=analysis.seed,
            reward_field=rewards.reward_field,
        )
        with progress_bars(stderr) as progress:
            report = run_score(
                checkpoint, rollouts, settings, rollout_options=options,
                thresholds=gate.thresholds, flow_thresholds=gate.flow_thresholds, dump=dump,
                progress=progress,
            )  # fmt: skip
        write_per_prompt_table(report, per_prompt)
    gate_single_report(report, gate, f"{rollouts} under {checkpoint}", json_path, markdown, junit)


def obtain_report(
    path: Path, prompts: Path | None, settings: Settings, gate: Any, cache: Path,
    rescan: bool, progress: Any,
) -> Any:  # fmt: skip
    """A saved report (a report.json, or a dump directory), else a cached scan of the
    checkpoint at `path`."""
    from collapsecheck.discovery import find_checkpoints
    from collapsecheck.dump import REPORT_FILE
    from collapsecheck.report import Report
    from collapsecheck.runs import cached_scan

    if path.is_file():
        return Report.load(path)
    if (path / REPORT_FILE).is_file() and not (path / "config.json").exists():
        return Report.load(path / REPORT_FILE)
    single, run = find_checkpoints(path, settings.load.base_model)
    if run:
        raise CollapsecheckError(f"{path}: compare takes two checkpoints, not a run")
    return cached_scan(
        single, require_prompts(prompts), settings, cache_root=cache, rescan=rescan,
        thresholds=gate.thresholds, flow_thresholds=gate.flow_thresholds, progress=progress,
    )  # fmt: skip


@app.command()
@takes_settings
def compare(
    a: Annotated[Path, typer.Argument(help="Checkpoint A (the baseline), or its report.json.")],
    b: Annotated[Path, typer.Argument(help="Checkpoint B (the candidate), or its report.json.")],
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    prompts: Prompts = None,
    max_drop: Annotated[
        float | None,
        typer.Option(help="Tolerated drop of normalized MI and retrieval skill (default 0)."),
    ] = None,
    gate_exit: Annotated[
        bool,
        typer.Option("--gate/--no-gate", help="Exit 1 when B lost input dependence."),
    ] = True,
    allow_mismatch: Annotated[
        bool,
        typer.Option(
            "--allow-mismatch",
            help="Compare reports of other prompts or settings anyway (with a warning).",
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            help="Gate settings file (default: ./collapsecheck.toml or ./pyproject.toml)."
        ),
    ] = None,
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
    from collapsecheck.files import write_text_atomic
    from collapsecheck.gate import RuleResult, markdown_report

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = load_gate(config, max_drop=max_drop)
        check_outputs(
            {"--json": json_path, "--markdown": markdown, "--junit": junit}, {"--out": out}
        )
        cache = out or default_cache_root()
        with progress_bars(stderr) as progress:
            first, second = (
                obtain_report(path, prompts, settings, gate, cache, rescan, progress)
                for path in (a, b)
            )
        comparison = compare_reports(
            first, second, max_drop=gate.max_drop, resamples=analysis.bootstrap,
            seed=analysis.seed, allow_mismatch=allow_mismatch,
        )  # fmt: skip
        results = [RuleResult("input dependence", not comparison.lost, comparison.reason)]
        if json_path is not None:
            write_text_atomic(json_path, comparison.to_json())
        if markdown is not None:
            write_text_atomic(markdown, markdown_report(f"{a} vs {b}", second, results))
    print_comparison(stdout, comparison)
    with user_errors():
        finish_gate(results, junit, "collapsecheck.compare", enforce=gate_exit)


@app.command()
def spec() -> None:
    """Print the measurement contract: every metric, the verdict, the dump format."""
    from importlib.resources import files

    print(files("collapsecheck").joinpath("SPEC.md").read_text(encoding="utf-8"), end="")


def _print_version(value: bool) -> None:
    if value:
        from collapsecheck import __version__

        print(f"collapsecheck {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help=f"On an error, print its traceback too (or set {DEBUG_ENV}=1)."
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """collapsecheck: is the reasoning of an RL-trained policy still grounded in its input?"""
    if debug:
        state["debug"] = True


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a scan as Ctrl-C does: finished work is kept


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    signal.signal(signal.SIGTERM, _terminated)
    app(prog_name="collapsecheck")


if __name__ == "__main__":
    main()
