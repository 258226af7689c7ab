"""Is checkpoint B worse than checkpoint A beyond noise? Deltas of the key metrics with a
paired bootstrap over prompts (both scans' dumps at hand), else an unpaired approximation from
the two reports' intervals."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.episodes import EPISODES_FILE, Episode
from collapsecheck.measures.early_answer import (
    EARLY_KEYS,
    agreement_key,
    paired_early_differences,
)
from collapsecheck.measures.episodes import (
    EPISODE_KEYS,
    episode_ids,
    paired_episode_deltas,
    worse_beyond_noise,
)
from collapsecheck.measures.flow import NOT_MEASURED, FlowLogProbs, paired_flow_differences
from collapsecheck.measures.image_share import paired_image_share_differences
from collapsecheck.measures.metrics import (
    DEFAULT_RESAMPLES,
    CrossLogProbs,
    Estimate,
    interval_bounds,
    paired_differences,
    point_value,
)
from collapsecheck.measures.prior import PRIOR_METRICS
from collapsecheck.measures.token_information import (
    POSITION_PREFIX,
    POSITIONS,
    WHERE_KEYS,
    paired_where_differences,
    position_key,
    row_summaries,
)
from collapsecheck.measures.verdict import DEPENDENCE_KEYS
from collapsecheck.reports.dump import (
    MATRIX_FILE,
    read_dump,
    read_early,
    read_flow,
    read_image_swapped,
    read_token_information,
)
from collapsecheck.reports.report import Report, metric_to_json

COMPARE_KEYS = (
    "normalized_mi",
    "retrieval_skill",
    "retrieval_accuracy",
    "mi_seq_estimate",
    "conditional_entropy_est",
    "conditional_entropy_seq_est",  # (effective traces: exp of this, its difference unreadable)
    "distinct_reasoning_rate",
    "valid_reasoning_rate",
)
FLOW_COMPARE_KEYS = ("action_state_share", "action_reasoning_share", "action_input_share")
IMAGE_COMPARE_KEYS = ("image_share", "mi_image_seq_estimate")
SAME_PROMPTS_KEYS = ("prompts_sha256", "num_prompts", "as_chat", "system_prompt")
# What must agree for two reports to measure the same thing: (name, where in `settings`).
COMPARABLE = (
    ("prompt set", ("prompts_sha256",)),
    ("number of prompts N", ("num_prompts",)),
    ("samples per prompt K", ("samples_per_prompt",)),
    ("seed", ("sampling", "seed")),
    ("reasoning segment", ("reasoning",)),
    ("chat wrapping (--as-chat)", ("as_chat",)),
    ("system prompt", ("system_prompt",)),
    ("scoring temperature", ("scoring_temperature",)),
)
# A setting's value in reports written before it was recorded: they all scored at 1
UNRECORDED = {("scoring_temperature",): 1.0}


def _setting(report: Report, path: tuple[str, ...]) -> Any:
    value: Any = report.settings
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return UNRECORDED.get(path) if value is None else value


# Played scans count the contexts each policy made itself: their environment and how it was
# played (seeds, turns, episodes) must agree instead (SPEC "Agents across turns")
PLAYED_ONLY = ("number of prompts N", "samples per prompt K")


def differences(a: Report, b: Report) -> list[str]:
    """What differs between two reports' prompts and settings, for a person to read."""
    played = "env" in a.settings and "env" in b.settings
    found = []
    for name, path in COMPARABLE:
        if played and name in PLAYED_ONLY:
            continue
        first, second = _setting(a, path), _setting(b, path)
        if first != second:
            found.append(f"{name}: A {first!r}, B {second!r}")
    if played:
        first, second = (played_as(r) for r in (a, b))
        found += [f"environment's {key}: A {first.get(key)!r}, B {second.get(key)!r}"
                  for key in sorted(first.keys() | second.keys())
                  if first.get(key) != second.get(key)]  # fmt: skip
    return found


def played_as(report: Report) -> dict[str, Any]:
    """How a played scan played its environment (where each value came from left out)."""
    return {
        k: v for k, v in report.settings["env"].items() if k not in ("env_sources", "env_notes")
    }


