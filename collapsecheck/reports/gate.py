"""The CI gate: rules checked against a report, and the reports CI systems read (JUnit XML,
Markdown for a pull-request comment or a job summary)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.config import GateConfig
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_text_atomic
from collapsecheck.formatting import format_metric, format_number
from collapsecheck.measures.episodes import EPISODE_KEYS, NOT_MEASURED
from collapsecheck.measures.metrics import Estimate, MetricValue, point_value
from collapsecheck.measures.verdict import INCONCLUSIVE
from collapsecheck.reports.report import KEY_METRICS, Report
from collapsecheck.reports.run_report import RunReport

RUN_KEYS = ("normalized_mi", "retrieval_skill", "conditional_entropy_est")


@dataclass(frozen=True)
class RuleResult:
    """One gate rule's outcome; `undecided`: it passed a verdict that could be a collapse
    (`inconclusive` outside --fail-on), which the console says (SPEC "The verdict")."""

    name: str
    passed: bool
    message: str
    undecided: bool = False


UNDECIDED = "; this gate passes what it could not decide: --fail-on inconclusive fails it"


def check_report(report: Report, gate: GateConfig) -> list[RuleResult]:
    """The regime rule, then one rule per metric minimum."""
    listed = ", ".join(sorted(gate.fail_on)) or "none"
    results = []
    verdicts = (("regime", report.verdict), ("flow", report.flow))
    verdicts += (("early answer", report.early_answer),)
    if report.episodes.regime != NOT_MEASURED:  # SPEC "Agents across turns"
        verdicts += (("episodes", report.episodes),)
    for name, verdict in verdicts:
        regime = verdict.regime
        failed = regime in gate.fail_on
        undecided = name == "regime" and regime == INCONCLUSIVE and not failed
        results.append(
            RuleResult(
                name,
                not failed,
                f"{'' if name == 'regime' else name + ' '}verdict {regime} "
                f"{'is' if failed else 'is not'} in --fail-on ({listed}): {verdict.reason}"
                + (UNDECIDED if undecided else ""),
                undecided,
            )
        )
    for key, minimum in sorted(gate.minimums.items()):
        if key not in report.metrics:
            raise CollapsecheckError(
                f"min.{key}: this report has no metric {key} (docs/SPEC.md names the metrics "
                "and when each is measured)"
            )
        value = report.value(key)
        passed = not math.isnan(value) and value >= minimum
        results.append(
            RuleResult(f"min {key}", passed, f"{key} = {value:.3f}, minimum {minimum:g}")
        )
    return results


def failures(results: Sequence[RuleResult]) -> list[RuleResult]:
    return [r for r in results if not r.passed]


def write_junit(path: Path, suite: str, results: Sequence[RuleResult]) -> Path:
    """One test case per rule; a failing rule is a <failure> with its message."""
    root = ET.Element("testsuites")
    element = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(len(failures(results))),
        errors="0",
        skipped="0",
    )
    for result in results:
        case = ET.SubElement(element, "testcase", name=result.name, classname=suite)
        if result.passed:
            ET.SubElement(case, "system-out").text = result.message
        else:
            ET.SubElement(case, "failure", message=result.message, type="collapsecheck")
    ET.indent(root)
    text = ET.tostring(root, encoding="unicode", xml_declaration=True)
    return write_text_atomic(path, text + "\n")


def metric_cell(report: Report, key: str) -> str:
    """A metric as a table cell shows it: `value [low, high]`, or its bare value."""
    return metric_text(key, report.metrics[key])


def metric_text(key: str, metric: MetricValue) -> str:
    """`value [low, high]`, or the bare value of a metric without an interval."""
    if isinstance(metric, Estimate):
        low, high = format_metric(key, metric.low), format_metric(key, metric.high)
        return f"{format_metric(key, metric.value)} [{low}, {high}]"
    return format_metric(key, float(metric))


def where_input_shows(report: Report) -> list[str]:
    """SPEC "Where the input shows" in the summary, where it was measured."""
    where = report.token_information
    if where.regime == "not_measured":
        return []
    return [f"**Where the input shows: `{where.regime}`**: {where.reason}", ""]


def where_from(report: Report) -> list[str]:
    """SPEC "Scored under the start" in the summary, where it was read."""
    prior = report.prior
    if prior.regime == "not_measured":
        return []
    return [f"**Where from: `{prior.regime}`** (under {prior.baseline}): {prior.reason}", ""]


def across_turns(report: Report) -> list[str]:
    """SPEC "Agents across turns" in the summary: the episodes' reading and input dependence
    by turn, where there are episodes."""
    lines = []
    if report.episodes.regime != NOT_MEASURED:
        lines += [f"**Episodes: `{report.episodes.regime}`**: {report.episodes.reason}", ""]
    measured = [entry for entry in report.by_turn if entry.measured]
    if measured:
        cells = ", ".join(
            f"turn {e.turn} {metric_text('normalized_mi', e.metrics['normalized_mi'])}"
            for e in measured
        )
        lines += [f"**Input dependence by turn** (normalized MI): {cells}", ""]
    return lines


def episode_keys(report: Report) -> tuple[str, ...]:
    return EPISODE_KEYS if report.episodes.regime != NOT_MEASURED else ()


def start_cell(report: Report) -> str:
    """A run table's "from the start" cell (SPEC "Scored under the start"): the reading,
    typicality and the KL estimate; "start" for the baseline's own row."""
    if report.prior.baseline is None:
        return "start"
    typical, kl = (report.metrics.get(k) for k in ("prior_typicality", "prior_kl_seq"))
    return (
        f"`{report.prior.regime}` {format_number(point_value(typical))}, "
        f"{format_number(point_value(kl))}"
    )


