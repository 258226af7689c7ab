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
    EnvSettings,
    LoadSettings,
    OutputSettings,
    PromptSettings,
    RewardSettings,
    SamplingSettings,
    ScoringSettings,
    Settings,
    WatchSettings,
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
state = {"debug": False}


def debug_from_environment() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


# The heading each settings group's options appear under in --help.
PANELS = {
    SamplingSettings: "Sampling",
    PromptSettings: "Prompts",
    ScoringSettings: "Reasoning and scoring",
    AnalysisSettings: "Analysis",
    RewardSettings: "Rewards (why it collapsed)",
    LoadSettings: "Model and engine",
    GateSettings: "Gate",
    OutputSettings: "Outputs",
    WatchSettings: "Following the run",
    EnvSettings: "Agents across turns",
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
    """One field as an option. A field the config file may set (`in_config`) defaults to
    None on the command line: `from_config_file` then fills it from the file, or leaves the
    field's own default."""
    meta = field.metadata
    flags = meta["flags"] or (flag_name(field.name),)
    kind = meta["cli_type"] or annotation
    filled = meta.get("in_config", False)
    if meta["cli_type"] is not None and (field.default is None or filled):
        kind = kind | None
    option = typer.Option(
        *flags, help=meta["help"], rich_help_panel=panel, metavar=meta.get("metavar")
    )
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None if filled else field.default,
        annotation=Annotated[kind, option],
    )


def from_config_file(
    fields: list[dataclasses.Field], values: dict[str, Any], config: Path | None
) -> dict[str, Any]:
    """The values of a settings group's fields, taken out of `values`: the command line's,
    then for a field the config file may set (`in_config`) and the command line left out,
    the file's (`config`: --config, where the command has it), else the field's default."""
    from collapsecheck.config import file_setting

    chosen = {}
    for field in fields:
        value = values.pop(field.name)
        if field.metadata.get("in_config") and value is None:
            found = file_setting(config, field.name)
            if found is None:
                continue
            value = parse_file_setting(field.name, *found)
        chosen[field.name] = value
    return chosen


def parse_file_setting(name: str, value: Any, where: str) -> Any:
    """A config file's value of a scan setting, checked where the file names it."""
    from collapsecheck.settings import parse_fractions

    parsers = {"early_answer_fractions": parse_fractions}
    if not isinstance(value, str | list):
        raise CollapsecheckError(f"{where}: expected a list or a comma-separated text")
    return parsers[name](value, where)


def offered(group: type, command: str) -> list[dataclasses.Field]:
    """The fields of a settings group that `command` offers: all of them, but for outputs,
    which name their commands."""
    return [
        f for f in dataclasses.fields(group) if command in f.metadata.get("commands", (command,))
    ]


def settings_options(group: type, command: str) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group)
    return [_option(f, hints[f.name], PANELS[group]) for f in offered(group, command)]


def takes_settings(command: Callable[..., None]) -> Callable[..., None]:
    """Expand each parameter typed with a settings dataclass into that dataclass's options;
    the command receives the dataclass, built and checked (`setting_checks`) before it runs."""
    from collapsecheck.setting_checks import check_group

    hints = typing.get_type_hints(command)
    signature = inspect.signature(command, eval_str=True)
    groups = {name: hint for name, hint in hints.items() if hint in PANELS}
    own = [p for name, p in signature.parameters.items() if name not in groups]
    # arguments and --prompts first, then the settings' options, then the command's own
    leading = [p for p in own if p.default is inspect.Parameter.empty or p.name == "prompts"]
    trailing = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p not in leading]
    name = command.__name__
    expanded = [option for group in groups.values() for option in settings_options(group, name)]

    @functools.wraps(command)
    def wrapper(**values: Any) -> None:
        built = {}
        with user_errors():
            config = values.get("config")
            for param, group in groups.items():
                built[param] = group(**from_config_file(offered(group, name), values, config))
                check_group(built[param])
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
ScanPrompts = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        "-p",
        help="Prompt set: JSONL, parquet (veRL) or plain text. With a run's veRL rollouts: the "
        "training prompt file their decoded inputs are matched to.",
    ),
]
Rescan = Annotated[
    bool,
    typer.Option("--rescan", help="Ignore cached results and kept traces: sample and score anew."),
]


