"""Cross-scoring (SPEC "The cross log-probability matrix" and "Information flow"): every
valid trace's reasoning Z scored under every prompt, as continuation of [prompt j | the
trace's own response prefix]; with the flow, every flow-valid trace's action A under swapped
inputs and swapped reasoning.

Backend-free: builds `ScoreRequest`s and hands them to whichever backend is in use, all in
one call, so a backend can run each (prompt, pre + Z) once and branch the actions from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from collapsecheck.engines.backends.base import Backend, ScoreRequest, TokenLogProbs
from collapsecheck.engines.reasoning import Trace
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.images import with_images_of
from collapsecheck.measures.early_answer import EarlyLogProbs, cut_length
from collapsecheck.measures.flow import FlowLogProbs
from collapsecheck.measures.metrics import CrossLogProbs
from collapsecheck.measures.token_information import ReasoningTokenLogProbs
from collapsecheck.progress import ProgressHook
from collapsecheck.settings import swap_count


@dataclass(frozen=True)
class FlowScores:
    """The action matrices plus, per row, which trace it is and how many tokens A has; with
    early answering, E of SPEC "Early answering" (rows as the matrices', one column per
    fraction)."""

    logprobs: FlowLogProbs
    row_trace_index: np.ndarray
    action_tokens: np.ndarray
    early: EarlyLogProbs | None = None


@dataclass(frozen=True)
class CrossScores:
    """The matrices plus, per row, which trace it is and how many tokens Z has; the flow's
    matrices when it was measured; with `image_swap`, the X->Z matrix again with only the
    image swapped (`inputs.images.swap_reason` says when that can be done); with
    `token_information`, each row's reasoning tokens under each column it was scored under
    (None where the scorer reads sums only)."""

    matrix: CrossLogProbs
    row_trace_index: np.ndarray
    reasoning_tokens: np.ndarray
    flow: FlowScores | None = None
    tokens_scored: int = 0  # continuation tokens whose log-probability was read, all requests
    image_swapped: np.ndarray | None = None  # sums with only the image swapped (M, N)
    tokens: ReasoningTokenLogProbs | None = None


def first_of_each(keys: Sequence[tuple[int, ...]]) -> np.ndarray:
    """For each key, the index of the first equal key (groups of identical sequences)."""
    first: dict[tuple[int, ...], int] = {}
    return np.array([first.setdefault(key, i) for i, key in enumerate(keys)], dtype=np.int64)


def negative_groups(groups: np.ndarray, negatives: int | None, seed: int) -> dict[int, np.ndarray]:
    """SPEC "Sampled negatives and swaps": for each distinct prompt (group id), the groups its
    traces are scored under. All of them, or its own and the `negatives` groups after it on a
    cycle through the groups in a seeded random order: each group's negatives are then a
    uniformly random set, and each group is a negative of exactly `negatives` others."""
    distinct = np.unique(groups)
    if negatives is None or negatives >= len(distinct) - 1:
        return {int(g): distinct for g in distinct}
    cycle = np.random.default_rng(seed).permutation(distinct)
    following = np.arange(negatives + 1)
    return {int(g): np.sort(cycle[(at + following) % len(cycle)]) for at, g in enumerate(cycle)}


def chosen_swaps(
    own: np.ndarray, scored_under: dict[int, np.ndarray], negatives: int | None, seed: int
) -> list[np.ndarray]:
    """For each flow row (given its prompt group), the traces whose reasoning is swapped in:
    every trace, or its own group's traces and `negatives` drawn at random from the other
    traces whose X->Z pass ran under the row's prompt (so a swap never needs a pass of its
    own). The draw is seeded per prompt and shared by the prompt's rows: a swapped reasoning
    then needs one pass for all of them, and actions they share are scored once."""
    everything = np.arange(len(own))
    if negatives is None:
        return [everything] * len(own)
    shared = {}
    for g in np.unique(own).tolist():
        hosts = [h for h, under in scored_under.items() if g in under]
        others = everything[(own != g) & np.isin(own, hosts)]
        rng = np.random.default_rng([seed, g])
        picked = rng.choice(others, size=min(negatives, len(others)), replace=False)
        shared[g] = np.sort(np.concatenate([everything[own == g], picked]))
    return [shared[int(g)] for g in own]


@dataclass
class Plan:
    """The requests of one scoring call and, per matrix, the cell each request's value fills."""

    requests: list[ScoreRequest] = field(default_factory=list)
    cells: dict[str, list[tuple[int, int, int]]] = field(
        default_factory=dict
    )  # (request, row, column)

    def add(self, request: ScoreRequest, matrix: str, row: int, column: int) -> None:
        self.cells.setdefault(matrix, []).append((len(self.requests), row, column))
        self.requests.append(request)

    def fill(self, values: np.ndarray, name: str, shape: tuple[int, int]) -> np.ndarray:
        """The values of one matrix's cells; NaN where nothing was scored."""
        out = np.full(shape, np.nan)
        cells = np.array(self.cells.get(name, []), dtype=np.int64).reshape(-1, 3)
        out[cells[:, 1], cells[:, 2]] = values[cells[:, 0]]
        return out


