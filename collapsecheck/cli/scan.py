"""`collapsecheck scan`."""

from __future__ import annotations

from collapsecheck.cli.app import app, say, stderr, stdout, user_errors
from collapsecheck.cli.finishing import dashboards, gate_report, verdict_thresholds
from collapsecheck.cli.options import (
    Baseline,
    Checkpoint,
    DryRun,
    NoTrainLog,
    Ray,
    Rescan,
    Rollouts,
    Sample,
    ScanPrompts,
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
    from collapsecheck.reports.outputs import write_prompt_outputs
    from collapsecheck.reports.progress_display import progress_bars
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