def parse_train_keys(values: list[str]) -> dict[str, str]:
    """--train-key NAME=KEY, repeatable."""
    keys = {}
    for value in values:
        name, sep, key = value.partition("=")
        if not (sep and name and key):
            raise CollapsecheckError(f"--train-key expects NAME=KEY, got {value!r}")
        keys[name] = key
    return keys


def finish_gate(
    results: Sequence[Any], junit: Path | None, suite: str, enforce: bool = True
) -> None:
    """Write JUnit if asked; when enforcing, name each failing rule and exit 1 if any failed."""
    from collapsecheck.reports.gate import failures, write_junit

    if junit is not None:
        write_junit(junit, suite, results)
    failed = failures(results) if enforce else []
    for result in results:
        if enforce and result.undecided:
            stderr.print(f"[bold yellow]gate passed, undecided[/]: {escape(result.message)}")
    for result in failed:
        stderr.print(
            f"[bold red]gate failed[/] (rule: {escape(result.name)}): {escape(result.message)}"
        )
    if failed:
        raise typer.Exit(EXIT_FAIL)


def write_page_and_summary(
    outputs: OutputSettings, subject: Any, title: str, report: Any, results: Sequence[Any],
    run: Any = None,
) -> None:  # fmt: skip
    """--html (the page of `subject`: a report, a run or a comparison) and --markdown (the
    summary of `report` and its gate, with a link to the page)."""
    from collapsecheck.files import write_text_atomic
    from collapsecheck.reports.gate import markdown_report, page_link

    if outputs.html is not None:
        from collapsecheck.reports.html import write_html

        write_html(outputs.html, subject, title)
    if outputs.markdown is not None:
        link = page_link(outputs.html, os.environ)
        write_text_atomic(outputs.markdown, markdown_report(title, report, results, run, link))


def gate_single_report(
    report: Any, gate: Any, title: str, outputs: OutputSettings, verbose: bool = False
) -> None:
    """Write a report's outputs, print it (with its timing when `verbose`), and apply the
    gate to it."""
    from collapsecheck.reports.console import print_report, print_timing
    from collapsecheck.reports.gate import check_report

    with user_errors():
        results = check_report(report, gate)
        if outputs.json_path is not None:
            report.save(outputs.json_path)
        write_page_and_summary(outputs, report, title, report, results)
    print_report(stdout, report)
    if verbose:
        print_timing(stdout, report)
    with user_errors():
        finish_gate(results, outputs.junit, "collapsecheck")


def gate_run_report(
    run_report: Any, gate: Any, title: str, outputs: OutputSettings, verbose: bool = False
) -> None:
    """Write a run's outputs, print its table (and each step's timing when `verbose`), and
    apply the gate to its latest checkpoint."""
    from collapsecheck.reports.console import print_run, print_timing
    from collapsecheck.reports.gate import check_report
    from collapsecheck.reports.plot import plot_run

    with user_errors():
        latest = run_report.steps[-1]
        results = check_report(latest.report, gate)
        if outputs.json_path is not None:
            run_report.save(outputs.json_path)
        if outputs.plot is not None:
            plot_run(run_report, outputs.plot)
        title = f"{title} (latest: {latest.checkpoint.label})"
        write_page_and_summary(outputs, run_report, title, latest.report, results, run_report)
    print_run(stdout, run_report)
    if verbose:
        print_timing(stdout, run_report)
    with user_errors():
        finish_gate(results, outputs.junit, "collapsecheck")


def gate_report(
    report: Any, gate: Any, title: str, outputs: OutputSettings, verbose: bool = False
) -> None:
    """A run's report or one checkpoint's, written, printed and gated."""
    from collapsecheck.reports.run_report import RunReport

    gated = gate_run_report if isinstance(report, RunReport) else gate_single_report
    gated(report, gate, title, outputs, verbose)


def dashboards(
    tensorboard: str | None, wandb: str | None, run_dir: Path, cache: Path | None
) -> list[Any]:
    """--tensorboard DIR|auto and --wandb RUN_PATH, each refused before any work where its
    package is missing, or where the target is one checkpoint (no run, no steps)."""
    from collapsecheck.inputs.discovery import find_checkpoints
    from collapsecheck.runs.plan import cache_root

    if (tensorboard or wandb) and run_dir.exists() and find_checkpoints(run_dir)[0] is not None:
        raise CollapsecheckError(
            f"--tensorboard and --wandb write a run's checkpoints at their global steps: "
            f"{run_dir} is one checkpoint"
        )
    out: list[Any] = []
    if tensorboard is not None:
        from collapsecheck.reports.tensorboard import AUTO, TensorBoardWriter

        out.append(TensorBoardWriter(None if tensorboard == AUTO else Path(tensorboard), run_dir))
    if wandb is not None:
        from collapsecheck.reports.weights_and_biases import WandbWriter

        out.append(WandbWriter(wandb, cache_root(cache)))
    return out


