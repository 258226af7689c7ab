"""`--html FILE`: one self-contained page per scan, run or comparison (docs/usage.md, "The
HTML report"). Its CSS and script are inlined, its pictures are data URIs or inline SVG, and
its Content-Security-Policy forbids fetching anything, so it opens the same from a laptop or
a CI artifact. The numbers and tables are the console's own (rich's HTML export); the page
adds what a console cannot show: the cross-scoring matrix, the traces of different prompts
side by side with what they share marked, the sortable per-prompt table with each prompt's
traces, and for a run its plot and one small heatmap per step."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from html import escape
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from collapsecheck.files import write_text_atomic
from collapsecheck.formatting import format_number
from collapsecheck.measures.flow import NOT_MEASURED, flow_rows
from collapsecheck.measures.metrics import matched_and_marginal
from collapsecheck.measures.per_prompt import most_collapsed
from collapsecheck.reports.compare import Comparison
from collapsecheck.reports.console import print_comparison, print_report, print_run, run_table
from collapsecheck.reports.episode_strips import across_turns_section
from collapsecheck.reports.evidence import Evidence, episodes_of, evidence_of, matrix_of
from collapsecheck.reports.figures import (
    centered,
    early_answer_picture,
    heatmap,
    heatmap_picture,
    picture_uri,
    run_limit,
    step_picture,
    svg_text,
    thumbnail,
)
from collapsecheck.reports.gate import metric_cell
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport
from collapsecheck.reports.template_spans import PLAIN, Segment, shared_spans
from collapsecheck.reports.token_shading import (
    shaded_rows,
    shaded_trace,
    shading_scale,
    where_along_run,
    where_section,
)
from collapsecheck.version import __version__

CONSOLE_WIDTH = 160  # the run table's columns fit; the page scrolls it sideways
SIDE_BY_SIDE = 3  # prompts whose traces are laid side by side
TRACES_SHOWN = 4  # traces of each of them
TRACE_CHARS = 1500  # a trace longer than this is cut on the page (the dump holds it whole)
POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
# the per-prompt table's columns: (key in SPEC "Per-prompt table", header)
PROMPT_COLUMNS = (
    ("index", "#"),
    ("text", "prompt"),
    ("own_mi", "own MI"),
    ("retrieval_hit_rate", "retrieval"),
    ("distinct_reasoning_rate", "distinct Z"),
    ("action_state_nmi", "X→A"),
    ("action_reasoning_nmi", "Z→A"),
    ("distinct_action_rate", "distinct A"),
    ("reward_mean", "reward mean"),
    ("reward_std", "reward std"),
    ("valid_traces", "traces"),
)


def _asset(name: str) -> str:
    return files("collapsecheck.reports").joinpath(name).read_text(encoding="utf-8")


def page(title: str, body: str) -> str:
    """The whole document around `body`."""
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>collapsecheck: {escape(title)}</title><style>{_asset('page.css')}</style>"
        f"</head><body><h1>collapsecheck: {escape(title)}</h1>"
        f'<p class="meta">collapsecheck {__version__}, written {made}</p>\n{body}\n'
        f"<script>{_asset('page.js')}</script></body></html>\n"
    )


def console_fragment(draw: Callable[[Console], None], width: int = CONSOLE_WIDTH) -> str:
    """What the console prints, exported as HTML with inline styles."""
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True)
    draw(console)
    return console.export_html(inline_styles=True, code_format='<pre class="console">{code}</pre>')


def width_of(table: Table) -> int:
    """The console width a table needs to show every column whole."""
    console = Console(width=1000, file=io.StringIO())
    return max(CONSOLE_WIDTH, Measurement.get(console, console.options, table).maximum)


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def verdict_banner(report: Report) -> str:
    verdict = report.verdict
    flow = report.flow
    flow_line = (
        f"<br>flow: <b>{escape(flow.regime.replace('_', ' '))}</b> — {escape(flow.reason)}"
        if flow.regime != NOT_MEASURED
        else ""
    )
    early = report.early_answer
    early_line = (
        f"<br>early answer: <b>{escape(early.regime.replace('_', ' '))}</b> — "
        f"{escape(early.reason)}"
        if early.regime != NOT_MEASURED
        else ""
    )
    prior = report.prior
    prior_line = (
        f"<br>where from: <b>{escape(prior.regime.replace('_', ' '))}</b> — {escape(prior.reason)}"
        if prior.regime != NOT_MEASURED
        else ""
    )
    episodes = report.episodes
    episodes_line = (
        f"<br>episodes: <b>{escape(episodes.regime)}</b> — {escape(episodes.reason)}"
        if episodes.regime != NOT_MEASURED
        else ""
    )
    return (
        f'<div class="verdict {escape(verdict.regime)}">verdict: '
        f"<b>{escape(verdict.label.replace('_', ' '))}</b> — "
        f"{escape(verdict.reason)}{flow_line}{early_line}{prior_line}{episodes_line}</div>"
    )


EARLY_CAPTION = (
    "Each action scored after its own prompt and its reasoning cut short, then the text that "
    "closes the reasoning: exp of that log-probability is the chance that an answer forced "
    "there is the action given after the whole reasoning (Lanham et al. 2023's early "
    "answering, with no resampling). Shown relative to the whole reasoning's own agreement, "
    "with 95% bootstrap bands over prompts. Flat near 1: the action is decided before the "
    "reasoning (post hoc); rising only at the right: the reasoning decides it at its end."
)


def early_answer_section(curves: list[tuple[str, Any]], title: str) -> str:
    """The early-answer curve(s), where any was measured (none: nothing)."""
    measured = [(label, e) for label, e in curves if e.regime != NOT_MEASURED]
    if not measured:
        return ""
    return f"<h2>{title}</h2>" + figure_block(
        early_answer_picture(measured), "early-answer curve", EARLY_CAPTION, kind="curve"
    )


def figure_block(
    uri: str, alt: str, caption: str, note_text: str = "", kind: str = "heatmap"
) -> str:
    extra = note(note_text) if note_text else ""
    return (
        f'<figure><img class="{kind}" src="{uri}" alt="{escape(alt)}">'
        f'<figcaption class="note">{escape(caption)}</figcaption>{extra}</figure>'
    )


def matrix_section(report: Report, evidence: Evidence) -> str:
    """The X→Z matrix, and the flow's action matrices where the flow was measured."""
    m = evidence.matrix
    matched, marginal = matched_and_marginal(m.mean, m.row_prompt, m.prompt_groups, m.scored)
    drawn = heatmap(centered(m.mean, m.scored), m.row_prompt, matched - marginal)
    parts = [
        "<h2>Cross-scoring matrix</h2>",
        figure_block(
            heatmap_picture(drawn, "prompts (columns)", "matched - marginal"),
            "cross-scoring heatmap",
            "Each trace's reasoning Z scored under every prompt (per token), minus its score "
            "under the batch's mixture: blue where the prompt makes it likelier. Grounded "
            "reasoning shows a diagonal of blue blocks (its own prompt); a template shows a "
            "flat field. Beside it, each trace's matched minus marginal (its share of "
            "mi_estimate). Grey: not scored (sampled negatives). The colour scale reaches at "
            "least 0.25 nats per token, so that noise stays pale.",
            drawn.note,
        ),
    ]
    if evidence.flow is not None and report.flow.regime != NOT_MEASURED:
        parts.append(flow_matrices(evidence))
    return "\n".join(parts)


