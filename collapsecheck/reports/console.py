"""Report out, for a person at a terminal: the metric table, the verdict line (the progress
bars beside the work are `progress_display`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from collapsecheck.formatting import (
    format_metric,
    format_number,
    plural,
    prompts_phrase,
    samples_phrase,
)
from collapsecheck.measures.by_turn import stops_reading
from collapsecheck.measures.episodes import EPISODE_KEYS
from collapsecheck.measures.image_share import READINGS, image_reading
from collapsecheck.measures.metrics import Estimate, MetricValue, interval_text, point_value
from collapsecheck.measures.per_prompt import most_collapsed
from collapsecheck.measures.token_information import POSITION_PREFIX
from collapsecheck.measures.verdict import GROUNDED, INCONCLUSIVE
from collapsecheck.reports.compare import Comparison
from collapsecheck.reports.fitted_table import Column, fitted_tables, table_of
from collapsecheck.reports.report import FLOW_METRICS, KEY_METRICS, Report
from collapsecheck.reports.run_report import RunReport

REGIME_STYLES = {GROUNDED: "bold green", INCONCLUSIVE: "bold yellow"}
COLLAPSE_STYLE = "bold red"
EXAMPLE_CHARS = 400
EXAMPLE_TITLE = 70


def _format(x: float) -> str:
    return format_number(x)


def _interval(metric: MetricValue, key: str = "") -> str:
    """A metric's 95% interval, each end as `format_metric` shows it (none where both ends
    are past what a person reads)."""
    if not isinstance(metric, Estimate):
        return ""
    low, high = format_metric(key, metric.low), format_metric(key, metric.high)
    return "" if low == high and low.startswith(">") else f"[{low}, {high}]"


def metrics_table(report: Report) -> Table:
    table = Table(title="collapsecheck", title_justify="left", show_edge=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% interval", justify="right")
    keys = KEY_METRICS + (FLOW_METRICS if report.flow.regime != "not_measured" else ())
    keys += EPISODE_KEYS if report.episodes.regime != "not_measured" else ()
    for key in keys:
        interval = _interval(report.metrics[key], key)
        label = key
        if key == "retrieval_accuracy":
            label += f" (chance {report.value('retrieval_chance_level'):.3f})"
        table.add_row(label, format_metric(key, report.value(key)), interval)
    return table


def regime_text(report: Report) -> Text:
    verdict = report.verdict
    return Text(verdict.label, style=REGIME_STYLES.get(verdict.regime, COLLAPSE_STYLE))


def verdict_line(report: Report) -> Text:
    line = Text("verdict: ", style="bold")
    line.append_text(regime_text(report))
    line.append(f" — {report.verdict.reason}")
    return line


FLOW_STYLES = {"faithful": "bold green", "not_measured": "dim", "inconclusive": "bold yellow"}


def flow_line(report: Report) -> Text:
    """The information flow, X -> Z -> A, in one line under the verdict."""
    regime = report.flow.regime
    line = Text("flow: ", style="bold")
    line.append(regime.replace("_", " "), style=FLOW_STYLES.get(regime, COLLAPSE_STYLE))
    line.append(f" — {report.flow.reason}")
    return line


EARLY_STYLES = {"reasoning_decides": "bold green", "inconclusive": "bold yellow"}


def early_answer_line(report: Report) -> Text | None:
    """When the action is decided (SPEC "Early answering"), in one line under the flow's;
    None where it was not measured (the flow line says why)."""
    early = report.early_answer
    if early.regime == "not_measured":
        return None
    line = Text("early answer: ", style="bold")
    line.append(
        early.regime.replace("_", " "), style=EARLY_STYLES.get(early.regime, COLLAPSE_STYLE)
    )
    kept = " | ".join(f"{100 * f:.0f}" for f in early.fractions)
    agrees = " | ".join(f"{100 * r.value:.0f}" for r in early.relative)
    line.append(
        f" — {early.reason}; forced after {kept}% of the reasoning, it agrees {agrees}% as often"
    )
    return line


WHERE_STYLES = {"early": "bold green", "spread": "bold green", "late": "bold green"}


def where_line(report: Report) -> Text | None:
    """Where the input shows in the reasoning (SPEC "Where the input shows"), in one line
    under the verdict; None where it was not measured."""
    where = report.token_information
    if where.regime == "not_measured":
        return None
    line = Text("where the input shows: ", style="bold")
    line.append(where.regime, style=WHERE_STYLES.get(where.regime, COLLAPSE_STYLE))
    line.append(f" — {where.reason}")
    return line


def print_decisions(console: Console, report: Report) -> None:
    """The verdict, where the input shows, the flow's and early answering's lines."""
    console.print(verdict_line(report))
    where = where_line(report)
    if where is not None:
        console.print(where)
    console.print(flow_line(report))
    early = early_answer_line(report)
    if early is not None:
        console.print(early)
    for line in (episodes_line(report), by_turn_line(report)):
        if line is not None:
            console.print(line)


EPISODE_STYLES = {"progressing": "bold green", "inconclusive": "bold yellow"}


def episodes_line(report: Report) -> Text | None:
    """SPEC "Agents across turns": the episodes' reading in one line; None without episodes."""
    episodes = report.episodes
    if episodes.regime == "not_measured" and not episodes.episodes:
        return None
    line = Text("episodes: ", style="bold")
    line.append(episodes.regime, style=EPISODE_STYLES.get(episodes.regime, COLLAPSE_STYLE))
    success = report.metrics.get("success_rate")
    done = f", success {point_value(success):.2f}" if success is not None else ""
    done += "".join(f", {key} {share:.2f}" for key, share in episodes.info.items())
    line.append(
        f" — {episodes.reason} ({plural(episodes.episodes, 'episode')} from "
        f"{plural(episodes.starts, 'start state')}{done})"
    )
    return line


