"""`collapsecheck compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapsecheck.cli.app import app, say, stderr, stdout, user_errors
from collapsecheck.cli.finishing import finish_gate, write_page_and_summary
from collapsecheck.cli.options import (
    A,
    AllowMismatch,
    B,
    Config,
    GateExit,
    MaxDrop,
    Prompts,
    Rescan,
)
from collapsecheck.cli.settings_options import takes_settings
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
)


def obtain_report(
    target: str, prompts: Path | None, settings: Settings, gate: Any, cache: Path,
    rescan: bool, progress: Any, prior: Any = None, env: EnvSettings | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    """A saved report (a report.json, or a dump directory), a served policy's scan (`target`
    a URL; its reasoning is not scored under `prior`, said), else a cached scan of the
    checkpoint at `target` (with its reasoning also scored under `prior`, a checkpoint; played
    in `env`'s environment where it names one); with the checkpoint, None for a saved report
    or a served policy."""
    from collapsecheck.engines.backends.served_api import is_served
    from collapsecheck.inputs.discovery import find_checkpoints
    from collapsecheck.reports.dump import REPORT_FILE
    from collapsecheck.reports.report import Report
    from collapsecheck.runs.run import cached_play, cached_scan

    if is_served(target):
        return served_report(target, prompts, settings, progress, prior, env), None
    path = Path(target)
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
        return cached_play(single, env, settings, say=say, prompts=prompts, **common), single
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
    """Did checkpoint B lose input dependence relative to A, beyond noise?

    With --env, both are played from the same start states and their episodes compared pair
    by pair."""
    from collapsecheck.config import load_gate
    from collapsecheck.files import write_text_atomic
    from collapsecheck.reports.outputs import check_outputs
    from collapsecheck.reports.progress_display import progress_bars

    settings = Settings(load, sampling, rendering, scoring, analysis, rewards)
    with user_errors():
        gate = load_gate(config, max_drop=max_drop)
        check_outputs(outputs)  # before the work's imports (docs/decisions.md, "Start-up")
        from collapsecheck.reports.compare import compare_reports
        from collapsecheck.reports.console import print_comparison
        from collapsecheck.runs.cache import default_cache_root
        from collapsecheck.runs.join import read_against_start

        cache = outputs.out or default_cache_root()
        with progress_bars(stderr) as progress:
            first, second = both_reports(
                (a, b), prompts, settings, gate, cache, rescan, progress, env_settings
            )
        if second.prior.baseline is not None:
            read_against_start([second], first)
        comparison = compare_reports(
            first, second, max_drop=gate.max_drop, resamples=analysis.bootstrap,
            seed=analysis.seed, allow_mismatch=allow_mismatch,
        )  # fmt: skip
        results = compare_rules(comparison)
        if outputs.json_path is not None:
            write_text_atomic(outputs.json_path, comparison.to_json())
        write_page_and_summary(outputs, comparison, f"{a} vs {b}", second, results)
    print_comparison(stdout, comparison)
    with user_errors():
        finish_gate(results, outputs.junit, "collapsecheck.reports.compare", enforce=gate_exit)


def served_report(
    url: str, prompts: Path | None, settings: Settings, progress: Any, prior: Any,
    env: EnvSettings | None,
) -> Any:  # fmt: skip
    """A served policy's scan, as `scan URL` makes it (`runs.served`)."""
    from collapsecheck.runs.served import ServedScan, require_servable, scan_served

    request = ServedScan(url, prompts, settings, OutputSettings())
    require_servable(request, {"--env": env is not None and env.env is not None})
    if prior is not None:
        say(f"note: {url} is served: its reasoning is not also scored under A (that needs its "
            "checkpoint's files)")  # fmt: skip
    return scan_served(request, say, progress)


def both_reports(
    pair: tuple[str, str], prompts: Path | None, settings: Settings, gate: Any, cache: Path,
    rescan: bool, progress: Any, env: EnvSettings,
) -> tuple[Any, Any]:  # fmt: skip
    """A's report and B's: B's reasoning also scored under A, where A is a checkpoint (not in
    a played compare: each played its own contexts)."""
    first, start = obtain_report(pair[0], prompts, settings, gate, cache, rescan, progress, env=env)
    prior = None if env.env is not None else start
    second, _ = obtain_report(pair[1], prompts, settings, gate, cache, rescan, progress, prior, env)
    return first, second


def compare_rules(comparison: Any) -> list[Any]:
    """The gate's rules of a comparison: input dependence, and where the episodes were paired
    by start state, `episodes` (SPEC "Comparing two checkpoints on the same start states")."""
    from collapsecheck.reports.gate import RuleResult

    rules = [RuleResult("input dependence", not comparison.lost, comparison.reason)]
    if not comparison.episodes_paired:
        return rules
    worse = comparison.episodes_worse
    said = (
        f"on the same start states, B's {', '.join(worse)} did worse than A's beyond noise"
        if worse
        else "no episode metric did worse"
    )
    return [*rules, RuleResult("episodes", not worse, said)]