def flow_matrices(evidence: Evidence) -> str:
    """The action A scored under every prompt, and under every other trace's reasoning."""
    flow = evidence.flow
    gains = flow_rows(flow)
    order = np.argsort(flow.row_prompt, kind="stable")
    scored = np.isfinite(flow.input)
    by_input = heatmap(centered(flow.input, scored), flow.row_prompt, gains["input"])
    swapped = flow.reasoning[:, order]
    by_reasoning = heatmap(
        centered(swapped, np.isfinite(swapped)), flow.row_prompt, gains["reasoning"]
    )
    return "\n".join(
        [
            "<h3>Information flow: the action's matrices</h3>",
            figure_block(
                heatmap_picture(by_input, "prompts (columns)", "input → action"),
                "action under every prompt",
                "Each action A scored after every prompt, with its own reasoning and the text "
                "between: how much the input still moves the action beyond the reasoning.",
                by_input.note,
            ),
            figure_block(
                heatmap_picture(
                    by_reasoning, "reasoning swapped in (traces, by prompt)", "reasoning → action"
                ),
                "action under swapped reasoning",
                "Each action A scored after its own prompt with another trace's reasoning "
                "swapped in: a diagonal means the action follows its reasoning.",
                by_reasoning.note,
            ),
        ]
    )