def markdown_run(run: RunReport) -> list[str]:
    """The run's table and onset, in Markdown."""
    logged = run.logged_series
    header = ["step", "normalized MI", "retrieval skill", "H(Z\\|X) nats/token", "regime", "flow"]
    header += ["where the input shows", "early answer"]
    if run.scored_under_start:
        header.append("from the start: typicality, KL nats/trace")
    header += [f"{name} (log)" for name in logged]
    lines = [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
    for step in run.steps:
        report = step.report
        cells = [metric_cell(report, key) for key in RUN_KEYS]
        cells += [f"`{report.verdict.label}`", f"`{report.flow.regime}`"]
        cells.append(report.token_information.short(report.metrics))
        cells.append(f"`{report.early_answer.regime}`")
        if run.scored_under_start:
            cells.append(start_cell(report))
        windows = [step.training_log.get(name) for name in logged]
        cells += ["-" if w is None else format_number(w.mean) for w in windows]
        lines.append(f"| {step.checkpoint.label} | {' | '.join(cells)} |")
    onset = f"step {run.onset_step} ({run.onset.kind}): {run.onset.reason}" if run.onset else "none"
    findings = [f"- **{f.kind}**: {f.text}" for f in run.findings]
    return [*lines, "", f"**Onset:** {onset}", "", *findings, *([""] if findings else [])]


def page_link(page: Path | None, environ: Mapping[str, str]) -> str | None:
    """The summary's line pointing at the HTML page (None: no page): the file, named
    relative to the summary beside it; in GitHub Actions, also the run's artifacts, where
    `actions/upload-artifact` keeps it (docs/gate.md)."""
    if page is None:
        return None
    line = f"**HTML report:** [{page.name}]({page.name})"
    run = [environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    if all(run):
        server, repository, run_id = run
        artifacts = f"{server}/{repository}/actions/runs/{run_id}#artifacts"
        line += f", in [this run's artifacts]({artifacts})"
    return line


def markdown_report(
    title: str, report: Report, results: Sequence[RuleResult], run: RunReport | None = None,
    link: str | None = None,
) -> str:  # fmt: skip
    """A summary of one report and its gate (and of the run it ends), fit for a pull-request
    comment or a job summary; `link` points at the HTML page."""
    status = "passed" if not failures(results) else "failed"
    lines = [
        f"## collapsecheck: {title}",
        "",
        *([link, ""] if link else []),
        *(markdown_run(run) if run is not None else []),
        f"**Verdict: `{report.verdict.label}`**: {report.verdict.reason}",
        "",
        *where_input_shows(report),
        f"**Flow: `{report.flow.regime}`**: {report.flow.reason}",
        "",
        f"**Early answer: `{report.early_answer.regime}`**: {report.early_answer.reason}",
        "",
        *where_from(report),
        *across_turns(report),
        "| metric | value [95% interval] |",
        "|---|---|",
        *(f"| `{key}` | {metric_cell(report, key)} |" for key in KEY_METRICS),
        *(f"| `{key}` | {metric_cell(report, key)} |" for key in episode_keys(report)),
        "",
        f"### Gate: {status}",
        "",
        "| rule | result | detail |",
        "|---|---|---|",
        *(
            f"| {r.name} | {'pass' if r.passed else '**FAIL**'} | {r.message.replace('|', '/')} |"
            for r in results
        ),
        "",
    ]
    return "\n".join(lines)
