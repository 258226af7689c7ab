"""The page's pictures, drawn with matplotlib into self-contained strings: the cross-scoring
matrix as a heatmap beside each row's matched minus marginal (PNG, as a data URI: its size
is bounded by its pixels, not by the matrix), a run's small per-step heatmaps, and the run
plot (SVG: lines stay sharp and small)."""

from __future__ import annotations

import base64
import io
import itertools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

# Above this many rows a heatmap shows each prompt's rows averaged (one row per prompt).
MAX_ROWS = 512
# A run's per-step heatmaps show at most this many prompts a side (prompts binned).
THUMBNAIL_SIDE = 32
# The colour scale reaches at least this far (nats per token), so that noise around a flat
# field stays pale instead of filling the scale.
MIN_LIMIT = 0.25
COLORMAP = "RdBu"  # blue: the column makes the row likelier
# A prompt's image on the page: at most this many pixels a side (smaller ones kept as they are).
PICTURE_SIDE = 160


@dataclass(frozen=True)
class Heatmap:
    """A matrix as drawn: `cells` (rows x columns, NaN where not scored), each row's prompt,
    each row's matched minus marginal (`gain`), and a note when rows were summarised."""

    cells: np.ndarray
    row_prompt: np.ndarray
    gain: np.ndarray
    note: str = ""