def _cell(value: Any, key: str) -> str:
    if key == "text":
        return f'<td class="text">{escape(str(value))}</td>'
    if value is None:
        return '<td data-value="">-</td>'
    if isinstance(value, int):
        return f'<td data-value="{value}">{value}</td>'
    return f'<td data-value="{value!r}">{format_number(float(value))}</td>'


def prompt_table(report: Report, anchor: str, linked: bool) -> str:
    """SPEC "Per-prompt table", sortable by any column; a prompt's number opens its traces."""
    rows = report.per_prompt
    if not rows:
        return "<h2>Per-prompt table</h2>" + note("this report has no per-prompt table")
    keys = [(key, header) for key, header in PROMPT_COLUMNS if key in rows[0]]
    head = "".join(
        f'<th class="{"text" if key == "text" else ""}">{escape(header)}</th>'
        for key, header in keys
    )
    body = []
    for row in rows:
        cells = [_cell(row[key], key) for key, _ in keys]
        if linked:
            j = row["index"]
            cells[0] = f'<td data-value="{j}"><a href="#{anchor}prompt-{j}">{j}</a></td>'
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        "<h2>Per-prompt table</h2>"
        + note("Click a header to sort; a prompt's number opens its traces. own MI: the "
               "prompt's matched minus marginal over log N.")
        + f'<table class="prompts sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )  # fmt: skip


def _marked(segments: Sequence[Segment]) -> str:
    return "".join(
        escape(s.text) if s.shared == PLAIN else f'<mark class="{s.shared}">{escape(s.text)}</mark>'
        for s in segments
    )


def _cut(text: str) -> str:
    return text if len(text) <= TRACE_CHARS else text[:TRACE_CHARS] + " …"


def traces_of(evidence: Evidence, prompt: int) -> list[str]:
    rows = np.flatnonzero(evidence.matrix.row_prompt == prompt)
    return [evidence.reasoning[int(r)] for r in rows]


def pictures(evidence: Evidence, prompt: int) -> str:
    """The prompt's images, as its traces were scored under them."""
    return "".join(
        f'<img class="picture" src="{picture_uri(image)}" alt="{escape(Path(image.source).name)}"'
        f' title="{escape(image.source)}">'
        for image in evidence.images_of(prompt)
    )


def side_by_side(report: Report, evidence: Evidence) -> str:
    """The most collapsed prompts' traces in columns, what they share marked."""
    ranked = most_collapsed(report.per_prompt, len(report.per_prompt)) or [
        {"index": j, "own_mi": None} for j in range(evidence.matrix.num_prompts)
    ]
    chosen = [row for row in ranked if traces_of(evidence, row["index"])][:SIDE_BY_SIDE]
    if len(chosen) < 2:
        return ""
    groups = [[_cut(t) for t in traces_of(evidence, r["index"])[:TRACES_SHOWN]] for r in chosen]
    columns = []
    for row, marked in zip(chosen, shared_spans(groups), strict=True):
        j = row["index"]
        own = "-" if row["own_mi"] is None else format_number(row["own_mi"])
        traces = "".join(f'<div class="trace">{_marked(s)}</div>' for s in marked)
        prompt = row.get("text") or evidence.prompts[j][-200:]
        columns.append(
            f'<div class="column"><h3>prompt {j} (own MI {own})</h3>{pictures(evidence, j)}'
            f'<div class="note">{escape(prompt)}</div>{traces}</div>'
        )
    return (
        "<h2>Traces of different prompts, side by side</h2>"
        + note("The prompts of lowest own MI. Strongly marked: a phrase of three words or "
               "more that another of these prompts' traces also hold; lightly marked: a word "
               "all of them use. A template shows as reasoning marked nearly everywhere.")
        + f'<div class="side">{"".join(columns)}</div>'
    )  # fmt: skip