def say(line: str) -> None:
    """A line for the user beside the results (the plan, a note), on stderr."""
    stderr.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)


def verdict_thresholds(gate: Any) -> Any:
    from collapsecheck.runs.units import VerdictThresholds

    return VerdictThresholds(gate.thresholds, gate.flow_thresholds)


# -- commands ----------------------------------------------------------------------------

# The commands' own options (the settings dataclasses bring the rest).
Checkpoint = Annotated[
    Path, typer.Argument(help="A checkpoint directory, or a run directory of checkpoints.")
]

TrainLog = Annotated[
    Path | None,
    typer.Option(
        help="The run's training log: trainer_state.json, veRL file logger JSONL, "
        "JSONL/CSV with a step column, or TensorBoard events."
    ),
]

NoTrainLog = Annotated[
    bool, typer.Option("--no-train-log", help="Do not read the run's training log.")
]

TrainKey = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME=KEY: read series NAME from log key KEY (repeatable).", metavar="NAME=KEY"
    ),
]

Baseline = Annotated[
    Path | None,
    typer.Option(
        help="The policy the run started from: scanned as step 0 of a run (or beside one "
        "checkpoint), and each checkpoint's reasoning also scored under it (SPEC \"Scored "
        'under the start").'
    ),
]

Shard = Annotated[
    str | None,
    typer.Option(
        help="I/N: scan share I (0-based) of N of a run's checkpoints into the results "
        "cache; a plain scan of the run joins them. Read from a Slurm array's "
        "SLURM_ARRAY_TASK_ID when set.",
        rich_help_panel="Where the work runs",
    ),
]

DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan (checkpoints, cached ones, pairs, a token bound) and exit.",
        rich_help_panel="Where the work runs",
    ),
]

Rollouts = Annotated[
    Path | None,
    typer.Option(
        help="A run's rollouts, as its trainer wrote them (veRL's rollout_data_dir, ROLL's "
        "rollout_dump_dir, AReaL's rollout/, ...; TRL's completions/, slime's rollout_data/, "
        "SkyRL's dumped_evals/ and prime-rl's rollouts/ are found in the run directory): each "
        "step's scored under the checkpoint that sampled it, with no sampling. Used by default "
        "where a run holds them.",
        rich_help_panel="Where the traces come from",
    ),
]

Sample = Annotated[
    bool,
    typer.Option(
        "--sample",
        help="Sample afresh from --prompts, even where the run holds its trainer's rollouts.",
        rich_help_panel="Where the traces come from",
    ),
]

Ray = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="Scan each uncached checkpoint of the run as one Ray task (one GPU each, or "
        "one CPU), then write the run report here. ADDRESS: host:port or ray://host:port, "
        "auto (the cluster running here, a veRL job's) or local (a new one); a bare --ray "
        "does as ray.init(): RAY_ADDRESS, else a cluster running here, else a new local one.",
        rich_help_panel="Where the work runs",
    ),
]

ScoreRollouts = Annotated[
    Path,
    typer.Argument(
        help="Rollouts (JSONL or parquet), a trainer's own dump file or step folder (TRL, "
        "veRL, slime, SkyRL, AReaL, ROLL, prime-rl, RAGEN), or a --dump directory."
    ),
]

ScoreCheckpoint = Annotated[
    Path, typer.Option("--checkpoint", "-c", help="The policy that produced the rollouts.")
]

ScorePrompts = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        "-p",
        help="veRL rollout dumps: the training prompt file (parquet or JSONL); each decoded "
        "input is matched to its row and scored in the context the trainer rendered.",
    ),
]

ResponseField = Annotated[
    str | None, typer.Option(help="Field of the response text [response/output/completion].")
]

ResponseIdsField = Annotated[
    str | None, typer.Option(help="Field of the response's sampled token ids, if any.")
]

