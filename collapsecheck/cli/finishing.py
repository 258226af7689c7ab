"""What every command does after its results: the gate's rules, their JUnit and Markdown,
the HTML page, the dashboards."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from collapsecheck.cli.app import EXIT_FAIL, stderr, stdout, user_errors
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import (
    OutputSettings,
)


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
        from collapsecheck.runs.plan import cache_root

        out.append(WandbWriter(wandb, cache_root(cache)))
    return out


def verdict_thresholds(gate: Any) -> Any:
    from collapsecheck.measures.regimes import VerdictThresholds

    return VerdictThresholds(gate.thresholds, gate.flow_thresholds)