def trace_html(evidence: Evidence, row: int, scale: float, shaded: set[int]) -> str:
    """A row's reasoning, each token shaded by its information where the page shades it."""
    if row in shaded:
        return shaded_trace(evidence, row, scale, TRACE_CHARS) or ""
    return escape(_cut(evidence.reasoning[row]))


def traces_by_prompt(report: Report, evidence: Evidence, anchor: str) -> str:
    """Every prompt's traces, each folded under its prompt (the table links here), each
    token shaded by its information where it was measured (SPEC "Where the input shows")."""
    own = {row["index"]: row.get("own_mi") for row in report.per_prompt}
    scale, shaded = shading_scale(evidence), shaded_rows(evidence)
    blocks = []
    for j in range(evidence.matrix.num_prompts):
        rows = np.flatnonzero(evidence.matrix.row_prompt == j)
        mi = own.get(j)
        label = f"prompt {j}" + ("" if mi is None else f" (own MI {format_number(mi)})")
        items = "".join(
            f'<div class="trace">{trace_html(evidence, int(r), scale, shaded)}</div>' for r in rows
        )
        blocks.append(
            f'<details class="prompt" id="{anchor}prompt-{j}"><summary>{escape(label)}, '
            f"{len(rows)} scored traces</summary>"
            f'<div class="trace"><b>prompt:</b> {escape(_cut(evidence.prompts[j]))}</div>'
            f"{items}</details>"
        )
    return "<h2>Traces by prompt</h2>" + "".join(blocks)


def report_body(report: Report, anchor: str = "") -> str:
    """Everything a page shows of one report (`anchor` keeps two reports' links apart): the
    verdict, the pictures, the numbers as the console prints them, the tables."""
    evidence = evidence_of(report)
    numbers = "<h2>The numbers</h2>" + console_fragment(lambda c: print_report(c, report))
    if evidence is None:
        missing = note("no cross-scoring matrix to draw: this report.json was read without "
                       "its dump (SPEC \"Dump format\")")  # fmt: skip
        across = across_turns_section(report, episodes_of(report))
        return "\n".join(
            [verdict_banner(report), missing, across, numbers, prompt_table(report, anchor, False)]
        )
    return "\n".join(
        [
            verdict_banner(report),
            matrix_section(report, evidence),
            where_section(report.token_information, evidence, TRACE_CHARS),
            early_answer_section([("", report.early_answer)], "Early answering"),
            across_turns_section(report, episodes_of(report)),
            side_by_side(report, evidence),
            numbers,
            prompt_table(report, anchor, linked=True),
            traces_by_prompt(report, evidence, anchor),
        ]
    )


def scan_page(report: Report, title: str) -> str:
    return page(title, report_body(report))


