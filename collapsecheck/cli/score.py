"""`collapsecheck score`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapsecheck.cli.app import app, say, stderr, user_errors
from collapsecheck.cli.finishing import gate_single_report, verdict_thresholds
from collapsecheck.cli.options import (
    GroupField,
    Pairs,
    ResponseField,
    ResponseIdsField,
    ScoreCheckpoint,
    ScorePrompts,
    ScoreRollouts,
    ScoreServer,
    TurnSampling,
    Verbose,
)
from collapsecheck.cli.settings_options import takes_settings
from collapsecheck.config import GateSettings
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import (
    AnalysisSettings,
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
    checkpoint: ScoreCheckpoint = None,
    server: ScoreServer = None,
    prompts: ScorePrompts = None,
    response_field: ResponseField = None,
    response_ids_field: ResponseIdsField = None,
    group_field: GroupField = None,
    turn_sampling: TurnSampling = "turn",
    pairs: Pairs = None,
    verbose: Verbose = False,
) -> None:
    """Diagnose traces that training already sampled: cross-scoring only, no generation."""
    from collapsecheck.reports.outputs import (
        check_keep_rollout_prompts,
        check_outputs,
        write_prompt_outputs,
    )
    from collapsecheck.reports.progress_display import progress_bars

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = gate_settings.load()
        require_one_policy(checkpoint, server)
        check_outputs(outputs)  # before the work's imports (docs/decisions.md, "Start-up")
        from collapsecheck.inputs.rollouts import RolloutOptions
        from collapsecheck.runs.plan import read_rollouts_checked
        from collapsecheck.runs.served import score_served

        options = RolloutOptions(
            rendering.prompt_field, response_field, response_ids_field, group_field,
            turn_sampling, pairs, analysis.seed, rewards.reward_field, scoring.state_regex,
        )  # fmt: skip
        parsed = read_rollouts_checked(rollouts, options, prompts)  # before the checkpoint
        if outputs.keep_prompts is not None:
            check_keep_rollout_prompts(outputs.keep_prompts, rollouts, parsed, prompts)
        with progress_bars(stderr) as progress:
            if server is not None:
                report = score_served(server, rollouts, settings, options, prompts,
                                      outputs.dump, parsed, say, progress)  # fmt: skip
            else:
                report = scored_under(checkpoint, rollouts, settings, options, prompts,
                                      outputs.dump, parsed, gate, progress)  # fmt: skip
        for note in score_notes(report):
            say(note)
        kept = write_prompt_outputs(report, outputs, None, settings)
        if kept:
            say(kept)
    gate_single_report(report, gate, f"{rollouts} under {checkpoint or server}", outputs, verbose)


def require_one_policy(checkpoint: Path | None, server: str | None) -> None:
    if (checkpoint is None) == (server is None):
        raise CollapsecheckError(
            "score needs the policy that produced the rollouts: --checkpoint DIR or --server "
            "URL, one of them"
        )


def scored_under(
    checkpoint: Path, rollouts: Path, settings: Settings, options: Any, prompts: Path | None,
    dump: Path | None, parsed: Any, gate: Any, progress: Any,
) -> Any:  # fmt: skip
    """The rollouts scored under the checkpoint, as a plan of one unit (the results cache)."""
    from collapsecheck.runs.executors import run_here
    from collapsecheck.runs.plan import plan_rollout_file

    plan = plan_rollout_file(
        checkpoint_row(checkpoint, settings.load), rollouts, options, settings,
        training_prompts=prompts, dump=dump, parsed=parsed,
    )  # fmt: skip
    (report,) = run_here(plan, verdict_thresholds(gate), progress, labelled=False)
    return report


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