@dataclass
class Comparison:
    a: Report
    b: Report
    deltas: dict[str, Estimate]
    paired: bool
    lost: bool
    reason: str
    max_drop: float
    warnings: list[str] = field(default_factory=list)
    # the episode metrics paired by start state, and those worse beyond noise (SPEC
    # "Comparing two checkpoints on the same start states")
    episodes_paired: bool = False
    episodes_worse: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": {
                "checkpoint": self.a.settings.get("checkpoint"),
                "verdict": self.a.verdict.to_dict(),
            },
            "b": {
                "checkpoint": self.b.settings.get("checkpoint"),
                "verdict": self.b.verdict.to_dict(),
            },
            "paired": self.paired,
            # SPEC "Scored under the start": B's reasoning under its start (A, where compare
            # scanned B), with the start's path
            "b_prior": self.b_prior(),
            "max_drop": self.max_drop,
            "lost_input_dependence": self.lost,
            "episodes_paired": self.episodes_paired,
            "episodes_worse": self.episodes_worse,
            "reason": self.reason,
            "warnings": self.warnings,
            "metrics": {
                key: {
                    "a": metric_to_json(self.metric("a", key)),
                    "b": metric_to_json(self.metric("b", key)),
                    "delta": metric_to_json(delta),
                }
                for key, delta in self.deltas.items()
            },
        }

    def b_prior(self) -> dict[str, Any]:
        """SPEC "Scored under the start": B's reasoning under its start, where it was read."""
        metrics = self.b.metrics
        values = {k: metric_to_json(metrics[k]) for k in PRIOR_METRICS if k in metrics}
        return {**self.b.prior.to_dict(), **values}

    def metric(self, which: str, key: str) -> Any:
        """A's or B's value of a compared key: a metric, or a key of the snr section."""
        report = self.a if which == "a" else self.b
        if key in report.metrics:
            return report.metrics[key]
        if key.startswith(POSITION_PREFIX):
            return report.token_information.by_position[int(key.removeprefix(POSITION_PREFIX))]
        return (report.snr or {}).get(key, float("nan"))

    def value(self, which: str, key: str) -> float:
        return point_value(self.metric(which, key))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _can_pair(a: Report, b: Report) -> bool:
    """Paired where both scanned the same prompts and kept their dumps; never for played
    episodes (SPEC "Agents across turns"), whose contexts each policy made itself."""
    if "env" in a.settings or "env" in b.settings:
        return False
    same_prompts = all(a.settings.get(k) == b.settings.get(k) for k in SAME_PROMPTS_KEYS)
    have_dumps = all(r.dump_dir and (r.dump_dir / MATRIX_FILE).is_file() for r in (a, b))
    return same_prompts and bool(have_dumps)


def _unpaired_delta(a: Any, b: Any) -> Estimate:
    """B - A with a normal-approximation interval from the two intervals' half-widths."""
    (a_low, a_high), (b_low, b_high) = interval_bounds(a), interval_bounds(b)
    half = math.hypot((a_high - a_low) / 2, (b_high - b_low) / 2)
    delta = point_value(b) - point_value(a)
    return Estimate(delta, delta - half, delta + half)


Flows = tuple[FlowLogProbs | None, FlowLogProbs | None]


def dump_flows(a: Report, b: Report, paired: bool) -> Flows:
    """Both dumps' action matrices, read once for the flow's and early answering's deltas;
    None where the reports do not pair or either did not measure the flow."""
    if not paired or NOT_MEASURED in (a.flow.regime, b.flow.regime):
        return None, None
    return read_flow(a.dump_dir), read_flow(b.dump_dir)


def flow_deltas(
    a: Report, b: Report, flows: Flows, resamples: int, seed: int
) -> dict[str, Estimate]:
    """B - A of the flow's shares where both measured it: paired from the dumps' action
    matrices (`flows`) when there are both, else from the reports' intervals."""
    if NOT_MEASURED in (a.flow.regime, b.flow.regime):
        return {}
    if flows[0] is not None and flows[1] is not None:
        deltas = paired_flow_differences(*flows, resamples=resamples, seed=seed)
        return {key: deltas[key] for key in FLOW_COMPARE_KEYS}
    return {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in FLOW_COMPARE_KEYS}


def early_deltas(
    a: Report, b: Report, flows: Flows, resamples: int, seed: int
) -> dict[str, Estimate]:
    """B - A of early answering's summaries and curve where both measured it over the same
    fractions: paired from the dumps when both hold E (beside their action matrices,
    `flows`), else from the reports' intervals."""
    first, second = a.early_answer, b.early_answer
    if NOT_MEASURED in (first.regime, second.regime) or first.fractions != second.fractions:
        return {}
    early = (None, None)
    if flows[0] is not None and flows[1] is not None:
        early = read_early(a.dump_dir, flows[0]), read_early(b.dump_dir, flows[1])
    if early[0] is not None and early[1] is not None:
        return paired_early_differences(*early, resamples=resamples, seed=seed)
    deltas = {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in EARLY_KEYS}
    for fraction, x, y in zip(first.fractions, first.agreement, second.agreement, strict=True):
        deltas[agreement_key(fraction)] = _unpaired_delta(x, y)
    return deltas


def early_fractions_differ(a: Report, b: Report) -> list[str]:
    """A warning where both measured early answering at other fractions (its curves are then
    not compared)."""
    first, second = a.early_answer, b.early_answer
    if NOT_MEASURED in (first.regime, second.regime) or first.fractions == second.fractions:
        return []
    return [
        f"early answering was measured at other fractions (A {list(first.fractions)}, B "
        f"{list(second.fractions)}): its curves and summaries are not compared"
    ]


