"""Report out, for a person at a terminal: progress bars, the metric table, the verdict line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from collapsecheck.compare import Comparison
from collapsecheck.metrics import Estimate, MetricValue, point_value
from collapsecheck.progress import ProgressHook
from collapsecheck.report import KEY_METRICS, Report, format_number
from collapsecheck.run_report import RunReport
from collapsecheck.verdict import GROUNDED, INCONCLUSIVE

REGIME_STYLES = {GROUNDED: "bold green", INCONCLUSIVE: "bold yellow"}
COLLAPSE_STYLE = "bold red"
EXAMPLE_CHARS = 400
EXAMPLE_TITLE = 70


@contextmanager
def progress_bars(console: Console) -> Iterator[ProgressHook]:
    """A ProgressHook drawing one rich bar (with ETA) per pipeline stage; a stage that starts
    again (the next checkpoint of a run) reuses its bar."""
    columns = (
        TextColumn("[bold]{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bars:
        tasks: dict[str, TaskID] = {}

        def start(stage: str, total: int) -> Callable[[int], None]:
            if stage in tasks:
                bars.reset(tasks[stage], total=total)
            else:
                tasks[stage] = bars.add_task(stage, total=total)
            task = tasks[stage]
            return lambda n: bars.advance(task, n)

        yield start


def _format(x: float) -> str:
    return format_number(x)


def _interval(metric: MetricValue) -> str:
    if isinstance(metric, Estimate):
        return f"[{_format(metric.low)}, {_format(metric.high)}]"
    return ""


def metrics_table(report: Report) -> Table:
    table = Table(title="collapsecheck", title_justify="left", show_edge=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% interval", justify="right")
    for key in KEY_METRICS:
        interval = _interval(report.metrics[key])
        label = key
        if key == "retrieval_accuracy":
            label += f" (chance {report.value('retrieval_chance_level'):.3f})"
        table.add_row(label, _format(report.value(key)), interval)
    return table


def regime_text(report: Report) -> Text:
    verdict = report.verdict
    name = verdict.regime
    if verdict.style:
        name += f" ({verdict.style})"
    if verdict.partial:
        name += " (partial)"
    return Text(name, style=REGIME_STYLES.get(verdict.regime, COLLAPSE_STYLE))


def verdict_line(report: Report) -> Text:
    line = Text("verdict: ", style="bold")
    line.append_text(regime_text(report))
    line.append(f" — {report.verdict.reason}")
    return line


def print_report(console: Console, report: Report) -> None:
    console.print(metrics_table(report))
    counts = report.counts
    console.print(
        f"{counts['prompts']} prompts x {report.settings['samples_per_prompt']} samples, "
        f"{counts['scored_traces']} traces scored, "
        f"{counts['reasoning_tokens_mean']:.1f} reasoning tokens each on average",
        style="dim",
    )
    console.print(verdict_line(report))
    if report.verdict.is_collapse:
        console.print("Reasoning sampled for two different prompts; do they differ?")
        for example in report.examples:
            title = Text(f"prompt {example['prompt_index']}: {example['prompt']}"[:EXAMPLE_TITLE])
            reasoning = Text(example["reasoning"][:EXAMPLE_CHARS])
            console.print(Panel(reasoning, title=title, title_align="left"))


RUN_COLUMNS = (
    ("norm. MI", "normalized_mi"),
    ("skill", "retrieval_skill"),
    ("H(Z|X)", "conditional_entropy_seq_est"),
    ("z EMA", "mi_zscore_ema_seq"),
)


def print_run(console: Console, run: RunReport) -> None:
    """One row per checkpoint, then the onset and the latest checkpoint's verdict."""
    table = Table(title=f"collapsecheck: {run.run_dir}", title_justify="left", show_edge=False)
    table.add_column("step")
    for title, _ in RUN_COLUMNS:
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("norm. MI 95%", justify="right", no_wrap=True)
    table.add_column("regime")
    for step in run.steps:
        metrics = step.report.metrics
        cells = [_format(point_value(metrics[key])) for _, key in RUN_COLUMNS]
        cells.append(_interval(metrics["normalized_mi"]))
        table.add_row(step.checkpoint.label, *cells, regime_text(step.report))
    console.print(table)
    cached = sum(bool(s.report.timing.get("cached")) for s in run.steps)
    if cached:
        console.print(
            f"{cached} of {len(run.steps)} checkpoints answered from the cache", style="dim"
        )
    line = Text("onset: ", style="bold")
    if run.onset is None:
        line.append("none — no checkpoint collapsed or lost input dependence significantly")
    else:
        line.append(f"step {run.onset_step}", style=COLLAPSE_STYLE)
        line.append(f" — {run.onset.reason}")
    console.print(line)
    latest = run.steps[-1]
    console.print(Text(f"latest checkpoint ({latest.checkpoint.label}):", style="bold"))
    console.print(verdict_line(latest.report))


def print_comparison(console: Console, comparison: Comparison) -> None:
    table = Table(title="collapsecheck compare", title_justify="left", show_edge=False)
    for column in ("metric", "A", "B", "B - A", "95% interval of B - A"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for key, delta in comparison.deltas.items():
        table.add_row(
            key,
            _format(comparison.a.value(key)),
            _format(comparison.b.value(key)),
            f"{delta.value:+.3f}",
            _interval(delta),
        )
    console.print(table)
    for name, report in (("A", comparison.a), ("B", comparison.b)):
        line = Text(f"{name}: ", style="bold")
        line.append_text(regime_text(report))
        line.append(f"  {report.settings.get('checkpoint', '')}", style="dim")
        console.print(line)
    method = (
        "paired bootstrap over prompts"
        if comparison.paired
        else ("unpaired approximation from the reports' intervals (no dumps to pair)")
    )
    console.print(f"intervals: {method}", style="dim")
    console.print(
        Text(comparison.reason, style=COLLAPSE_STYLE if comparison.lost else "bold green")
    )