def by_turn_line(report: Report) -> Text | None:
    """Input dependence by turn (SPEC "Agents across turns"): each turn's normalized MI with
    its interval, and the finding where the agent stops reading its state."""
    if not report.by_turn:
        return None
    line = Text("by turn: ", style="bold")
    cells = []
    for entry in report.by_turn:
        if not entry.measured:
            cells.append(f"turn {entry.turn} not measured (N={entry.contexts})")
            continue
        metric = entry.metrics["normalized_mi"]
        cells.append(f"turn {entry.turn} {interval_text(metric)} (N={entry.contexts})")
    line.append("normalized MI " + " | ".join(cells))
    finding = stops_reading(report.by_turn, report.thresholds)
    if finding is not None:
        line.append(f"; {finding}", style=COLLAPSE_STYLE)
    return line


NEXT_STEPS = (
    'next: see which prompts collapsed and why in docs/measures.md, "When the verdict is a '
    'collapse"; compare with an earlier checkpoint (collapsecheck compare A B) or scan the '
    "whole run directory to find the onset"
)


def print_notes(console: Console, notes: list[str | None]) -> None:
    """What was read other than one might expect (a base with its adapter, a run's root)."""
    for note in notes:
        if note:
            console.print(Text("note: ", style="bold yellow") + Text(note))


def print_warnings(console: Console, warnings: list[str]) -> None:
    for warning in warnings:
        console.print(Text("warning: ", style="bold yellow") + Text(warning))


def percent(x: float) -> str:
    return f"{100 * x:.0f}%"


PRIOR_STYLES = {"start_mode": "bold yellow", "learned_template": "bold magenta"}
PRIOR_NEXT = {
    "start_mode": "next run: a reward that pays for input-specific text over this mode, or a "
    "reference policy without it; a stronger KL term will not stop it",
    "learned_template": "next run: fix the reward that taught it (a format or phrasing "
    "shortcut); the KL term to the start already charges it",
}


def prior_line(report: Report) -> Text | None:
    """SPEC "Scored under the start", in one line: whether the reasoning is the start's own
    text amplified or text the start would not write, and, for a collapse, what that means
    for the next run. None where it was not read (no --baseline)."""
    prior = report.prior
    if prior.regime == "not_measured":
        return None
    line = Text("where from: ", style="bold")
    line.append(prior.regime.replace("_", " "), style=PRIOR_STYLES.get(prior.regime, "bold"))
    line.append(f" — {prior.reason}")
    if report.verdict.is_collapse and prior.regime in PRIOR_NEXT:
        line.append(f"; {PRIOR_NEXT[prior.regime]}")
    return line