GroupField = Annotated[
    str | None, typer.Option(help="Field grouping rows by prompt [uid/group_id/prompt_id].")
]

TurnSampling = Annotated[str, typer.Option(help="Multi-turn rollouts: turn, trajectory or first.")]

Pairs = Annotated[
    int | None, typer.Option(help="Multi-turn rollouts: (trajectory, turn) pairs to sample.")
]

TensorBoard = Annotated[
    str | None,
    typer.Option(
        "--tensorboard", metavar="DIR|auto",
        help="Write each checkpoint's diagnosis as TensorBoard scalars (collapse/...) at its "
        "global step, as a run of its own in DIR/collapsecheck (point DIR into the trainer's "
        "log folder); auto: the folder of the trainer's own event files under the run "
        "directory. Needs the tensorboard package (the logs extra).",
        rich_help_panel="Dashboards",
    ),
]  # fmt: skip

WandbRun = Annotated[
    str | None,
    typer.Option(
        "--wandb", metavar="ENTITY/PROJECT/RUN_ID",
        help="Log each checkpoint's diagnosis into the trainer's W&B run (shared mode while "
        "the trainer holds it, resumed by id once it ended; WANDB_MODE=offline: an offline "
        "run of that id), at collapse/global_step. Needs the wandb package (the wandb extra).",
        rich_help_panel="Dashboards",
    ),
]  # fmt: skip

Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v",
        help="Also print where the time went: loading, sampling (new tokens per second) and "
        "scoring (tokens per second), per checkpoint.",
    ),
]  # fmt: skip

A = Annotated[
    Path,
    typer.Argument(
        help="Checkpoint A (the baseline; a checkpoint B is also scored under it), or its "
        "report.json."
    ),
]

B = Annotated[Path, typer.Argument(help="Checkpoint B (the candidate), or its report.json.")]

MaxDrop = Annotated[
    float | None,
    typer.Option(help="Tolerated drop of normalized MI and retrieval skill (default 0)."),
]

GateExit = Annotated[
    bool,
    typer.Option("--gate/--no-gate", help="Exit 1 when B lost input dependence."),
]

AllowMismatch = Annotated[
    bool,
    typer.Option(
        "--allow-mismatch",
        help="Compare reports of other prompts or settings anyway (with a warning).",
    ),
]

Config = Annotated[
    Path | None,
    typer.Option(help="Gate settings file (default: ./collapsecheck.toml or ./pyproject.toml)."),
]


@app.command()
@takes_settings
def scan(
    checkpoint: Checkpoint,
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    gate_settings: GateSettings,
    outputs: OutputSettings,
    env_settings: EnvSettings,
    prompts: ScanPrompts = None,
    rescan: Rescan = False,
    train_log: TrainLog = None,
    no_train_log: NoTrainLog = False,
    train_key: TrainKey = None,
    baseline: Baseline = None,
    shard: Shard = None,
    dry_run: DryRun = False,
    rollouts: Rollouts = None,
    sample: Sample = False,
    ray: Ray = None,
    tensorboard: TensorBoard = None,
    wandb: WandbRun = None,
    verbose: Verbose = False,
) -> None:
    """Sample, cross-score and diagnose a checkpoint, or every checkpoint of a run directory."""
    from collapsecheck.reports.console import progress_bars
    from collapsecheck.reports.outputs import write_prompt_outputs
    from collapsecheck.runs.request import ScanRequest, carry_out

    with user_errors():
        gate = gate_settings.load()
        boards = dashboards(tensorboard, wandb, checkpoint, outputs.out)
        request = ScanRequest(
            checkpoint, Settings(load, sampling, rendering, scoring, analysis, rewards), outputs,
            verdict_thresholds(gate), prompts, rollouts, sample, baseline,
            False if no_train_log else (train_log or True), parse_train_keys(train_key or []),
            shard, ray, dry_run, rescan, env_settings,
        )  # fmt: skip
        with progress_bars(stderr) as progress:
            outcome = carry_out(request, say, progress)
        if dry_run:
            stdout.print(outcome.planned.plan.line(), markup=False, highlight=False, soft_wrap=True)
        if outcome.report is None:
            return
        kept = write_prompt_outputs(
            outcome.last_report, outputs, outcome.planned.prompt_file, request.settings
        )
        if kept:
            say(kept)
        for board in boards:
            board.write_run(outcome.report)
            board.close()
    gate_report(outcome.report, gate, str(checkpoint), outputs, verbose)


