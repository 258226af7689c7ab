"""`collapsecheck watch`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from collapsecheck.cli.app import app, flags_given, say, stderr, stdout, user_errors
from collapsecheck.cli.finishing import dashboards, verdict_thresholds
from collapsecheck.cli.options import (
    Baseline,
    Every,
    NoTrainLog,
    Rollouts,
    ScanPrompts,
    TensorBoard,
    TrainKey,
    TrainLog,
    Verbose,
    WandbRun,
    WatchRun,
    parse_train_keys,
)
from collapsecheck.cli.settings_options import takes_settings
from collapsecheck.config import GateSettings
from collapsecheck.engines.backends.served_api import is_served
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
)


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
    every: Every = None,
    rollouts: Rollouts = None,
    train_log: TrainLog = None,
    no_train_log: NoTrainLog = False,
    train_key: TrainKey = None,
    baseline: Baseline = None,
    tensorboard: TensorBoard = None,
    wandb: WandbRun = None,
    verbose: Verbose = False,
) -> None:
    """Follow a training run (or a served policy, --every): diagnose each checkpoint as it lands."""
    from collapsecheck.reports.outputs import check_outputs
    from collapsecheck.reports.progress_display import progress_bars

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    if is_served(run_dir) or every is not None:
        refused = flags_given(rollouts=rollouts, baseline=baseline, train_log=train_log,
                              out=outputs.out, env=env_settings.env)  # fmt: skip
        code = watch_served(run_dir, every, prompts, settings, outputs, following, gate_settings,
                            refused, tensorboard, wandb, verbose)  # fmt: skip
        raise typer.Exit(code)
    run_dir = Path(run_dir)
    with user_errors():
        gate = gate_settings.load()
        check_outputs(outputs)  # before the work's imports (docs/decisions.md, "Start-up")
        from collapsecheck.runs.watch import Watch

        traces, settings = watched_traces(run_dir, settings, env_settings, prompts, rollouts,
                                          baseline)  # fmt: skip
        boards = dashboards(tensorboard, wandb, run_dir, outputs.out)
        after_step = step_outputs(run_dir, outputs, boards)
        with progress_bars(stderr) as progress:
            watcher = Watch(
                run_dir, traces, settings, following, gate, verdict_thresholds(gate),
                outputs.out, say, progress, after_step,
                training_log=False if no_train_log else (train_log or True),
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


def watch_served(
    url: str, every: str | None, prompts: Path | None, settings: Settings,
    outputs: OutputSettings, following: WatchSettings, gate_settings: GateSettings,
    refused: dict[str, bool], tensorboard: str | None, wandb: str | None, verbose: bool,
) -> int:  # fmt: skip
    """`watch URL --every DURATION`: the served policy diagnosed each interval
    (`runs.served_watch`), each diagnosis written as a run's step is; the exit code."""
    from collapsecheck.reports.outputs import check_outputs
    from collapsecheck.reports.progress_display import progress_bars

    with user_errors():
        if not is_served(url) or every is None:
            raise CollapsecheckError(
                "--every DURATION goes with a served policy's URL (http://HOST:PORT/v1): "
                f"watch {url} " + ("--every DURATION" if every is None else "is a run directory")
            )
        from collapsecheck.runs.served import ServedScan, require_servable
        from collapsecheck.runs.served_watch import ServedWatch, seconds

        gate = gate_settings.load()
        request = ServedScan(url, prompts, settings, outputs)
        require_servable(request, refused)
        interval = seconds(every)
        check_outputs(outputs)
        boards = served_dashboards(url, tensorboard, wandb)
        with progress_bars(stderr) as progress:
            watcher = ServedWatch(request, interval, following, gate, say, progress,
                                  step_outputs(url, outputs, boards))  # fmt: skip
            try:
                code = watcher.follow()
            finally:
                for board in boards:
                    board.close()
        if watcher.done:
            print_watched(watcher.run_report(), outputs, verbose)
    return code


def served_dashboards(url: str, tensorboard: str | None, wandb: str | None) -> list[Any]:
    """--tensorboard DIR and --wandb RUN_PATH for a served policy: a folder must be named
    (there is no run folder to find the trainer's in)."""
    from collapsecheck.reports.tensorboard import AUTO

    if tensorboard == AUTO:
        raise CollapsecheckError(
            "--tensorboard auto finds a run folder's event files: a served policy has none; "
            "name the folder (the trainer's TensorBoard log directory)"
        )
    return dashboards(tensorboard, wandb, Path(url), None)


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


def step_outputs(run_dir: Path | str, outputs: OutputSettings, boards: list[Any]) -> Any:
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
