"""Training logs beside the diagnosis (SPEC "Training logs beside the diagnosis"): the
trainer's own series averaged over each scanned checkpoint's window of steps, and the
findings that say what the usual monitoring missed. Pure: numbers in, numbers and text out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from collapsecheck.measures.metrics import MetricValue, interval_bounds, point_value

# series -> the keys it is read from, first present wins (SPEC's table)
SERIES = {
    "reward": ("reward", "critic/score/mean", "train/reward"),
    "entropy": ("entropy", "actor/entropy", "train/entropy"),
    "frac_reward_zero_std": ("frac_reward_zero_std", "train/frac_reward_zero_std"),
    "kl": ("kl", "actor/kl_loss", "train/kl"),
    "response_length": (
        "completions/mean_length",
        "response_length/mean",
        "train/completions/mean_length",
    ),
}
SHOWN = ("reward", "entropy")  # shown beside normalized MI, with any --train-key series
MI_FELL = 0.3  # the drop of normalized MI that counts, with non-overlapping intervals
ENTROPY_STILL = 0.25  # entropy within 25% of where it was: the dashboard saw nothing
ZERO_VARIANCE_RISE = 0.1


@dataclass(frozen=True)
class Window:
    """One series over one checkpoint's window of steps."""

    mean: float
    stderr: float | None  # sample sd / sqrt(n); None for n < 2
    n: int

    def to_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "stderr": self.stderr, "n": self.n}


def series_keys(available: Sequence[str], overrides: Mapping[str, str]) -> dict[str, str]:
    """Each series' key: an override (`--train-key NAME=KEY`), else the first key of SPEC's
    table that the log has. Series with no key are left out."""
    keys = {}
    for name, candidates in SERIES.items():
        found = next((k for k in candidates if k in available), None)
        if found is not None:
            keys[name] = found
    keys.update(overrides)
    return keys


def shown_series(present: Iterable[str]) -> list[str]:
    """The trainer's series that a run's table, summary and plot show beside normalized MI
    (SPEC): reward and entropy, then any series named with `--train-key`."""
    present = set(present)
    return [name for name in SHOWN if name in present] + sorted(present - set(SERIES))


def window(values: Sequence[tuple[int, float]], after: int | None, upto: int) -> Window | None:
    """The mean of the values logged at steps in (after, upto] (None: none there)."""
    if after is None:
        return None
    chosen = [v for step, v in values if after < step <= upto]
    if not chosen:
        return None
    mean = sum(chosen) / len(chosen)
    if len(chosen) < 2:
        return Window(mean, None, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in chosen) / (len(chosen) - 1))
    return Window(mean, sd / math.sqrt(len(chosen)), len(chosen))


def step_windows(
    series: Mapping[str, Sequence[tuple[int, float]]],
    steps: Sequence[int | None],
    baseline: bool,
) -> list[dict[str, Window]]:
    """Per scanned step, each series' window: steps (s', s], s' the previous scanned step (0
    for the first; the baseline, step 0 of the run, has no window)."""
    out = []
    previous: int | None = 0
    for index, step in enumerate(steps):
        if baseline and index == 0:
            out.append({})
            previous = 0
            continue
        if step is None:
            out.append({})
            continue
        windows = {name: window(values, previous, step) for name, values in series.items()}
        out.append({name: w for name, w in windows.items() if w is not None})
        previous = step
    return out


@dataclass(frozen=True)
class Finding:
    kind: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


def _span(windows: Sequence[Mapping[str, Window]], name: str) -> tuple[int, int] | None:
    """The first and the latest scanned steps that carry a series."""
    carrying = [i for i, w in enumerate(windows) if name in w]
    return (carrying[0], carrying[-1]) if len(carrying) >= 2 else None


def _mi_fell(mi: Sequence[MetricValue], a: int, b: int) -> bool:
    a_low, _ = interval_bounds(mi[a])
    _, b_high = interval_bounds(mi[b])
    return b_high < a_low and point_value(mi[a]) - point_value(mi[b]) >= MI_FELL