WatchRun = Annotated[
    Path, typer.Argument(help="The run directory a trainer is writing (it may not exist yet).")
]


@app.command()
@takes_settings
def watch(
    run_dir: WatchRun,
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    gate_settings: GateSettings,
    outputs: OutputSettings,
    following: WatchSettings,
    env_settings: EnvSettings,
    prompts: ScanPrompts = None,
    rollouts: Rollouts = None,
    train_log: TrainLog = None,
    no_train_log: NoTrainLog = False,
    train_key: TrainKey = None,
    baseline: Baseline = None,
    tensorboard: TensorBoard = None,
    wandb: WandbRun = None,
    verbose: Verbose = False,
) -> None:
    """Follow a run that is still training: diagnose each checkpoint as soon as its trainer
    has written it whole, into the console, the results cache, --html and the dashboard."""
    from collapsecheck.reports.console import progress_bars
    from collapsecheck.reports.outputs import check_outputs
    from collapsecheck.runs.watch import Watch

    with user_errors():
        gate = gate_settings.load()
        check_outputs(outputs)
        settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
        traces, settings = watched_traces(
            run_dir, settings, env_settings, prompts, rollouts, baseline
        )
        boards = dashboards(tensorboard, wandb, run_dir, outputs.out)
        after_step = step_outputs(run_dir, outputs, boards)
        with progress_bars(stderr) as progress:
            watcher = Watch(
                run_dir, traces, settings,
                following, gate, verdict_thresholds(gate), outputs.out, say, progress,
                after_step, training_log=False if no_train_log else (train_log or True),
                train_keys=parse_train_keys(train_key or []),
                baseline=start_policy(baseline, load),
            )  # fmt: skip
            try:
                code = watcher.follow()
            finally:
                for board in boards:
                    board.close()
        if watcher.followed.done:
            print_watched(watcher.run_report(), outputs, verbose)
    raise typer.Exit(code)


def watched_traces(
    run_dir: Path, settings: Settings, env: EnvSettings, prompts: Path | None,
    rollouts: Path | None, baseline: Path | None,
) -> tuple[Any, Settings]:  # fmt: skip
    """Where watch's traces come from, and the settings it diagnoses with (an environment's
    own config fills those the flags leave unset)."""
    from collapsecheck.runs.units import PlayedTraces
    from collapsecheck.runs.watch import PlayedIn, SampledFrom, TrainerRollouts

    if env.env is not None:
        others = {"--prompts": prompts, "--rollouts": rollouts, "--baseline": baseline,
                  "--reward-fn": settings.rewards.reward_fn}  # fmt: skip
        played, settings = PlayedTraces.load(env, others, run_dir).resolved(settings)
        for note in played.notes():
            say(f"note: {note}")
        return PlayedIn(played), settings
    if rollouts is not None or prompts is None:  # -p with --rollouts: veRL's prompt file
        return TrainerRollouts(rollouts, prompts), settings
    return SampledFrom(prompts), settings


def start_policy(baseline: Path | None, load: LoadSettings) -> Any:
    """watch's --baseline, checked before the run has a checkpoint (each step's tokenizer is
    checked against it as the step lands)."""
    from collapsecheck.inputs.baseline import require_baseline

    if baseline is None:
        return None
    return require_baseline(baseline, [], load.base_model, load.trust_remote_code)


def step_outputs(run_dir: Path, outputs: OutputSettings, boards: list[Any]) -> Any:
    """What `watch` writes after each step: --html (the run so far) and the dashboards."""

    def after_step(run: Any, row: Any, report: Any) -> None:
        if outputs.html is not None:
            from collapsecheck.reports.html import write_html

            write_html(outputs.html, run, f"{run_dir} (watching; latest: step {row.label})")
        for board in boards if row.step is not None else []:
            board.write(row.step, report)

    return after_step


def print_watched(run: Any, outputs: OutputSettings, verbose: bool) -> None:
    """The end of a watch: --json, the run table (and its timing with --verbose)."""
    from collapsecheck.reports.console import print_run, print_timing

    if outputs.json_path is not None:
        run.save(outputs.json_path)
    print_run(stdout, run)
    if verbose:
        print_timing(stdout, run)