def early_change(deltas: dict[str, Estimate]) -> str:
    """What the compare line says where B's action waits for its reasoning more or less
    than A's beyond noise (the early-answer AOC's interval excludes 0)."""
    aoc = deltas.get("early_answer_aoc")
    if aoc is None or aoc.low <= 0 <= aoc.high:
        return ""
    more = "more" if aoc.value > 0 else "less"
    return f"; B's action waits for its reasoning {more} than A's beyond noise: " + _describe(
        "early_answer_aoc", aoc
    )


def where_deltas(
    a: Report, b: Report, matrices: tuple[CrossLogProbs, CrossLogProbs] | None,
    resamples: int, seed: int,
) -> dict[str, Estimate]:  # fmt: skip
    """B - A of SPEC "Where the input shows" (its summaries and each tenth) where both
    measured it: paired from the dumps' token_information.npz when both hold one, else from
    the reports' intervals."""
    first, second = a.token_information, b.token_information
    if NOT_MEASURED in (first.regime, second.regime):
        return {}
    tokens = [read_token_information(r.dump_dir) for r in (a, b)] if matrices is not None else []
    if tokens and all(t is not None for t in tokens):
        rows = [
            row_summaries(t[0], m.row_prompt, m.num_prompts)
            for t, m in zip(tokens, matrices, strict=True)
        ]
        return paired_where_differences(*rows, resamples=resamples, seed=seed)
    deltas = {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in WHERE_KEYS}
    for d, x, y in zip(range(POSITIONS), first.by_position, second.by_position, strict=True):
        deltas[position_key(d)] = _unpaired_delta(x, y)
    return deltas


def where_change(a: Report, b: Report, deltas: dict[str, Estimate]) -> str:
    """What the compare line says where B's reasoning carries the input in other tenths
    than A's beyond noise (each tenth whose interval of the change excludes 0)."""
    moved = []
    for d in range(POSITIONS):
        delta = deltas.get(position_key(d))
        if delta is not None and not delta.low <= 0 <= delta.high:
            side = "more" if delta.value > 0 else "less"
            moved.append(f"{side} at {10 * d}-{10 * d + 10}% ({delta.value:+.2f} nats)")
    if not moved:
        return ""
    regimes = f"A {a.token_information.regime}, B {b.token_information.regime}"
    return f"; where the input shows moved beyond noise ({regimes}): " + ", ".join(moved)


def image_deltas(
    a: Report, b: Report, matrices: tuple[CrossLogProbs, CrossLogProbs] | None,
    resamples: int, seed: int,
) -> dict[str, Estimate]:  # fmt: skip
    """B - A of the image's share where both measured it (SPEC "What the image carries"):
    paired from the dumps' matrices (`matrices`, as read for the other deltas) and their
    image-swapped twins when there are both, else from the reports' intervals."""
    if not all("image_share" in r.metrics for r in (a, b)):
        return {}
    if matrices is not None:
        first, second = (
            (matrix, read_image_swapped(r.dump_dir))
            for matrix, r in zip(matrices, (a, b), strict=True)
        )
        return paired_image_share_differences(first, second, resamples=resamples, seed=seed)
    return {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in IMAGE_COMPARE_KEYS}


def snr_deltas(a: Report, b: Report) -> dict[str, Estimate]:
    """B - A of the zero-variance share and the reward-variance/MI correlation, where both
    reports have rewards (from the reports: the share has no interval)."""
    if a.snr is None or b.snr is None:
        return {}
    share = b.snr["frac_reward_zero_std"] - a.snr["frac_reward_zero_std"]
    return {
        "frac_reward_zero_std": Estimate(share, share, share),
        "rv_mi_spearman": _unpaired_delta(a.snr["rv_mi_spearman"], b.snr["rv_mi_spearman"]),
    }


def episode_deltas(
    a: Report, b: Report, resamples: int, seed: int
) -> tuple[dict[str, Estimate], bool, list[str]]:
    """B - A of the episode metrics where both reports have episodes (SPEC "Agents across
    turns"): paired by start state where both played the same seeds and kept their dumps
    (SPEC "Comparing two checkpoints on the same start states"), else unpaired; whether they
    were paired, and a warning where they could not be."""
    if NOT_MEASURED in (a.episodes.regime, b.episodes.regime):
        return {}, False, []
    played = played_episodes(a), played_episodes(b)
    warnings = []
    if played[0] is not None and played[1] is not None:
        seeds = [{e.seed for e in episodes} for episodes in played]
        if seeds[0] == seeds[1] and None not in seeds[0]:
            order = {s: i for i, s in enumerate(sorted(seeds[0]))}
            ids = [
                episode_ids([dataclasses.replace(e, start=order[e.seed]) for e in episodes])[0]
                for episodes in played
            ]
            deltas = paired_episode_deltas(*ids, len(order), resamples=resamples, seed=seed)
            return deltas, True, []
        warnings.append(
            "episodes not paired: A and B played other start states (seeds "
            f"{sorted(seeds[0])[:4]}... and {sorted(seeds[1])[:4]}...)"
        )
    unpaired = {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in EPISODE_KEYS}
    return unpaired, False, warnings


