"""The picture of a run (`--plot FILE.png`): input dependence and entropy along the steps,
the trainer's own reward and entropy beside normalized MI (when a training log was read), and
the four-quadrant view of entropy against MI with the run's path through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.errors import CollapsecheckError
from collapsecheck.measures.metrics import interval_bounds, point_value
from collapsecheck.measures.verdict import (
    GROUNDED,
    INCONCLUSIVE,
    LOW_ENTROPY_COLLAPSE,
    TEMPLATE_COLLAPSE,
)
from collapsecheck.reports.run_report import RunReport

REGIME_COLOURS = {
    GROUNDED: "#d9f0d3",
    TEMPLATE_COLLAPSE: "#f4c7c3",
    LOW_ENTROPY_COLLAPSE: "#e1d5ee",
    INCONCLUSIVE: "#e8e8e8",
}
REGIME_NAMES = {
    GROUNDED: "grounded",
    TEMPLATE_COLLAPSE: "template collapse",
    LOW_ENTROPY_COLLAPSE: "low-entropy collapse",
    INCONCLUSIVE: "inconclusive",
}


def _series(run: RunReport, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    metrics = [s.report.metrics[key] for s in run.steps]
    values = np.array([point_value(m) for m in metrics])
    bounds = np.array([interval_bounds(m) for m in metrics])
    return values, bounds[:, 0], bounds[:, 1]


def _x_positions(run: RunReport) -> tuple[np.ndarray, str]:
    steps = [s.checkpoint.step for s in run.steps]
    if all(step is not None for step in steps):
        return np.array(steps, dtype=float), "training step"
    return np.arange(len(steps), dtype=float), "checkpoint"


def _band_edges(x: np.ndarray) -> np.ndarray:
    """Where each checkpoint's regime band starts and ends: half-way to its neighbours."""
    return np.concatenate(
        [
            [x[0] - 0.5 * (x[1] - x[0]) if len(x) > 1 else x[0] - 0.5],
            (x[:-1] + x[1:]) / 2,
            [x[-1] + 0.5 * (x[-1] - x[-2]) if len(x) > 1 else x[-1] + 0.5],
        ]
    )


def _legend(ax, entropy_ax, regimes: list[str]) -> None:
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = entropy_ax.get_legend_handles_labels()
    bands = [r for r in REGIME_COLOURS if r in regimes]
    handles += more_handles + [Patch(color=REGIME_COLOURS[r]) for r in bands]
    labels += more_labels + [REGIME_NAMES[r] for r in bands]
    ax.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8,
        frameon=False,
    )  # fmt: skip