def print_why(console: Console, report: Report) -> None:
    """The SNR summary (SPEC "Why: reward variance"), where the reasoning came from (SPEC
    "Scored under the start") and the most collapsed prompts."""
    snr = report.snr
    if snr is None:
        console.print(f"why: {report.snr_reason}", style="dim")
    else:
        rho = snr["rv_mi_spearman"]
        console.print(
            Text("why: ", style="bold")
            + Text(
                f"{percent(snr['frac_reward_zero_std'])} of prompts have rewards that all tie "
                f"(too easy {percent(snr['zero_std_too_easy'])}, too hard "
                f"{percent(snr['zero_std_too_hard'])}, uninformative "
                f"{percent(snr['zero_std_uninformative'])}); reward std vs own MI: Spearman "
                f"{_format(point_value(rho))} {_interval(rho)}; the SNR filter (top-p "
                f"{snr['snr_top_p']:g}) keeps {percent(snr['rollout/filter_kept_ratio'])} of the "
                f"prompts ({snr['rewards']})"
            )
        )
    prior = prior_line(report)
    if prior is not None:
        console.print(prior)
    if report.verdict.is_collapse and report.per_prompt:
        console.print(
            "most collapsed prompts (lowest own MI; every prompt: --per-prompt FILE, or the "
            "dump's per_prompt.jsonl):"
        )
        for row in most_collapsed(report.per_prompt):
            own = "-" if row["own_mi"] is None else f"{row['own_mi']:.2f}"
            console.print(f"  prompt {row['index']} (own MI {own}): {row['text']}")


def print_image_share(console: Console, report: Report) -> None:
    """SPEC "What the image carries", for prompts with images: the share, or why none."""
    images = report.settings.get("images")
    if not images:
        return
    if "image_share" not in report.metrics:
        console.print(f"image: share not measured ({images['image_share']})", style="dim")
        return
    share = report.metrics["image_share"]
    console.print(
        Text("image: ", style="bold")
        + Text(
            f"{READINGS[image_reading(report.metrics)]} — it carries "
            f"{_format(point_value(share))} {_interval(share)} of the input dependence "
            f"(image_share; the image alone: {_format(report.value('mi_image_seq_estimate'))} "
            "nats per trace)"
        )
    )


def print_report(console: Console, report: Report) -> None:
    console.print(metrics_table(report))
    counts = report.counts
    most = report.settings["samples_per_prompt"]
    samples = samples_phrase(counts.get("fewest_samples_per_prompt", most), most)
    prompts = prompts_phrase(counts["prompts"], counts.get("input_rows", counts["prompts"]))
    console.print(
        f"{prompts} x {samples}, "
        f"{plural(counts['scored_traces'], 'trace')} scored, "
        f"{counts['reasoning_tokens_mean']:.1f} reasoning tokens each on average"
        + (" (answered from the results cache)" if report.timing.get("cached") else ""),
        style="dim",
    )
    reused = report.timing.get("samples_reused")
    if reused and not report.timing.get("cached"):
        console.print(
            f"traces of {plural(reused, 'prompt')} read from the samples cache (sampled before "
            "with the same checkpoint, prompts and sampling settings): scored, not sampled again",
            style="dim",
        )
    settings = report.settings
    if "backend" in settings:
        console.print(
            f"engine: {settings['backend']} on {settings.get('device')}, "
            f"{settings.get('dtype')}, scorer {settings.get('scorer')}",
            style="dim",
        )
    print_notes(console, [report.settings.get("checkpoint_note")])
    print_warnings(console, report.warnings)
    print_decisions(console, report)
    print_image_share(console, report)
    print_why(console, report)
    if report.verdict.is_collapse:
        console.print("Reasoning sampled for two different prompts; do they differ?")
        for example in report.examples:
            title = Text(f"prompt {example['prompt_index']}: {example['prompt']}"[:EXAMPLE_TITLE])
            reasoning = Text(example["reasoning"][:EXAMPLE_CHARS])
            console.print(Panel(reasoning, title=title, title_align="left"))
        console.print(NEXT_STEPS, style="dim")


def rate(count: float, seconds: float | None, unit: str) -> str:
    """A count and how many of it a second: 11,528 tokens, 173/s."""
    return f"{count:,.0f} {unit}" + (f", {count / seconds:,.0f}/s" if seconds else "")


def timing_line(timing: dict[str, Any]) -> str:
    """Where a scan's time went (report.json's `timing`), in one line."""
    if timing.get("cached"):
        return "answered from the results cache"
    parts = [f"loading {timing.get('load_s', 0):.1f} s"]
    if "sampling_s" in timing:
        sampled = timing.get("sampled_tokens")
        what = rate(sampled, timing["sampling_s"], "new tokens") if sampled else ""
        if timing.get("samples_reused"):
            what = f"{plural(timing['samples_reused'], 'prompt')} read from the samples cache"
        parts.append(f"sampling {timing['sampling_s']:.1f} s" + (f" ({what})" if what else ""))
    if "scoring_s" in timing:
        scored = rate(timing.get("tokens_scored", 0), timing["scoring_s"], "tokens")
        parts.append(f"scoring {timing['scoring_s']:.1f} s ({scored})")
    return ", ".join(parts)