@app.command()
@takes_settings
def score(
    rollouts: ScoreRollouts,
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    gate_settings: GateSettings,
    outputs: OutputSettings,
    checkpoint: ScoreCheckpoint,
    prompts: ScorePrompts = None,
    response_field: ResponseField = None,
    response_ids_field: ResponseIdsField = None,
    group_field: GroupField = None,
    turn_sampling: TurnSampling = "turn",
    pairs: Pairs = None,
    verbose: Verbose = False,
) -> None:
    """Diagnose traces that training already sampled: cross-scoring only, no generation."""
    from collapsecheck.inputs.rollouts import RolloutOptions
    from collapsecheck.reports.console import progress_bars
    from collapsecheck.reports.outputs import (
        check_keep_rollout_prompts,
        check_outputs,
        write_prompt_outputs,
    )
    from collapsecheck.runs.executors import run_here
    from collapsecheck.runs.plan import plan_rollout_file, read_rollouts_checked

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = gate_settings.load()
        check_outputs(outputs)
        options = RolloutOptions(
            rendering.prompt_field, response_field, response_ids_field, group_field,
            turn_sampling, pairs, analysis.seed, rewards.reward_field, scoring.state_regex,
        )  # fmt: skip
        parsed = read_rollouts_checked(rollouts, options, prompts)  # before the checkpoint
        if outputs.keep_prompts is not None:
            check_keep_rollout_prompts(outputs.keep_prompts, rollouts, parsed, prompts)
        plan = plan_rollout_file(
            checkpoint_row(checkpoint, load), rollouts, options, settings,
            training_prompts=prompts, dump=outputs.dump, parsed=parsed,
        )  # fmt: skip
        with progress_bars(stderr) as progress:
            (report,) = run_here(plan, verdict_thresholds(gate), progress, labelled=False)
        for note in score_notes(report):
            say(note)
        kept = write_prompt_outputs(report, outputs, None, settings)
        if kept:
            say(kept)
    gate_single_report(report, gate, f"{rollouts} under {checkpoint}", outputs, verbose)


def checkpoint_row(path: Path, load: LoadSettings) -> Any:
    """The checkpoint `score` names, recognised before its rollouts are read."""
    from collapsecheck.inputs.checkpoint import require_checkpoint
    from collapsecheck.runs.run import single_row

    return single_row(require_checkpoint(path, load.base_model))


def score_notes(report: Any) -> list[str]:
    """What reading the rollouts decided (the trainer's reader, matching veRL's inputs, the
    saved configuration that gave their temperature)."""
    from collapsecheck.inputs.sampled_temperature import UNSAID, temperature_line

    notes = report.settings.get("trainer_rollouts", {}).get("notes", [])
    if "prompt_matching" in report.settings:
        notes = [*notes, report.settings["prompt_matching"]]
    said = temperature_line(report.settings, report.warnings)
    if said is not None and said[0] != UNSAID:  # that one is among the report's warnings
        notes = [*notes, said[1]]
    return notes