def plan_reasoning(
    plan: Plan, valid: Sequence[Trace], prompt_ids: Sequence[Sequence[int]], own: np.ndarray,
    scored_under: dict[int, np.ndarray],
) -> None:  # fmt: skip
    """X->Z: each valid trace's pre + Z under each prompt its own prompt is scored under."""
    for row, trace in enumerate(valid):
        continuation = trace.prefix_ids + trace.reasoning_ids
        for group in scored_under[int(own[row])]:
            request = ScoreRequest(tuple(prompt_ids[group]), continuation, len(trace.prefix_ids))
            plan.add(request, "z", row, int(group))


def plan_flow(
    plan: Plan,
    acting: Sequence[Trace],
    prompt_ids: Sequence[Sequence[int]],
    own: np.ndarray,
    scored_under: dict[int, np.ndarray],
    traces_chosen: list,
) -> None:
    """SPEC "Information flow": A_r after (prompt, pre, Z) of a swapped input or trace, then
    its own mid_r. Each request's stem, prompt j + pre_s + Z_s, is an X->Z request's
    continuation, marked as the request's stem: a backend can branch the action from that
    pass instead of running it again. `natural` entries of a trace's own prompt equal
    `reasoning` ones and are copied after."""
    prompts = [tuple(ids) for ids in prompt_ids]
    stems = [t.prefix_ids + t.reasoning_ids for t in acting]
    acts = [(t.mid_ids + t.action_ids, len(t.mid_ids)) for t in acting]

    def request(row: int, reasoner: int, prompt: int) -> ScoreRequest:
        (stem, (act, mid)) = stems[reasoner], acts[row]
        return ScoreRequest(prompts[prompt], stem + act, len(stem) + mid, len(stem))

    own_group = own.tolist()
    for row, group in enumerate(own_group):
        for column in scored_under[group].tolist():
            plan.add(request(row, row, column), "input", row, column)
        for s in traces_chosen[row].tolist():
            plan.add(request(row, s, group), "reasoning", row, s)
            if own_group[s] != group:
                plan.add(request(row, s, own_group[s]), "natural", row, s)


def plan_actions(
    plan: Plan, acting: Sequence[Trace], prompt_ids: Sequence[Sequence[int]],
    scored_under: dict[int, np.ndarray], negatives: int | None, seed: int,
    early_fractions: Sequence[float],
) -> None:  # fmt: skip
    """The flow's requests (SPEC "Information flow") and early answering's ("Early
    answering") for the flow-valid traces `acting`."""
    own = np.array([t.prompt_index for t in acting], dtype=np.int64)
    swaps = chosen_swaps(own, scored_under, swap_count(negatives), seed)
    plan_flow(plan, acting, prompt_ids, own, scored_under, swaps)
    plan_early(plan, acting, prompt_ids, early_fractions)


def plan_early(plan: Plan, acting: Sequence[Trace], prompt_ids: Sequence[Sequence[int]],
               fractions: Sequence[float]) -> None:  # fmt: skip
    """SPEC "Early answering": A_r after its own prompt, pre_r, Z_r cut at each fraction, and
    mid_r. The whole reasoning's X->Z request runs pre_r + Z_r under that prompt; each cut
    names it as its host, so a backend can branch from that pass where the cut is. A cut that
    keeps all of Z_r is `action_natural[r, r]`, filled in after."""
    for row, trace in enumerate(acting):
        whole = trace.prefix_ids + trace.reasoning_ids
        context = tuple(prompt_ids[trace.prompt_index])
        for column, fraction in enumerate(fractions):
            kept = cut_length(fraction, len(trace.reasoning_ids))
            if kept == len(trace.reasoning_ids):
                continue
            cut = trace.prefix_ids + trace.reasoning_ids[:kept]
            continuation = cut + trace.mid_ids + trace.action_ids
            request = ScoreRequest(
                context, continuation, len(cut) + len(trace.mid_ids), len(cut), host=whole
            )
            plan.add(request, "early", row, column)