def centered(values: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """Each row minus its log-mean-exp over its scored cells: how much more likely the row
    is under that column than under the batch's mixture (SPEC "The cross log-probability
    matrix"); NaN where not scored. A grounded policy shows a bright diagonal of blocks."""
    from scipy.special import logsumexp

    masked = np.where(scored, values, -np.inf)
    count = np.maximum(scored.sum(axis=1, keepdims=True), 1)
    center = logsumexp(masked, axis=1, keepdims=True) - np.log(count)
    return np.where(scored, values - center, np.nan)


def heatmap(cells: np.ndarray, row_prompt: np.ndarray, gain: np.ndarray) -> Heatmap:
    """Rows grouped by prompt (stable within a prompt); above MAX_ROWS rows, one row per
    prompt holding the mean of its rows."""
    order = np.argsort(row_prompt, kind="stable")
    cells, row_prompt, gain = cells[order], row_prompt[order], gain[order]
    if len(row_prompt) <= MAX_ROWS:
        return Heatmap(cells, row_prompt, gain)
    prompts = np.unique(row_prompt)
    with _quiet_nan_means():
        averaged = np.stack([np.nanmean(cells[row_prompt == p], axis=0) for p in prompts])
        gains = np.array([np.nanmean(gain[row_prompt == p]) for p in prompts])
    note = f"{len(row_prompt)} rows: each prompt's rows averaged into one"
    return Heatmap(averaged, prompts, gains, note)


@contextmanager
def _quiet_nan_means() -> Iterator[None]:
    """Means of all-NaN slices are NaN (a prompt without scored rows), without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _limit(cells: np.ndarray) -> float:
    """The colour scale's reach: the 99th percentile of |cells|, at least MIN_LIMIT."""
    finite = np.abs(cells[np.isfinite(cells)])
    return max(float(np.percentile(finite, 99)) if finite.size else 0.0, MIN_LIMIT)


def data_uri(figure: Any, dpi: int = 100) -> str:
    """A figure as a PNG data URI (the figure is closed)."""
    plt = _pyplot()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def svg_text(figure: Any) -> str:
    """A figure as inline SVG markup (the figure is closed)."""
    plt = _pyplot()
    buffer = io.StringIO()
    try:
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    finally:
        plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def heatmap_picture(drawn: Heatmap, columns: str, gain_label: str) -> str:
    """The heatmap beside a bar per row of matched minus marginal, as a PNG data URI."""
    plt = _pyplot()
    rows = drawn.cells.shape[0]
    height = float(np.clip(rows / 40, 3.5, 9))
    figure, (ax, bars) = plt.subplots(
        1, 2, figsize=(9, height), sharey=True, gridspec_kw={"width_ratios": [4, 1], "wspace": 0.04}
    )
    limit = _limit(drawn.cells)
    shown = np.ma.masked_invalid(drawn.cells)
    cmap = plt.get_cmap(COLORMAP).with_extremes(bad="#d9d9d9")
    image = ax.imshow(
        shown, aspect="auto", cmap=cmap, vmin=-limit, vmax=limit, interpolation="nearest"
    )
    edges = np.flatnonzero(np.diff(drawn.row_prompt)) + 0.5
    if len(edges) < 80:
        for edge in edges:
            ax.axhline(edge, color="white", linewidth=0.4)
    ax.set_xlabel(columns)
    ax.set_ylabel("traces, grouped by their own prompt" if not drawn.note else "prompts")
    figure.colorbar(image, ax=bars, fraction=0.25, pad=0.08, label="nats per token vs row mix")
    colors = np.where(drawn.gain > 0, "#2166ac", "#b2182b")
    bars.barh(np.arange(rows), np.nan_to_num(drawn.gain), color=colors, height=1.0)
    bars.axvline(0, color="black", linewidth=0.6)
    bars.set_xlabel(gain_label)
    bars.set_ylim(rows - 0.5, -0.5)
    return data_uri(figure)


def binned(cells: np.ndarray, side: int) -> np.ndarray:
    """A square matrix averaged into at most `side` x `side` blocks."""
    n = cells.shape[0]
    if n <= side:
        return cells
    blocks = list(itertools.pairwise(np.linspace(0, n, side + 1).astype(int)))
    with _quiet_nan_means():
        return np.array([[np.nanmean(cells[a:b, c:d]) for c, d in blocks] for a, b in blocks])


def prompt_by_prompt(cells: np.ndarray, row_prompt: np.ndarray) -> np.ndarray:
    """Each prompt's rows averaged: an N x N matrix (NaN for a prompt without rows)."""
    n = cells.shape[1]
    out = np.full((n, n), np.nan)
    with _quiet_nan_means():
        for p in np.unique(row_prompt):
            out[p] = np.nanmean(cells[row_prompt == p], axis=0)
    return out


def run_limit(small: list[np.ndarray]) -> float:
    """One colour scale for all of a run's small heatmaps, so that a fading diagonal fades."""
    return _limit(np.concatenate([m.ravel() for m in small])) if small else MIN_LIMIT


def step_picture(cells: np.ndarray, row_prompt: np.ndarray) -> np.ndarray:
    """A step's matrix as its small heatmap shows it: prompts against prompts, binned to
    THUMBNAIL_SIDE a side."""
    return binned(prompt_by_prompt(cells, row_prompt), THUMBNAIL_SIDE)


def thumbnail(small: np.ndarray, limit: float) -> str:
    """A small heatmap as a PNG data URI, one pixel per cell (the page scales it up without
    smoothing), on the colour scale +-`limit`."""
    plt = _pyplot()
    cmap = plt.get_cmap(COLORMAP).with_extremes(bad="#d9d9d9")
    buffer = io.BytesIO()
    shown = np.ma.masked_invalid(small)
    plt.imsave(buffer, shown, cmap=cmap, vmin=-limit, vmax=limit, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def picture_uri(image: Any) -> str:
    """A prompt's image (`inputs.images.PromptImage`) as a PNG data URI, shrunk to at most
    PICTURE_SIDE pixels a side."""
    picture = image.open()
    picture.thumbnail((PICTURE_SIDE, PICTURE_SIDE))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def early_answer_picture(curves: list[tuple[str, Any]]) -> str:
    """SPEC "Early answering": per curve (a label, an `EarlyAnswer`), the agreement of an
    answer forced after each fraction of the reasoning, relative to the whole reasoning's,
    with its 95% band; one curve for a scan, one per step along a run (darker: later). PNG
    data URI."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(5.5, 3.2))
    colours = plt.get_cmap("viridis")(np.linspace(0.85, 0.1, max(len(curves), 1)))
    for (label, early), colour in zip(curves, colours, strict=False):
        x = 100 * np.array(early.fractions)
        value = np.array([r.value for r in early.relative])
        low = np.array([r.low for r in early.relative])
        high = np.array([r.high for r in early.relative])
        ax.fill_between(x, low, high, color=colour, alpha=0.15, lw=0)
        ax.plot(x, value, marker="o", ms=3, color=colour, label=label)
    ax.axhline(1.0, color="0.55", lw=0.8, ls=":")
    ax.set_xlabel("reasoning kept before the answer is forced (%)")
    ax.set_ylabel("agreement vs whole reasoning")
    ax.set_ylim(bottom=0)
    if len(curves) > 1:
        ax.legend(fontsize=7, title="step", title_fontsize=7, loc="best", ncol=2)
    return data_uri(figure)


TENTHS = [f"{10 * d}-{10 * d + 10}" for d in range(10)]


def information_picture(where: Any) -> str:
    """SPEC "Where the input shows": a scan's information in each tenth of its reasoning
    (a `WhereInputShows`), nats a trace, with 95% intervals. PNG data URI."""
    plt = _pyplot()
    value = np.array([p.value for p in where.by_position])
    low = np.array([p.low for p in where.by_position])
    high = np.array([p.high for p in where.by_position])
    figure, ax = plt.subplots(figsize=(5.5, 2.8))
    colours = np.where(value >= 0, "#2166ac", "#b2182b")
    ax.bar(TENTHS, value, color=colours, yerr=[value - low, high - value], capsize=2)
    ax.axhline(0.0, color="0.55", lw=0.8)
    ax.set_xlabel("tenth of the reasoning (%)")
    ax.set_ylabel("information (nats a trace)")
    ax.tick_params(axis="x", labelsize=7)
    return data_uri(figure)


def information_by_step_picture(steps: list[tuple[str, Any]]) -> str:
    """Each step's information by tenth of its reasoning (a row per step, earliest on top),
    on one colour scale centred on 0 (blue: the tokens there carry the input). PNG data
    URI."""
    plt = _pyplot()
    cells = np.array([[p.value for p in where.by_position] for _, where in steps])
    limit = max(float(np.nanmax(np.abs(cells))), 1e-3)
    figure, ax = plt.subplots(figsize=(6.0, 0.9 + 0.28 * len(steps)))
    shown = ax.imshow(cells, cmap=COLORMAP, vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(10), TENTHS, fontsize=7)
    ax.set_yticks(range(len(steps)), [label for label, _ in steps], fontsize=7)
    ax.set_xlabel("tenth of the reasoning (%)")
    ax.set_ylabel("step")
    figure.colorbar(shown, ax=ax, label="nats a trace")
    return data_uri(figure)