def _along_steps(ax, run: RunReport) -> None:
    x, xlabel = _x_positions(run)
    edges = _band_edges(x)
    # the entropy axis lies underneath: it carries the regime bands, the input-dependence
    # lines are drawn over both
    entropy_ax = ax.twinx()
    ax.set_zorder(entropy_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    regimes = [step.report.verdict.regime for step in run.steps]
    for i, regime in enumerate(regimes):
        entropy_ax.axvspan(edges[i], edges[i + 1], color=REGIME_COLOURS[regime], lw=0)
    thresholds = run.steps[0].report.thresholds
    for level in (thresholds.dependence_high, thresholds.dependence_collapsed):
        ax.axhline(level, color="0.55", lw=0.8, ls=":")
    measured = any(step.report.flow.regime != "not_measured" for step in run.steps)
    flow_lines = (("action_reasoning_share", "reasoning->action (flow)", "#7b1fa2"),)
    for key, label, colour in (
        ("normalized_mi", "normalized MI", "#1f5fa8"),
        ("retrieval_skill", "retrieval skill", "#d9730d"),
        *(flow_lines if measured else ()),
    ):
        values, low, high = _series(run, key)
        ax.fill_between(x, low, high, color=colour, alpha=0.2, lw=0)
        ax.plot(x, values, "o-", color=colour, label=label, ms=4)
    if all(step.report.snr is not None for step in run.steps):
        zero = [step.report.snr["frac_reward_zero_std"] for step in run.steps]
        ax.plot(x, zero, "^:", color="0.3", ms=4, label="prompts with tied rewards (share)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("input dependence")
    if len(x) <= 12:
        ax.set_xticks(x, [s.checkpoint.label for s in run.steps])

    values, low, high = _series(run, "conditional_entropy_est")
    entropy_ax.fill_between(x, low, high, color="#2e7d32", alpha=0.15, lw=0)
    entropy_ax.plot(x, values, "s--", color="#2e7d32", ms=4, label="H(Z|X) (right axis)")
    entropy_ax.set_ylabel("conditional entropy H(Z|X), nats/token")
    entropy_ax.set_ylim(bottom=0)

    if run.onset is not None:
        onset_x = x[run.onset.index]
        ax.axvline(onset_x, color="black", lw=1.2, ls="--")
        label = f" onset: {run.onset.kind}"
        ax.annotate(label, (onset_x, 1.03), ha="left", va="top", fontsize=9, fontweight="bold")
    _legend(ax, entropy_ax, regimes)
    ax.set_title("Along the run (bands: verdict at each checkpoint)", fontsize=10)


TRAINER_COLOURS = {"reward": "#c62828", "entropy": "#2e7d32"}


def _trainer_view(ax, run: RunReport) -> None:
    """The trainer's dashboard beside the diagnosis (SPEC "Training logs beside the
    diagnosis"): each logged series and normalized MI as 1 + its change relative to its value
    at the first checkpoint that has it (a multiple of it when positive; up stays up for a
    reward that starts negative), so "reward up, entropy flat, input dependence gone" reads
    at a glance. A series whose first value is 0 cannot be indexed and is left out."""
    x, xlabel = _x_positions(run)
    mi, mi_low, mi_high = _series(run, "normalized_mi")
    if mi[0] > 0:
        ax.fill_between(x, mi_low / mi[0], mi_high / mi[0], color="#1f5fa8", alpha=0.2, lw=0)
        ax.plot(x, mi / mi[0], "o-", color="#1f5fa8", ms=4, label="normalized MI (collapsecheck)")
    for name in run.logged_series:
        rows = [
            (i, s.training_log[name]) for i, s in enumerate(run.steps) if name in s.training_log
        ]
        first = rows[0][1].mean
        if first == 0:
            continue
        at = np.array([x[i] for i, _ in rows])
        means = np.array([w.mean for _, w in rows])
        errors = np.array([w.stderr or 0.0 for _, w in rows])
        colour = TRAINER_COLOURS.get(name)
        ax.errorbar(
            at, 1 + (means - first) / abs(first), yerr=errors / abs(first), fmt="s--", ms=4,
            capsize=2, color=colour, label=f"{name} (trainer's log)",
        )  # fmt: skip
    ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("relative to its first value (= 1)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    ax.set_title("What the trainer's dashboard showed, and what it missed", fontsize=10)


def _quadrants(ax, run: RunReport) -> None:
    thresholds = run.steps[0].report.thresholds
    mi, mi_low, mi_high = _series(run, "normalized_mi")
    entropy, entropy_low, entropy_high = _series(run, "conditional_entropy_est")
    top = max(float(entropy_high.max()) * 1.15, thresholds.entropy_low * 3)
    ax.axvspan(thresholds.dependence_high, 1.05, color=REGIME_COLOURS[GROUNDED], lw=0)
    ax.axvspan(-0.05, thresholds.dependence_high, ymin=0, ymax=1, color="#fbe9e7", lw=0)
    ax.axvline(thresholds.dependence_high, color="0.4", lw=0.8)
    ax.axvline(thresholds.dependence_collapsed, color="0.6", lw=0.8, ls=":")
    ax.axhline(thresholds.entropy_low, color="0.4", lw=0.8)
    labels = (
        (1.0, top * 0.97, "grounded,\ndiverse", "right", "top"),
        (1.0, thresholds.entropy_low * 0.5, "grounded,\ncompressed", "right", "center"),
        (0.0, top * 0.97, "template\ncollapse", "left", "top"),
        (0.0, thresholds.entropy_low * 0.5, "low-entropy collapse", "left", "center"),
    )
    for x, y, text, ha, va in labels:
        ax.text(x, y, text, ha=ha, va=va, fontsize=8, color="0.3", style="italic")
    ax.errorbar(
        mi,
        entropy,
        xerr=[mi - mi_low, mi_high - mi],
        yerr=[entropy - entropy_low, entropy_high - entropy],
        fmt="none",
        ecolor="0.5",
        elinewidth=0.8,
        capsize=2,
    )
    for i in range(len(mi) - 1):
        ax.annotate(
            "",
            xy=(mi[i + 1], entropy[i + 1]),
            xytext=(mi[i], entropy[i]),
            arrowprops={"arrowstyle": "->", "color": "0.35", "lw": 1.0, "shrinkA": 4, "shrinkB": 4},
        )
    order = np.linspace(0, 1, len(mi))
    ax.scatter(mi, entropy, c=order, cmap="viridis", s=36, zorder=3, edgecolors="black", lw=0.5)
    for step, x, y in zip(run.steps, mi, entropy, strict=True):
        ax.annotate(
            step.checkpoint.label, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=8
        )
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(0, top)
    ax.set_xlabel("input dependence: normalized MI")
    ax.set_ylabel("within-input diversity: H(Z|X), nats/token")
    ax.set_title("Regimes: the run's path, early (purple) to late (yellow)", fontsize=10)


def run_figure(run: RunReport) -> Any:
    """Both panels of a run (three with the trainer's log) in one matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = bool(run.logged_series)
    panels = 3 if logged else 2
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5), gridspec_kw={"wspace": 0.32})
    _along_steps(axes[0], run)
    if logged:
        _trainer_view(axes[1], run)
    _quadrants(axes[-1], run)
    onset = f"onset at step {run.onset_step}" if run.onset is not None else "no onset"
    figure.suptitle(f"collapsecheck: {run.name} ({onset})", fontsize=12)
    return figure


def plot_run(run: RunReport, path: str | Path) -> Path:
    """Draw the run's figure into a PNG file."""
    import matplotlib.pyplot as plt

    path = Path(path)
    figure = run_figure(run)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=150, bbox_inches="tight")
    except OSError as err:
        raise CollapsecheckError(f"--plot {path}: cannot write ({err.strerror or err})") from None
    finally:
        plt.close(figure)
    return path