def plan_image_swaps(
    plan: Plan, valid: Sequence[Trace], prompt_ids: Sequence[Sequence[int]], own: np.ndarray,
    scored_under: dict[int, np.ndarray],
) -> None:  # fmt: skip
    """SPEC "What the image carries": each valid trace's pre + Z under its own prompt's text
    with the image of each prompt its group is scored under."""
    for row, trace in enumerate(valid):
        continuation = trace.prefix_ids + trace.reasoning_ids
        own_ids = prompt_ids[trace.prompt_index]
        for group in scored_under[int(own[row])]:
            context = with_images_of(own_ids, prompt_ids[group])
            plan.add(
                ScoreRequest(context, continuation, len(trace.prefix_ids)), "image", row, int(group)
            )


def check_finite(values: np.ndarray) -> None:
    broken = int((~np.isfinite(values)).sum())
    if broken:
        raise CollapsecheckError(
            f"the model gave NaN or infinite log-probabilities for {broken} of {len(values)} "
            "scored (trace, context) pairs: no verdict (check the checkpoint's weights and --dtype)"
        )


def check_columns(prompt_ids: Sequence[Sequence[int]], negatives: int | None) -> None:
    """The prompts are distinct contexts, and at least one negative is asked for."""
    if negatives is not None and negatives < 1:
        raise CollapsecheckError(f"--negatives must be at least 1, got {negatives}")
    if len({tuple(ids) for ids in prompt_ids}) < len(prompt_ids):
        raise ValueError("cross_score takes distinct contexts: merge identical prompts first")


def cross_score(
    backend: Backend,
    traces: Sequence[Trace],
    prompt_ids: Sequence[Sequence[int]],
    progress: ProgressHook,
    *,
    negatives: int | None = None,
    seed: int = 0,
    flow: bool = False,
    image_swap: bool = False,
    temperature: float = 1.0,
    early_fractions: Sequence[float] = (),
    token_information: bool = False,
) -> CrossScores:
    """Score the valid traces under every prompt, or under their own and `negatives` sampled
    others; with `flow`, the action matrices of the flow-valid traces too (`swap_count`
    swapped traces per action beside its own prompt's), in the same call. The prompts are
    distinct contexts (`runs.preparation.prepare` merges identical ones); entries not scored
    are NaN and marked in the matrix's `scored` mask. `temperature`: the one the traces were
    sampled at, the distribution every log-probability is read from. `early_fractions`
    (with `flow`): the fractions of SPEC "Early answering", none to skip it.
    `token_information`: read each reasoning token's log-probability too (SPEC "Where the
    input shows"), where the backend reads them."""
    check_columns(prompt_ids, negatives)
    groups = np.arange(len(prompt_ids))
    rows = [i for i, t in enumerate(traces) if t.valid]
    valid = [traces[i] for i in rows]
    own = np.array([t.prompt_index for t in valid], dtype=np.int64)
    plan = Plan()
    scored_under = negative_groups(groups, negatives, seed)
    plan_reasoning(plan, valid, prompt_ids, own, scored_under)
    flow_rows = [i for i, t in enumerate(traces) if t.flow_valid] if flow else []
    acting = [traces[i] for i in flow_rows]
    plan_actions(plan, acting, prompt_ids, scored_under, negatives, seed, early_fractions)
    if image_swap:
        plan_image_swaps(plan, valid, prompt_ids, own, scored_under)
    scoring = progress("scoring", len(plan.requests))
    per_token = (
        backend.loglikelihood_per_token(plan.requests, scoring, temperature)
        if token_information
        else TokenLogProbs(backend.loglikelihood(plan.requests, scoring, temperature))
    )
    values = per_token.sums
    check_finite(values)
    lengths = np.array([len(t.reasoning_ids) for t in valid], dtype=np.int64)
    n = len(prompt_ids)
    matrix = reasoning_matrix(plan.fill(values, "z", (len(valid), n)), lengths, own)
    responses = np.bincount([t.prompt_index for t in traces], minlength=n)
    flow_scores = (
        flow_matrices(plan, values, acting, n, flow_rows, responses, tuple(early_fractions))
        if flow
        else None
    )
    scored_tokens = sum(len(r.continuation) - r.scored_from for r in plan.requests)
    swapped = plan.fill(values, "image", (len(valid), n)) if image_swap else None
    tokens = reasoning_tokens(plan, per_token, own, n) if per_token.per_token else None
    return CrossScores(
        matrix, np.array(rows, dtype=np.int64), lengths, flow_scores, scored_tokens, swapped,
        tokens,
    )  # fmt: skip


