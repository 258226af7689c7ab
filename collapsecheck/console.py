"""Report out, for a person at a terminal: progress bars, the metric table, the verdict line."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from collapsecheck.metrics import Estimate
from collapsecheck.report import KEY_METRICS, Report
from collapsecheck.scan import ProgressHook
from collapsecheck.verdict import GROUNDED, INCONCLUSIVE

REGIME_STYLES = {GROUNDED: "bold green", INCONCLUSIVE: "bold yellow"}
COLLAPSE_STYLE = "bold red"
EXAMPLE_CHARS = 400
EXAMPLE_TITLE = 70


@contextmanager
def progress_bars(console: Console) -> Iterator[ProgressHook]:
    """A ProgressHook drawing one rich bar (with ETA) per pipeline stage."""
    columns = (
        TextColumn("[bold]{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bars:

        def start(stage: str, total: int):
            task = bars.add_task(stage, total=total)
            return lambda n: bars.advance(task, n)

        yield start


def _format(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3f}"


def metrics_table(report: Report) -> Table:
    table = Table(title="collapsecheck", title_justify="left", show_edge=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% interval", justify="right")
    for key in KEY_METRICS:
        metric = report.metrics[key]
        interval = (
            f"[{_format(metric.low)}, {_format(metric.high)}]"
            if isinstance(metric, Estimate)
            else ""
        )
        label = key
        if key == "retrieval_accuracy":
            label += f" (chance {report.value('retrieval_chance_level'):.3f})"
        table.add_row(label, _format(report.value(key)), interval)
    return table


def verdict_line(report: Report) -> Text:
    verdict = report.verdict
    name = verdict.regime
    if verdict.style:
        name += f" ({verdict.style})"
    if verdict.partial:
        name += " (partial)"
    style = REGIME_STYLES.get(verdict.regime, COLLAPSE_STYLE)
    line = Text("verdict: ", style="bold")
    line.append(name, style=style)
    line.append(f" — {verdict.reason}")
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