def played_episodes(report: Report) -> list[Episode] | None:
    """A played scan's episodes, read from its dump (None: not played, or no dump kept)."""
    if "env" not in report.settings or report.dump_dir is None:
        return None
    path = report.dump_dir / EPISODES_FILE
    if not path.is_file():
        return None
    return [Episode.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]


def episode_change(deltas: dict[str, Estimate], paired: bool) -> str:
    """The reason's clause where B's episodes did worse than A's beyond noise: paired, every
    worse move (the gate's `episodes` rule); unpaired, B going back to states it left."""
    if paired:
        worse = worse_beyond_noise(deltas)
        if not worse:
            return ""
        described = "; ".join(_describe(key, deltas[key]) for key in worse)
        return (
            f"; on the same start states, B's episodes did worse than A's beyond noise: {described}"
        )
    revisit = deltas.get("revisit_rate")
    if revisit is None or revisit.low <= 0:
        return ""
    return "; B's episodes revisit states more often than A's beyond noise: " + _describe(
        "revisit_rate", revisit
    )


def _describe(key: str, delta: Estimate) -> str:
    return f"{key} {delta.value:+.3f} [{delta.low:+.3f}, {delta.high:+.3f}]"


def compare_reports(
    a: Report,
    b: Report,
    *,
    max_drop: float = 0.0,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    allow_mismatch: bool = False,
) -> Comparison:
    """B lost input dependence when every dependence metric (normalized MI, retrieval skill)
    fell by more than `max_drop` with its whole 95% interval of the change below -max_drop.
    Reports of other prompts or settings are refused, unless `allow_mismatch`: then the
    differences are carried as warnings."""
    if max_drop < 0:
        raise CollapsecheckError(f"--max-drop must be >= 0, got {max_drop}")
    differ = differences(a, b)
    if differ and not allow_mismatch:
        raise CollapsecheckError(
            f"A and B are not comparable ({'; '.join(differ)}): scan both with the same "
            "prompts and settings, or pass --allow-mismatch to compare anyway"
        )
    warnings = [f"not comparable, compared anyway: {d}" for d in differ]
    paired = _can_pair(a, b)
    matrices = None
    if paired:
        dumps = read_dump(a.dump_dir), read_dump(b.dump_dir)
        deltas = paired_differences(*dumps, resamples=resamples, seed=seed)
        deltas = {key: deltas[key] for key in COMPARE_KEYS}
        matrices = dumps[0][0], dumps[1][0]
    else:
        deltas = {key: _unpaired_delta(a.metrics[key], b.metrics[key]) for key in COMPARE_KEYS}
    flows = dump_flows(a, b, paired)
    deltas.update(flow_deltas(a, b, flows, resamples, seed))
    deltas.update(early_deltas(a, b, flows, resamples, seed))
    deltas.update(image_deltas(a, b, matrices, resamples, seed))
    deltas.update(where_deltas(a, b, matrices, resamples, seed))
    deltas.update(snr_deltas(a, b))
    episodes, episodes_paired, episode_warnings = episode_deltas(a, b, resamples, seed)
    deltas.update(episodes)
    warnings += episode_warnings
    dropped = [key for key in DEPENDENCE_KEYS if deltas[key].high < -max_drop]
    lost = len(dropped) == len(DEPENDENCE_KEYS)
    changes = "; ".join(_describe(key, deltas[key]) for key in DEPENDENCE_KEYS)
    tolerance = f" by more than {max_drop:g}" if max_drop else ""
    if lost:
        reason = f"B lost input dependence relative to A beyond noise{tolerance}: {changes}"
    else:
        reason = f"B did not lose input dependence relative to A beyond noise{tolerance}: {changes}"
    if "image_share" in deltas and deltas["image_share"].high < 0:
        reason += "; B's reasoning leans less on the image than A's beyond noise: " + _describe(
            "image_share", deltas["image_share"]
        )
    reason += early_change(deltas)
    reason += where_change(a, b, deltas)
    reason += episode_change(deltas, episodes_paired)
    warnings += early_fractions_differ(a, b)
    worse = worse_beyond_noise(episodes) if episodes_paired else []
    return Comparison(a, b, deltas, paired, lost, reason, max_drop, warnings, episodes_paired,
                      worse)  # fmt: skip