def reasoning_matrix(total: np.ndarray, lengths: np.ndarray, own: np.ndarray) -> CrossLogProbs:
    """SPEC "The cross log-probability matrix" from its sums (NaN where not scored)."""
    mean = total / lengths[:, None] if len(lengths) else total
    return CrossLogProbs(sum=total, mean=mean, row_prompt=own, scored=np.isfinite(total))


def reasoning_tokens(
    plan: Plan, per_token: TokenLogProbs, own: np.ndarray, num_prompts: int
) -> ReasoningTokenLogProbs:
    """Each X->Z row's per-token log-probabilities under the columns it was scored under
    (SPEC "Where the input shows"), columns in increasing order: `plan_reasoning` adds the
    plan's first requests row by row, each row's columns in increasing order, so each row's
    block is a view of the flat values."""
    cells = np.array(plan.cells.get("z", []), dtype=np.int64).reshape(-1, 3)
    if not np.array_equal(cells[:, 0], np.arange(len(cells))):
        raise RuntimeError("the X->Z requests must be the plan's first, row by row")
    starts = np.searchsorted(cells[:, 1], np.arange(len(own) + 1))
    offsets = per_token.offsets[starts]
    logprobs = [
        per_token.values[offsets[row] : offsets[row + 1]].reshape(starts[row + 1] - starts[row], -1)
        for row in range(len(own))
    ]
    columns = [cells[starts[row] : starts[row + 1], 2] for row in range(len(own))]
    return ReasoningTokenLogProbs(logprobs, columns, own, num_prompts)


def flow_matrices(
    plan: Plan,
    values: np.ndarray,
    acting: Sequence[Trace],
    num_prompts: int,
    rows: Sequence[int],
    responses: np.ndarray,
    early_fractions: tuple[float, ...] = (),
) -> FlowScores:
    """The three action matrices of the flow-valid traces (SPEC "Information flow") and,
    with `early_fractions`, E of SPEC "Early answering"."""
    m = len(acting)
    prompts = np.array([t.prompt_index for t in acting], dtype=np.int64)
    reasoning = plan.fill(values, "reasoning", (m, m))
    same_prompt = prompts[:, None] == prompts[None, :]
    logprobs = FlowLogProbs(
        input=plan.fill(values, "input", (m, num_prompts)),
        reasoning=reasoning,
        natural=np.where(same_prompt, reasoning, plan.fill(values, "natural", (m, m))),
        row_prompt=prompts,
        reasoning_group=first_of_each([t.prefix_ids + t.reasoning_ids for t in acting]),
        actions=[t.action for t in acting],
        responses_per_prompt=responses.astype(float),
    )
    tokens = np.array([len(t.action_ids) for t in acting], dtype=np.int64)
    early = None
    if early_fractions:
        values_early = plan.fill(values, "early", (m, len(early_fractions)))
        whole = np.isnan(values_early)  # cuts that keep all of Z: action_natural[r, r]
        values_early[whole] = np.broadcast_to(np.diag(reasoning)[:, None], whole.shape)[whole]
        early = EarlyLogProbs(values_early, early_fractions, prompts, num_prompts)
    return FlowScores(logprobs, np.array(rows, dtype=np.int64), tokens, early)


def score_own_prompts(
    backend: Backend,
    traces: Sequence[Trace],
    prompt_ids: Sequence[Sequence[int]],
    progress: ProgressHook,
    temperature: float = 1.0,
) -> np.ndarray:
    """SPEC "Scored under the start": each valid trace's pre + Z under its own prompt only,
    read by `backend` (the baseline, not the policy that wrote them): one value per row of
    the cross log-probability matrix, in its row order. The contexts' keys and values are
    shared by their traces as in `cross_score`."""
    valid = [t for t in traces if t.valid]
    own = np.array([t.prompt_index for t in valid], dtype=np.int64)
    plan = Plan()
    only_own = {group: np.array([group]) for group in range(len(prompt_ids))}
    plan_reasoning(plan, valid, prompt_ids, own, only_own)
    values = backend.loglikelihood(
        plan.requests, progress("scoring under the baseline", len(plan.requests)), temperature
    )
    check_finite(values)
    return values