def print_timing(console: Console, subject: Report | RunReport) -> None:
    """--verbose: a report's timing line, or each step's of a run (labelled by its step)."""
    if isinstance(subject, RunReport):
        lines = [(f"time, step {s.checkpoint.label}: ", s.report) for s in subject.steps]
    else:
        lines = [("time: ", subject)]
    for prefix, report in lines:
        console.print(prefix + timing_line(report.timing), style="dim", highlight=False)


RUN_COLUMNS = (
    ("norm. MI", "normalized_mi"),
    ("skill", "retrieval_skill"),
    ("H(Z|X)/tok", "conditional_entropy_est"),
    ("z EMA", "mi_zscore_ema_seq"),
)
RUN_CAPTION = (
    "norm. MI: normalized_mi; skill: retrieval_skill; H(Z|X)/tok: conditional entropy, nats "
    "per token; z EMA: mi_zscore_ema_seq, MI over the marginal's spread with the spread "
    "smoothed along the run (RAGEN-2's logged z-score); 0-var: share of prompts whose rewards "
    "all tie; RV~MI: Spearman of reward std and own MI; * answered from the results cache"
)
PAIRING_CAPTION = (
    "; scored by: the checkpoint that scored the trainer's rollouts of the step, and the gap, "
    "the updates between it and the weights that sampled them (0: those weights)"
)


def _window(window: Any) -> str:
    return "-" if window is None else _format(window.mean)


def print_findings(console: Console, run: RunReport) -> None:
    """What the trainer's own logs missed (SPEC's findings), or which log was read."""
    if run.training_log is None:
        if run.training_log_reason:
            console.print(f"training log: {run.training_log_reason}", style="dim")
        return
    keys = ", ".join(f"{name}={key}" for name, key in run.training_log["keys"].items())
    console.print(f"training log: {run.training_log['source']} ({keys})", style="dim")
    for finding in run.findings:
        console.print(Text(f"finding ({finding.kind}): ", style="bold yellow") + Text(finding.text))


def snr_cells(report: Report) -> list[str]:
    if report.snr is None:
        return ["-", "-"]
    rho = point_value(report.snr["rv_mi_spearman"])
    return [percent(report.snr["frac_reward_zero_std"]), _format(rho)]


# The run table's columns by importance: where the table is wider than the console, those
# ranked last move to a continuation table first; the regime never moves.
RUN_RANKING = ("regime", "onset", "norm. MI", "norm. MI 95%", "H(Z|X)/tok", "skill", "flow")


def run_columns(run: RunReport) -> list[Column]:
    """One row per checkpoint (per rollout step, with the checkpoint that scored it), as
    columns: the step (and the scoring checkpoint) name each row."""
    steps = run.steps
    columns = [Column("step", tuple(step_label(s) for s in steps), "left", key=True)]
    if run.traces:
        described = tuple(s.sampled_by.describe() if s.sampled_by else "" for s in steps)
        columns.append(Column("scored by", described, "left", key=True))
    for title, key in RUN_COLUMNS:
        columns.append(
            Column(title, tuple(_format(point_value(s.report.metrics[key])) for s in steps))
        )
    columns.append(
        Column("norm. MI 95%", tuple(_interval(s.report.metrics["normalized_mi"]) for s in steps))
    )
    for name in run.logged_series:
        logged = tuple(_window(s.training_log.get(name)) for s in steps)
        columns.append(Column(f"{name} (log)", logged))
    if any(s.report.snr is not None for s in steps):
        snr = [snr_cells(s.report) for s in steps]
        columns.append(Column("0-var", tuple(cells[0] for cells in snr)))
        columns.append(Column("RV~MI", tuple(cells[1] for cells in snr)))
    onsets = tuple(
        Text(run.onset.kind if run.onset and run.onset.index == i else "", style="bold")
        for i in range(len(steps))
    )
    columns += [
        Column("regime", tuple(regime_text(s.report) for s in steps), "left"),
        Column("flow", tuple(s.report.flow.regime.replace("_", " ") for s in steps), "left"),
        Column("onset", onsets, "left"),
    ]
    if any(s.report.episodes.regime != "not_measured" for s in steps):
        columns.append(Column("episodes", tuple(episodes_cell(s.report) for s in steps), "left"))
    return columns