def find(
    labels: Sequence[str], mi: Sequence[MetricValue], windows: Sequence[Mapping[str, Window]]
) -> list[Finding]:
    """SPEC's three findings, each where its series is present and its rule holds."""
    found = []
    span = _span(windows, "entropy")
    if span and _mi_fell(mi, *span):
        a, b = (windows[i]["entropy"].mean for i in span)
        moved = (b - a) / abs(a) if a else math.inf
        if abs(moved) <= ENTROPY_STILL:
            found.append(Finding("entropy_blind", (
                f"the trainer's entropy moved {100 * moved:+.0f}% ({a:.3f} -> {b:.3f} nats/token, "
                f"steps {labels[span[0]]} -> {labels[span[1]]}) while input dependence fell "
                f"{_fall(mi, *span)}: entropy monitoring would not have shown this collapse "
                "(docs/measures.md: 'When the verdict is a collapse')"
            )))  # fmt: skip
    span = _span(windows, "reward")
    if span and _mi_fell(mi, *span):
        a, b = (windows[i]["reward"] for i in span)
        noise = 2 * math.sqrt((a.stderr or 0.0) ** 2 + (b.stderr or 0.0) ** 2)
        if b.mean - a.mean > noise:
            found.append(Finding("reward_without_input", (
                f"reward rose {a.mean:.3f} -> {b.mean:.3f} (steps {labels[span[0]]} -> "
                f"{labels[span[1]]}) while the reasoning stopped depending on the input "
                f"({_fall(mi, *span)}): it is earned without reading the input; look for a "
                "shortcut in the reward (format, length, phrasing)"
            )))  # fmt: skip
    span = _span(windows, "frac_reward_zero_std")
    if span:
        a, b = (windows[i]["frac_reward_zero_std"].mean for i in span)
        if b - a >= ZERO_VARIANCE_RISE:
            found.append(Finding("zero_variance_rising", (
                f"the share of prompts whose rewards all tie rose {a:.2f} -> {b:.2f} (steps "
                f"{labels[span[0]]} -> {labels[span[1]]}): fewer prompts carry a task gradient "
                "(the SNR section, with --reward-fn, says which cause: docs/measures.md 'Why it "
                "collapsed')"
            )))  # fmt: skip
    return found


def strategy_narrowing(
    labels: Sequence[str], metrics: Sequence[Mapping[str, MetricValue]]
) -> Finding | None:
    """SPEC "Agents across turns": between the first and the latest step with episodes,
    H(Z|X) per token within ENTROPY_STILL of where it was while distinct_action_sequences
    fell beyond both intervals (the text varies, the strategy does not); None otherwise."""
    measured = [i for i, m in enumerate(metrics) if _defined(m.get("distinct_action_sequences"))]
    if len(measured) < 2:
        return None
    a, b = measured[0], measured[-1]
    first, last = metrics[a]["distinct_action_sequences"], metrics[b]["distinct_action_sequences"]
    entropy = [point_value(metrics[i]["conditional_entropy_est"]) for i in (a, b)]
    held = entropy[0] > 0 and abs(entropy[1] - entropy[0]) / entropy[0] <= ENTROPY_STILL
    if not (held and interval_bounds(last)[1] < interval_bounds(first)[0]):
        return None
    return Finding("strategy_narrowing", (
        f"the reasoning's entropy held ({entropy[0]:.3f} -> {entropy[1]:.3f} nats/token, steps "
        f"{labels[a]} -> {labels[b]}) while the episodes' distinct action sequences fell "
        f"{point_value(first):.2f} -> {point_value(last):.2f}: the text still varies, the "
        "strategy does not (entropy gaming)"
    ))  # fmt: skip


def _defined(metric: MetricValue | None) -> bool:
    return metric is not None and not math.isnan(point_value(metric))


def _fall(mi: Sequence[MetricValue], a: int, b: int) -> str:
    first, last = point_value(mi[a]), point_value(mi[b])
    share = (first - last) / first if first else 0.0
    return f"normalized MI {first:.2f} -> {last:.2f}, {100 * share:.0f}%"