def obtain_report(
    path: Path, prompts: Path | None, settings: Settings, gate: Any, cache: Path,
    rescan: bool, progress: Any, prior: Any = None, env: EnvSettings | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """A saved report (a report.json, or a dump directory), else a cached scan of the
    checkpoint at `path` (with its reasoning also scored under `prior`, a checkpoint; played
    in `env`'s environment where it names one); with the checkpoint, None for a saved
    report."""
    from collapsecheck.inputs.discovery import find_checkpoints
    from collapsecheck.reports.dump import REPORT_FILE
    from collapsecheck.reports.report import Report
    from collapsecheck.runs.run import cached_play, cached_scan

    if path.is_file():
        return Report.load(path), None
    if (path / REPORT_FILE).is_file() and not (path / "config.json").exists():
        return Report.load(path / REPORT_FILE), None
    single, run = find_checkpoints(path, settings.load.base_model)
    if run:
        raise CollapsecheckError(f"{path}: compare takes two checkpoints, not a run")
    common = {
        "cache_root": cache, "rescan": rescan, "thresholds": gate.thresholds,
        "flow_thresholds": gate.flow_thresholds, "progress": progress,
    }  # fmt: skip
    if env is not None and env.env is not None:
        return cached_play(single, env, settings, say=say, **common), single
    if prompts is None:
        raise CollapsecheckError("--prompts FILE (or --env SPEC) is needed to scan a checkpoint")
    return cached_scan(single, prompts, settings, prior=prior, **common), single


@app.command()
@takes_settings
def compare(
    a: A,
    b: B,
    sampling: SamplingSettings,
    rendering: PromptSettings,
    scoring: ScoringSettings,
    analysis: AnalysisSettings,
    rewards: RewardSettings,
    load: LoadSettings,
    outputs: OutputSettings,
    env_settings: EnvSettings,
    prompts: Prompts = None,
    max_drop: MaxDrop = None,
    gate_exit: GateExit = True,
    allow_mismatch: AllowMismatch = False,
    config: Config = None,
    rescan: Rescan = False,
) -> None:
    """Did checkpoint B lose input dependence relative to A, beyond noise? With --env, both
    are played from the same start states and their episodes compared pair by pair."""
    from collapsecheck.config import load_gate
    from collapsecheck.files import write_text_atomic
    from collapsecheck.reports.compare import compare_reports
    from collapsecheck.reports.console import print_comparison, progress_bars
    from collapsecheck.reports.gate import RuleResult
    from collapsecheck.reports.outputs import check_outputs
    from collapsecheck.runs.cache import default_cache_root
    from collapsecheck.runs.join import read_against_start

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = load_gate(config, max_drop=max_drop)
        check_outputs(outputs)
        cache = outputs.out or default_cache_root()
        with progress_bars(stderr) as progress:
            if env_settings.env is not None and prompts is not None:
                raise CollapsecheckError("--env plays both checkpoints: --prompts goes without it")
            first, start = obtain_report(
                a, prompts, settings, gate, cache, rescan, progress, env=env_settings
            )
            # B's reasoning is also scored under A, where A is a checkpoint (not in a played
            # compare: each played its own contexts)
            prior = None if env_settings.env is not None else start
            second, _ = obtain_report(
                b, prompts, settings, gate, cache, rescan, progress, prior, env_settings
            )
        if second.prior.baseline is not None:
            read_against_start([second], first)
        comparison = compare_reports(
            first, second, max_drop=gate.max_drop, resamples=analysis.bootstrap,
            seed=analysis.seed, allow_mismatch=allow_mismatch,
        )  # fmt: skip
        results = [RuleResult("input dependence", not comparison.lost, comparison.reason)]
        results += episode_rule(comparison)
        if outputs.json_path is not None:
            write_text_atomic(outputs.json_path, comparison.to_json())
        write_page_and_summary(outputs, comparison, f"{a} vs {b}", second, results)
    print_comparison(stdout, comparison)
    with user_errors():
        finish_gate(results, outputs.junit, "collapsecheck.reports.compare", enforce=gate_exit)


def episode_rule(comparison: Any) -> list[Any]:
    """The gate's `episodes` rule where the episodes were paired by start state (SPEC
    "Comparing two checkpoints on the same start states")."""
    from collapsecheck.reports.gate import RuleResult

    if not comparison.episodes_paired:
        return []
    worse = comparison.episodes_worse
    said = (
        f"on the same start states, B's {', '.join(worse)} did worse than A's beyond noise"
        if worse
        else "no episode metric did worse"
    )
    return [RuleResult("episodes", not worse, said)]


@app.command()
def spec() -> None:
    """Print the measurement contract: every metric, the verdict, the dump format."""
    from importlib.resources import files

    print(files("collapsecheck").joinpath("SPEC.md").read_text(encoding="utf-8"), end="")


def _print_version(value: bool) -> None:
    if value:
        from collapsecheck.version import __version__

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
    state["debug"] = debug or debug_from_environment()  # per invocation, never left over


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a scan as Ctrl-C does: finished work is kept


def bare_options(argv: Sequence[str]) -> list[str]:
    """`--ray` given with no value (last, or before another option) becomes `--ray=default`:
    typer's options either always or never take a value."""
    from collapsecheck.runs.executors import RAY_DEFAULT

    return [
        f"--ray={RAY_DEFAULT}"
        if arg == "--ray" and (at + 1 == len(argv) or argv[at + 1].startswith("-"))
        else arg
        for at, arg in enumerate(argv)
    ]


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    signal.signal(signal.SIGTERM, _terminated)
    app(args=bare_options(sys.argv[1:]), prog_name="collapsecheck")


if __name__ == "__main__":
    main()
