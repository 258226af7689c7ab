"""`collapsecheck scan`."""

from __future__ import annotations

from pathlib import Path

from collapsecheck.cli.app import app, flags_given, say, stderr, stdout, user_errors
from collapsecheck.cli.finishing import dashboards, gate_report, verdict_thresholds
from collapsecheck.cli.options import (
    Baseline,
    DryRun,
    NoTrainLog,
    Ray,
    Rescan,
    Rollouts,
    Sample,
    ScanPrompts,
    ScanTarget,
    Shard,
    TensorBoard,
    TrainKey,
    TrainLog,
    Verbose,
    WandbRun,
    parse_train_keys,
)
from collapsecheck.cli.settings_options import takes_settings
from collapsecheck.config import GateSettings
from collapsecheck.engines.backends.served_api import is_served
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
)


@app.command()
@takes_settings
def scan(
    checkpoint: ScanTarget,
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
    from collapsecheck.reports.outputs import write_prompt_outputs
    from collapsecheck.reports.progress_display import progress_bars
    from collapsecheck.runs.request import ScanRequest, carry_out

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    if is_served(checkpoint):
        refused = flags_given(rollouts=rollouts, baseline=baseline, train_log=train_log,
                              shard=shard, ray=ray, tensorboard=tensorboard, wandb=wandb,
                              dry_run=dry_run, out=outputs.out, env=env_settings.env)  # fmt: skip
        return scan_served_command(checkpoint, prompts, settings, outputs, refused, gate_settings,
                                   verbose)  # fmt: skip
    with user_errors():
        gate = gate_settings.load()
        boards = dashboards(tensorboard, wandb, Path(checkpoint), outputs.out)
        request = ScanRequest(
            Path(checkpoint), settings, outputs, verdict_thresholds(gate), prompts, rollouts,
            sample, baseline, False if no_train_log else (train_log or True),
            parse_train_keys(train_key or []), shard, ray, dry_run, rescan, env_settings,
        )  # fmt: skip
        with progress_bars(stderr) as progress:
            outcome = carry_out(request, say, progress)
        if dry_run:
            stdout.print(outcome.planned.plan.line(), markup=False, highlight=False, soft_wrap=True)
        if outcome.report is None:
            return
        kept = write_prompt_outputs(outcome.last_report, outputs, outcome.planned.prompt_file,
                                    request.settings)  # fmt: skip
        if kept:
            say(kept)
        for board in boards:
            board.write_run(outcome.report)
            board.close()
    gate_report(outcome.report, gate, str(checkpoint), outputs, verbose)


def scan_served_command(
    url: str, prompts: Path | None, settings: Settings, outputs: OutputSettings,
    refused: dict[str, bool], gate_settings: GateSettings, verbose: bool,
) -> None:  # fmt: skip
    """`scan URL`: the served policy scanned (`runs.served`), written, printed and gated as
    one checkpoint's scan is."""
    from collapsecheck.reports.outputs import check_outputs, write_prompt_outputs
    from collapsecheck.reports.progress_display import progress_bars
    from collapsecheck.runs.served import ServedScan, require_servable, scan_served

    request = ServedScan(url, prompts, settings, outputs)
    with user_errors():
        gate = gate_settings.load()
        require_servable(request, refused)
        check_outputs(request.outputs)
        with progress_bars(stderr) as progress:
            report = scan_served(request, say, progress)
        kept = write_prompt_outputs(report, request.outputs, request.prompts, request.settings)
        if kept:
            say(kept)
    gate_report(report, gate, request.url, request.outputs, verbose)
