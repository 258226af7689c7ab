"""For veRL and any other trainer: the diagnosis of one batch of rollouts held as token ids,
cross-scored by the trainer's own batched log-likelihood function (in veRL, the actor worker
group's `compute_log_prob` over a batch of the cross pairs, as RAGEN does). Nothing is loaded
and nothing sampled; everything after the scores (reasoning extraction, metrics, verdict,
flow, SNR) is `scan`'s own, so the numbers equal `score` on the same traces under the same
model. `Report.scalars()` gives RAGEN-2's keys under `collapse/` for the trainer's logger.

    report = diagnose_batch(prompt_ids, response_ids, my_loglikelihood, tokenizer)
    logger.log(report.scalars(), step=global_step)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collapsecheck.engines.backends.function import (
    DEFAULT_CALL_SIZE,
    FunctionBackend,
    LogLikelihood,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt
from collapsecheck.inputs.samples import Sample, SampledPrompts
from collapsecheck.measures.flow import FlowThresholds
from collapsecheck.measures.verdict import Thresholds
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.report import Report
from collapsecheck.runs.diagnose import Diagnosis, diagnose
from collapsecheck.runs.preparation import prepare_sampled, require_two_prompts
from collapsecheck.runs.report_contents import utc_now
from collapsecheck.setting_checks import checked
from collapsecheck.settings import Settings, resolve_settings

__all__ = ["LogLikelihood", "diagnose_batch"]

BATCH = "the trainer's batch"


def same_shape(name: str, values: Sequence[Sequence[Any]], responses: Sequence[Sequence[Any]]):
    """`values` has one entry per response, grouped as `responses` are."""
    sizes = [len(group) for group in values]
    if sizes != [len(group) for group in responses]:
        raise CollapsecheckError(
            f"{name}: one value per response, grouped by prompt as the responses are"
        )


def diagnose_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[Sequence[int]]],
    loglikelihood: LogLikelihood,
    tokenizer: Any,
    settings: Settings | None = None,
    *,
    rewards: Sequence[Sequence[float]] | None = None,
    truncated: Sequence[Sequence[bool]] | None = None,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    call_size: int = DEFAULT_CALL_SIZE,
    progress: ProgressHook = silent,
    **flags: Any,
) -> Report:
    """Diagnose N prompts (`prompt_ids`, each the exact context the policy saw) with their
    responses (`response_ids[i]`: the sampled ids of prompt i's responses, stop token
    excluded; veRL's batch grouped by `uid`). `loglikelihood(contexts, continuations)` returns,
    per pair, the sum of the policy's log-probabilities of the continuation's tokens given the
    context, in float32 or better; it is called with up to `call_size` pairs at a time.
    `tokenizer` decodes (to find the reasoning and action segments); `rewards` feed the SNR
    section; `truncated` marks responses cut by the length limit. Settings as for `score`."""
    settings = checked(resolve_settings(settings, flags))
    started_at = utc_now()
    require_two_prompts(len(prompt_ids), BATCH)
    if len(response_ids) != len(prompt_ids):
        raise CollapsecheckError("response_ids: one list of responses per prompt")
    cut = truncated or [[False] * len(group) for group in response_ids]
    same_shape("truncated", cut, response_ids)
    if rewards is not None:
        same_shape("rewards", rewards, response_ids)
    backend = FunctionBackend(loglikelihood, tokenizer, call_size=call_size)
    texts = [backend.decode(ids) for ids in prompt_ids]
    prompts = [Prompt(text, f"{BATCH}, prompt {i + 1}") for i, text in enumerate(texts)]
    rendered = [
        RenderedPrompt(t, tuple(int(i) for i in ids))
        for t, ids in zip(texts, prompt_ids, strict=True)
    ]
    samples = [
        [Sample(tuple(int(i) for i in ids), bool(c)) for ids, c in zip(group, cuts, strict=True)]
        for group, cuts in zip(response_ids, cut, strict=True)
    ]
    given = [[float(r) for r in group] for group in rewards] if rewards is not None else None
    batch = SampledPrompts(prompts, rendered, samples, {}, given)
    prepared, batch = prepare_sampled(batch, backend, settings, BATCH)
    diagnosis = Diagnosis(
        settings, thresholds or Thresholds(), flow_thresholds or FlowThresholds(),
        recorded={"checkpoint": "the trainer's policy", "prompts": BATCH,
                  "samples_per_prompt": max(len(g) for g in batch.samples)},
        timing={"started_at": started_at}, dump_dir=None, progress=progress,
        rewards=lambda prompts, traces: batch.rewards,
        reward_source="the trainer's rewards" if given else None, temperature=None,
    )  # fmt: skip
    return diagnose(backend, prepared, batch.samples, diagnosis)
