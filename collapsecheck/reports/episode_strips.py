"""The HTML page's section on agents across turns (SPEC "Agents across turns"): input
dependence by turn as a table, and a few episodes as strips of states and actions, each
step marked as the episode metrics count it (stalled, revisited, undone)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from collapsecheck.inputs.episodes import Episode
from collapsecheck.measures.by_turn import BY_TURN_KEYS, TurnDependence, stops_reading
from collapsecheck.measures.episodes import NOT_MEASURED, STEP, episode_ids, step_kinds
from collapsecheck.measures.metrics import Estimate, interval_text

STRIPS_SHOWN = 4  # episodes drawn as strips
STATE_CHARS = 200  # of a state shown in a strip's cell
STRIP_CAPTION = (
    "Each row one episode, a cell per turn: the state the policy saw, then the action it took. "
    "A cell's mark says what that action did: stalled (the state did not change), revisited "
    "(back to a state the episode had left), undone (back to the state before the last move). "
    "The last cell is the observation after the last turn, where it is known."
)
MARKS = {"stall": "stalled", "revisit": "revisited", "undo": "undone"}
HEADERS = {"normalized_mi": "normalized MI", "retrieval_skill": "retrieval skill",
           "conditional_entropy_est": "H(Z|X) nats/token"}  # fmt: skip


def _cell(metric: Any) -> str:
    return interval_text(metric) if isinstance(metric, Estimate) else "—"


def by_turn_table(entries: Sequence[TurnDependence]) -> str:
    head = "".join(f"<th>{escape(HEADERS[k])}</th>" for k in BY_TURN_KEYS)
    rows = "".join(
        f"<tr><td>{e.turn}</td><td>{e.contexts}</td><td>{e.pairs}</td>"
        + "".join(f"<td>{escape(_cell(e.metrics.get(k)))}</td>" for k in BY_TURN_KEYS)
        + "</tr>"
        for e in entries
    )
    return (
        '<table class="by-turn"><tr><th>turn</th><th>contexts N<sub>t</sub></th><th>pairs</th>'
        f"{head}</tr>{rows}</table>"
    )


def strips(episodes: Sequence[Episode], shown: int = STRIPS_SHOWN) -> str:
    """`shown` episodes, those with a stalled, revisited or undone step first."""
    ids, _ = episode_ids(episodes)
    kinds = [step_kinds(e) for e in ids]
    order = sorted(range(len(episodes)), key=lambda i: all(k == STEP for k in kinds[i]))
    rows = []
    for i in order[:shown]:
        episode = episodes[i]
        cells = []
        for number, turn in enumerate(episode.turns):
            kind = kinds[i][number] if number < len(kinds[i]) else ""
            mark = f'<span class="mark">{MARKS[kind]}</span>' if kind in MARKS else ""
            cells.append(
                f'<td class="turn {kind}"><pre>{escape(turn.state[:STATE_CHARS])}</pre>'
                f"<b>{escape(turn.action or '(no action)')}</b>{mark}</td>"
            )
        if episode.final_state is not None:
            cells.append(f'<td class="final"><pre>{escape(episode.final_state[:STATE_CHARS])}'
                         "</pre></td>")  # fmt: skip
        seed = f", seed {episode.seed}" if episode.seed is not None else ""
        ended = {True: "succeeded", False: "failed", None: ""}[episode.success]
        label = f"start {episode.start}{seed}{', ' + ended if ended else ''}"
        rows.append(f"<tr><th>{escape(label)}</th>{''.join(cells)}</tr>")
    return f'<table class="strips">{"".join(rows)}</table>'


def across_turns_section(report: Any, episodes: Sequence[Episode] | None) -> str:
    """The section ("" for single-turn prompts): the reading, by-turn table, strips."""
    if not report.by_turn and report.episodes.regime == NOT_MEASURED and not episodes:
        return ""
    parts = ['<section class="across-turns"><h2>Agents across turns</h2>']
    reading = report.episodes
    if reading.regime != NOT_MEASURED or reading.episodes:
        parts.append(f"<p>episodes: <b>{escape(reading.regime)}</b> — {escape(reading.reason)}</p>")
    if report.by_turn:
        parts.append("<h3>Input dependence by turn</h3>" + by_turn_table(report.by_turn))
        finding = stops_reading(report.by_turn, report.thresholds)
        if finding is not None:
            parts.append(f'<p class="finding">{escape(finding)}</p>')
    if episodes:
        parts.append("<h3>Episodes</h3>" + strips(episodes))
        parts.append(f'<div class="note">{escape(STRIP_CAPTION)}</div>')
    return "\n".join(parts) + "</section>"