def step_strip(run: RunReport) -> str:
    """One small heatmap per step (prompts by prompts, one colour scale for the run), the
    onset outlined."""
    matrices = [matrix_of(step.report) for step in run.steps]
    small = [
        None if m is None else step_picture(centered(m.mean, m.scored), m.row_prompt)
        for m in matrices
    ]
    limit = run_limit([s for s in small if s is not None])
    figures = []
    for index, (step, picture) in enumerate(zip(run.steps, small, strict=True)):
        regime = step.report.verdict.regime
        onset = " onset" if run.onset is not None and run.onset.index == index else ""
        label = escape(step.checkpoint.label) + (" (onset)" if onset else "")
        image = (
            '<div class="note">no dump</div>'
            if picture is None
            else f'<img src="{thumbnail(picture, limit)}" alt="step {label}">'
        )
        figures.append(
            f'<figure class="{escape(regime)}{onset}">{image}<figcaption>{label}<br>'
            f"{escape(regime.replace('_', ' '))}</figcaption></figure>"
        )
    return (
        "<h2>The matrix along the run</h2>"
        + note("Each step's matrix, prompts against prompts (each prompt's traces averaged, "
               "binned to 32 a side), on one colour scale: the diagonal fades where the "
               "reasoning stops reading the input. Outlined: the onset.")
        + f'<div class="steps">{"".join(figures)}</div>'
    )  # fmt: skip


START_CAPTION = (
    "Each step's reasoning scored under the policy the run started from (--baseline). "
    "log p under the start: how probable the start finds it, per trace; typicality: that "
    "minus the start's own traces' mean (above 0: more probable than the start's own text, "
    "a mode of its prior; far below: text it would not write); KL: what a KL penalty to the "
    "start charges for it, per trace. 95% intervals over prompts."
)


def start_section(run: RunReport) -> str:
    """SPEC "Scored under the start" along the run: how far the reasoning moved from the
    start, and whether toward the start's own modes ("" where no step was scored so)."""
    if not run.scored_under_start:
        return ""
    rows = []
    for step in run.steps:
        report = step.report
        cells = [escape(step.checkpoint.label)]
        if report.prior.baseline is None:
            cells += ["the start"] + ["-"] * 3
        else:
            cells.append(escape(report.prior.regime.replace("_", " ")))
            cells += [escape(metric_cell(report, key)) for key in START_KEYS]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("step", "reading", "log p under the start", "typicality", "KL from the start")
    )
    return (
        "<h2>From the start along the run</h2>" + note(START_CAPTION)
        + f'<table class="start"><tr>{head}</tr>{"".join(rows)}</table>'
    )  # fmt: skip


START_KEYS = ("prior_logprob_seq", "prior_typicality", "prior_kl_seq")


def run_page(run: RunReport, title: str) -> str:
    from collapsecheck.reports.plot import run_figure

    latest = run.steps[-1]
    body = [
        verdict_banner(latest.report),
        f'<div class="plot">{svg_text(run_figure(run))}</div>',
        step_strip(run),
        where_along_run([(s.checkpoint.label, s.report.token_information) for s in run.steps]),
        early_answer_section(
            [(s.checkpoint.label, s.report.early_answer) for s in run.steps],
            "Early answering along the run",
        ),
        start_section(run),
        console_fragment(lambda c: print_run(c, run), width_of(run_table(run))),
        f"<h2>Latest: {escape(latest.checkpoint.label)}</h2>",
        report_body(latest.report),
    ]
    return page(title, "\n".join(body))


def compare_page(comparison: Comparison, title: str) -> str:
    outcome = "lost" if comparison.lost else "kept"
    columns = "".join(
        f'<div class="column"><h2>{name}: {escape(str(r.settings.get("checkpoint", "")))}</h2>'
        f"{report_body(r, anchor=name.lower() + '-')}</div>"
        for name, r in (("A", comparison.a), ("B", comparison.b))
    )
    body = [
        f'<div class="verdict {outcome}">{escape(comparison.reason)}</div>',
        console_fragment(lambda c: print_comparison(c, comparison)),
        f'<div class="pair">{columns}</div>',
    ]
    return page(title, "\n".join(body))


def write_html(path: Path, subject: Report | RunReport | Comparison, title: str) -> Path:
    """--html: the page of a scan, a run or a comparison."""
    if isinstance(subject, RunReport):
        text = run_page(subject, title)
    elif isinstance(subject, Comparison):
        text = compare_page(subject, title)
    else:
        text = scan_page(subject, title)
    return write_text_atomic(path, text)
