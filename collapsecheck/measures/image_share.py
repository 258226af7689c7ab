"""SPEC "What the image carries": how much of the input dependence of the reasoning a
prompt's image carries, for prompts that differ in both their image and their text.

Each valid trace r (of prompt i) is also scored with only the image swapped: its own text,
prompt j's image, `swapped[r, j]` (the same columns as the X->Z matrix, so `swapped[r, i]` is
the matched entry). Then, on sequence sums,

- `mi_image_seq_estimate` = mean over rows of matched[r] - marginal_image[r], where
  marginal_image[r] = logsumexp_j swapped[r, j] - log N: the dependence on the image with the
  text held at the trace's own;
- `image_share` = mi_image_seq_estimate / mi_seq_estimate: the image's share of the whole
  input's. Near 1: the reasoning reads the picture; near 0 with mi_seq_estimate well above
  0: it reads the text and ignores the picture (the typical collapse of a vision-language
  agent). Not clipped: sampling noise can put it a little outside [0, 1].

Both with 95% percentile-bootstrap intervals over prompts (the same resamples for numerator
and denominator, columns fixed), as every other mean-type metric."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from collapsecheck.measures.metrics import (
    CrossLogProbs,
    Estimate,
    MetricValue,
    _interval,
    bootstrap_prompt_weights,
    interval_bounds,
    matched_and_marginal,
)

# SPEC "What the image carries", the reading: the share is read only where the lower bound
# of normalized_mi reaches DEPENDENCE_MIN (a share of a negligible dependence says nothing);
# a share whose whole interval lies below SHARE_TEXT says the reasoning ignores the picture;
# above SHARE_IMAGE, that it reads it.
DEPENDENCE_MIN = 0.05
SHARE_TEXT = 0.2
SHARE_IMAGE = 0.8
READINGS = {
    "no_dependence": "the reasoning barely depends on the input: there is no dependence to share",
    "text_only": "the reasoning reads the text and ignores the image",
    "image": "the reasoning reads the image",
    "both": "the reasoning reads both, or the interval is too wide to tell",
}


def _weighted_mean(values: np.ndarray, row_weights: np.ndarray) -> np.ndarray:
    return (row_weights @ values) / row_weights.sum(axis=1)


def _share_draws(
    scores: CrossLogProbs, swapped: np.ndarray, prompt_weights: np.ndarray
) -> dict[str, np.ndarray]:
    """`mi_image_seq_estimate` and `image_share` for each weighting of the prompts (a row of
    `prompt_weights`; NaN share where the whole input's dependence is not above 0)."""
    matched, marginal = matched_and_marginal(
        scores.sum, scores.row_prompt, scores.prompt_groups, scores.scored
    )
    scored = np.isfinite(swapped)
    _, image_marginal = matched_and_marginal(
        np.where(scored, swapped, 0.0), scores.row_prompt, scores.prompt_groups, scored
    )
    row_weights = prompt_weights[:, scores.row_prompt]
    image_mi = _weighted_mean(matched - image_marginal, row_weights)
    whole_mi = _weighted_mean(matched - marginal, row_weights)
    with np.errstate(invalid="ignore", divide="ignore"):  # undefined without input dependence
        share = np.where(whole_mi > 0, image_mi / whole_mi, np.nan)
    return {"mi_image_seq_estimate": image_mi, "image_share": share}


def _weights(n: int, resamples: int, seed: int) -> np.ndarray:
    """The point weighting (every prompt once) above the bootstrap's."""
    return np.vstack([np.ones((1, n)), bootstrap_prompt_weights(n, resamples, seed)])


def image_share_metrics(
    scores: CrossLogProbs, swapped: np.ndarray, *, resamples: int = 1000, seed: int = 0
) -> dict[str, Estimate]:
    """`mi_image_seq_estimate` and `image_share` from the X->Z matrix and its image-swapped
    twin (sequence sums, NaN where not scored)."""
    draws = _share_draws(scores, swapped, _weights(scores.num_prompts, resamples, seed))
    return {key: Estimate(float(d[0]), *_interval(d[1:])) for key, d in draws.items()}


def paired_image_share_differences(
    first: tuple[CrossLogProbs, np.ndarray],
    second: tuple[CrossLogProbs, np.ndarray],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Estimate]:
    """second minus first of both, each resample drawing the same prompts for the two scans
    (which must cover the same prompts in the same order)."""
    n = first[0].num_prompts
    if second[0].num_prompts != n:
        raise ValueError(f"the scans cover {n} and {second[0].num_prompts} prompts")
    weights = _weights(n, resamples, seed)
    a, b = _share_draws(*first, weights), _share_draws(*second, weights)
    return {
        key: Estimate(float(b[key][0] - a[key][0]), *_interval(b[key][1:] - a[key][1:]))
        for key in a
    }


def image_reading(metrics: Mapping[str, MetricValue]) -> str:
    """Which of READINGS the image's share says (SPEC "What the image carries", the
    reading): read only where the input dependence is clearly more than negligible."""
    if interval_bounds(metrics["normalized_mi"])[0] < DEPENDENCE_MIN:
        return "no_dependence"
    low, high = interval_bounds(metrics["image_share"])
    if high < SHARE_TEXT:
        return "text_only"
    if low > SHARE_IMAGE:
        return "image"
    return "both"