def episodes_cell(report: Report) -> str:
    """A run table's episodes cell: the reading and revisit_rate (SPEC "Agents across
    turns")."""
    if report.episodes.regime == "not_measured":
        return ""
    return f"{report.episodes.regime} {_format(report.value('revisit_rate'))}"


def step_label(step: Any) -> str:
    return step.checkpoint.label + ("*" if step.report.timing.get("cached") else "")


def run_title(run: RunReport) -> str:
    return f"collapsecheck: {run.run_dir}"


def run_caption(run: RunReport) -> str:
    return RUN_CAPTION + (PAIRING_CAPTION if run.traces else "")


def run_table(run: RunReport) -> Table:
    """The run's table whole, however wide (the HTML page sizes its console by it)."""
    return table_of(run_columns(run), run_title(run), run_caption(run))


def run_tables(run: RunReport, width: int) -> list[Table]:
    """The run's table fitted to `width` columns: what does not fit continues below (the
    legend, `run_caption`, is printed under the last at the console's full width)."""
    return fitted_tables(run_columns(run), width, RUN_RANKING, run_title(run))


def print_run(console: Console, run: RunReport) -> None:
    """The run's table, where its traces came from, its notes and findings, then the onset
    and the latest checkpoint's verdict."""
    for table in run_tables(run, console.width):
        console.print(table)
    console.print(run_caption(run), style="dim", highlight=False)
    if run.traces:
        console.print(f"traces: {run.traces}", style="dim", highlight=False)
    print_notes(console, run.notes)
    print_findings(console, run)
    if len(run.hosts) > 1:
        where = "; ".join(f"{host}: {', '.join(labels)}" for host, labels in run.hosts.items())
        console.print(f"scanned on {len(run.hosts)} hosts ({where})", style="dim")
    cached = sum(bool(s.report.timing.get("cached")) for s in run.steps)
    if cached:
        rows = "rollout steps" if run.traces else "checkpoints"
        console.print(f"{cached} of {len(run.steps)} {rows} answered from the cache", style="dim")
    line = Text("onset: ", style="bold")
    if run.onset is None:
        line.append("none — no checkpoint collapsed or lost input dependence significantly")
    else:
        line.append(f"step {run.onset_step} ({run.onset.kind})", style=COLLAPSE_STYLE)
        line.append(f" — {run.onset.reason}")
    console.print(line)
    latest = run.steps[-1]
    which = (
        f"latest rollouts (step {latest.checkpoint.label}, scored by "
        f"{latest.sampled_by.describe()})"
        if latest.sampled_by
        else f"latest checkpoint ({latest.checkpoint.label})"
    )
    console.print(Text(f"{which}:", style="bold"))
    print_decisions(console, latest.report)
    prior = prior_line(latest.report)
    if prior is not None:
        console.print(prior)


def print_comparison(console: Console, comparison: Comparison) -> None:
    table = Table(title="collapsecheck compare", title_justify="left", show_edge=False)
    for column in ("metric", "A", "B", "B - A", "95% interval of B - A"):
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    for key, delta in comparison.deltas.items():
        if key.startswith(POSITION_PREFIX):  # the tenths: the reason line names those that moved
            continue
        table.add_row(
            key,
            _format(comparison.value("a", key)),
            _format(comparison.value("b", key)),
            f"{delta.value:+.3f}",
            _interval(delta),
        )
    console.print(table)
    for name, report in (("A", comparison.a), ("B", comparison.b)):
        line = Text(f"{name}: ", style="bold")
        line.append_text(regime_text(report))
        if report.episodes.regime != "not_measured":
            line.append(f", episodes {report.episodes.regime}")
        line.append(f"  {report.settings.get('checkpoint', '')}", style="dim")
        console.print(line)
    played = "env" in comparison.a.settings or "env" in comparison.b.settings
    unpaired = "no dumps to pair"
    if played:
        unpaired = "played episodes: each policy made its own contexts"
    method = (
        "paired bootstrap over prompts"
        if comparison.paired
        else f"unpaired approximation from the reports' intervals ({unpaired})"
    )
    if comparison.episodes_paired:
        method += "; the episode metrics' paired over start states (both played the same seeds)"
    console.print(f"intervals: {method}", style="dim")
    print_warnings(console, comparison.warnings)
    console.print(
        Text(comparison.reason, style=COLLAPSE_STYLE if comparison.lost else "bold green")
    )
    under_start = prior_line(comparison.b)
    if under_start is not None:
        console.print(Text(f"B under {comparison.b.prior.baseline}, ", style="bold") + under_start)
