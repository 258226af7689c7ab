"""The transformers backend: sampling with the model's own key/value cache, and two scorers.

- `cached` (default): each distinct context (a prompt) is run once; its key/value cache is
  copied to a batch of continuations, which are packed by length (right padding).
- `naive` (reference, SPEC-exact by construction): one plain forward pass over
  [context | continuation] for every request.
"""

from __future__ import annotations

import copy
import functools
import gc
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapsecheck.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    decode_ids,
    prompt_seed,
    stop_token_ids,
)
from collapsecheck.checkpoint import (
    Checkpoint,
    load_model,
    load_tokenizer,
    require_checkpoint,
    resolve_device,
    resolve_dtype,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import DEFAULT_SAMPLE_BATCH, LoadSettings


def length_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices grouped longest first so that (batch size x longest length) <= max_tokens and
    each batch's lengths are over half its longest (padding at most doubles the work)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for index in order:
        longest = lengths[batch[0]] if batch else lengths[index]
        if batch and ((len(batch) + 1) * longest > max_tokens or 2 * lengths[index] <= longest):
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


AUTO = "auto"
CPU_SCORING_BUDGET = 2 * 2**30  # bytes of activations a CPU scoring batch may use
GPU_BUDGET_SHARE = 0.5  # share of the free GPU memory a scoring batch may use


def auto_batch_tokens(model: Any) -> int:
    """Tokens per scoring batch that fit the memory at hand: a budget (half the free GPU
    memory, or 2 GiB on CPU) over a per-token estimate (float32 logits and their log-softmax
    work space, key/values, activations). A heuristic: the out-of-memory guard backs it up."""
    config = model.config.get_text_config()
    element = next(model.parameters()).element_size()
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    per_token = (
        4 * config.vocab_size * 4  # logits (float32), log-softmax temporaries
        + 2 * layers * heads * head_dim * element  # keys and values
        + 16 * hidden * element  # activations of one layer
    )
    device = next(model.parameters()).device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * GPU_BUDGET_SHARE
    else:
        budget = CPU_SCORING_BUDGET
    return int(min(max(budget // per_token, 256), 2**17))


def resolve_batch_tokens(value: int | str, model: Any) -> int:
    """--batch-tokens (checked in LoadSettings): a number, or `auto` sized to the memory."""
    return auto_batch_tokens(model) if value == AUTO else int(value)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the prefix all sequences share, kept shorter than the shortest one so that
    every sequence still has a token of its own to predict from."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    length = 0
    while length < shortest - 1 and all(s[length] == sequences[0][length] for s in sequences):
        length += 1
    return length


# branch tokens packed into one sequence after a stem: attention within a pack grows with its
# square, and packs of one width batch together
PACK_TOKENS = 64
LOGPROB_ROWS = 8  # rows of logits turned into log-probabilities at a time


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32: logits (B, T, V), targets (B, T) -> (B, T).

    Works through a few rows at a time, so the float32 work space stays small whatever the
    batch and the model's dtype."""
    out = torch.empty(targets.shape, dtype=torch.float32, device=targets.device)
    for start in range(0, logits.shape[0], LOGPROB_ROWS):
        rows = slice(start, start + LOGPROB_ROWS)
        chunk = logits[rows].float()
        picked = chunk.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1)
        out[rows] = picked - torch.logsumexp(chunk, dim=-1)
    return out


def masked_sums(logprobs: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Per-row sum of the masked log-probabilities, in float64 on the host."""
    return (logprobs.double() * mask).sum(dim=1).cpu().numpy()


def _right_pad(rows: Sequence[Sequence[int]], pad: int, device: str) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


def _left_pad(rows: Sequence[Sequence[int]], pad: int, device: str) -> tuple[torch.Tensor, ...]:
    """Left-padded ids and their attention mask, for decoding several prompts together."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def _positions_mask(starts: Sequence[int], ends: Sequence[int], width: int) -> torch.Tensor:
    position = torch.arange(width)[None, :]
    return (position >= torch.tensor(starts)[:, None]) & (position < torch.tensor(ends)[:, None])


def _select_rows(cache: Any, rows: torch.Tensor) -> Any:
    """A cache holding the given batch rows of `cache`, which stays as it is: each layer's
    keys and values are indexed into new tensors, and nothing else is copied."""
    clone = copy.copy(cache)
    clone.layers = [copy.copy(layer) for layer in cache.layers]
    clone.reorder_cache(rows)
    return clone


def _common_branch(stem: tuple[int, ...], requests: Sequence[ScoreRequest]) -> tuple[int, ...]:
    """The tokens after `stem` that most of its requests continue with (none if none does):
    the stem's own pass runs them, so those requests need no branch of their own."""
    tails = Counter(r.continuation[len(stem) :] for r in requests)
    tails.pop((), None)
    return max(tails, key=tails.__getitem__) if tails else ()


@dataclass
class _StemGroup:
    """The requests of one context, by stem, with the context's key/value cache."""

    cache: Any
    first_logits: torch.Tensor  # the context's logits for the first stem token
    requests: Sequence[ScoreRequest]
    keys: list[tuple[int, ...]]  # the distinct stems
    rows: list[tuple[int, ...]]  # each stem carried on into its most common branch
    members: dict[tuple[int, ...], list[int]]  # stem -> indices of its requests
    out: np.ndarray


@dataclass
class _Stems:
    """A batch of stem rows after their forward pass: what their branches continue from."""

    cache: Any  # context + stem rows (right-padded to `width`)
    context_length: int
    width: int
    # (row, attach) -> the logits that predict a branch's first token when it leaves the row
    # after `attach` of its tokens
    first_logits: dict[tuple[int, int], torch.Tensor]


class TransformersBackend:
    """Backend over a transformers causal LM loaded from a local checkpoint directory."""

    name = "transformers"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        scorer: str = "cached",
        batch_tokens: int | str = AUTO,
        sample_batch: int = DEFAULT_SAMPLE_BATCH,
    ) -> None:
        embeddings = model.get_input_embeddings().num_embeddings
        if len(tokenizer) > embeddings:
            raise CollapsecheckError(
                f"the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
                f"{embeddings}: they do not belong together"
            )
        self.model = model
        self.tokenizer = tokenizer
        config = model.config.get_text_config()
        self.max_length: int | None = getattr(config, "max_position_embeddings", None)
        self.scorer = scorer
        self.batch_tokens = resolve_batch_tokens(batch_tokens, model)
        self.sample_batch = sample_batch
        self.device = str(next(model.parameters()).device)
        generation = getattr(model, "generation_config", None)
        self.stop_ids = stop_token_ids(
            getattr(generation, "eos_token_id", None), tokenizer.eos_token_id
        )
        self.pad_id = int(self.stop_ids[0]) if self.stop_ids else 0

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint | str | Path,
        settings: LoadSettings | None = None,
        scorer: str | None = "cached",
    ) -> TransformersBackend:
        """Load a checkpoint of any supported format (see `collapsecheck.checkpoint`)."""
        settings = settings or LoadSettings()
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = require_checkpoint(checkpoint, settings.base_model)
        tokenizer = load_tokenizer(checkpoint, settings.trust_remote_code)
        device = resolve_device(settings.device)
        model = load_model(checkpoint, device, resolve_dtype(settings.dtype, device), settings)
        return cls(
            model,
            tokenizer,
            scorer=scorer or "cached",
            batch_tokens=settings.batch_tokens,
            sample_batch=settings.sample_batch,
        )

    def close(self) -> None:
        """Drop the model and give its memory back (the next checkpoint loads after this)."""
        self.model = None
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.name,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "scorer": self.scorer,
        }

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    # -- the shared step: run a context once --------------------------------------------

    def _prefill(self, context: Sequence[int]) -> tuple[Any, torch.Tensor]:
        """Key/value cache of one context and the logits that predict its next token."""
        ids = torch.tensor([list(context)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[:, -1, :]

    # -- sampling -----------------------------------------------------------------------

    @staticmethod
    def _next_tokens(
        logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> torch.Tensor:
        if not bool(torch.isfinite(logits).all()):
            raise CollapsecheckError(
                "the model produced NaN or infinite logits while sampling: no verdict "
                "(check the checkpoint's weights, or try --dtype float32)"
            )
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0))
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def _sample_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """K samples for each of several prompts, decoded together (prompts left-padded).

        Each prompt draws from its own seeded generator, so its traces do not depend on the
        sampling order of the others.
        """
        k = params.k
        generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        ids, mask = _left_pad(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :].repeat_interleave(k, dim=0)
        cache.batch_repeat_interleave(k)
        mask = mask.repeat_interleave(k, dim=0)
        position = positions[:, -1:].repeat_interleave(k, dim=0)
        stops = torch.tensor(self.stop_ids or [-1], device=self.device)
        finished = torch.zeros(len(prompts) * k, dtype=torch.bool, device=self.device)
        steps: list[torch.Tensor] = []
        for _ in range(params.max_new_tokens):
            tokens = torch.cat(
                [
                    self._next_tokens(logits[i * k : (i + 1) * k], params, generator)
                    for i, generator in enumerate(generators)
                ]
            )
            tokens = torch.where(finished, torch.full_like(tokens, self.pad_id), tokens)
            steps.append(tokens)
            finished |= torch.isin(tokens, stops)
            if bool(finished.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            position = position + 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
        rows = torch.stack(steps, dim=1).tolist()
        return [self._split_samples(rows[i * k : (i + 1) * k]) for i in range(len(prompts))]

    def _split_samples(self, rows: list[list[int]]) -> list[Sample]:
        samples = []
        for row in rows:
            stop = next((i for i, token in enumerate(row) if token in self.stop_ids), None)
            samples.append(Sample(tuple(row[:stop]), truncated=stop is None))
        return samples

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress
    ) -> list[list[Sample]]:
        per_batch = max(1, self.sample_batch // params.k)
        results: list[list[Sample]] = []
        for start in range(0, len(prompts), per_batch):
            chunk = range(start, min(start + per_batch, len(prompts)))
            seeds = [prompt_seed(params.seed, i) for i in chunk]
            results += self._sample_batch([prompts[i] for i in chunk], params, seeds)
            progress(len(chunk))
        return results

    # -- scoring ------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, requests: Sequence[ScoreRequest], progress: Progress) -> np.ndarray:
        out = np.zeros(len(requests), dtype=np.float64)
        if self.scorer == "naive":
            self._score_naive(requests, out, progress)
        else:
            self._score_cached(requests, out, progress)
        return out

    def _score_batches(
        self,
        members: Sequence[int],
        lengths: Sequence[int],
        score: Callable[[list[int]], int],
        progress: Progress,
    ) -> None:
        """Score `members` in length-packed batches; `score` writes the values of a batch and
        says how many requests they answered. On a CUDA out-of-memory error the batch is split
        in two and retried, and later batches use the halved token budget."""
        pending = [
            [members[p] for p in batch] for batch in length_batches(lengths, self.batch_tokens)
        ]
        while pending:
            batch = pending.pop(0)
            try:
                done = score(batch)
            except torch.OutOfMemoryError:
                if len(batch) == 1:
                    raise CollapsecheckError(
                        "out of memory scoring a single sequence: lower --max-new-tokens or "
                        "use a device with more memory"
                    ) from None
                if self.device.startswith("cuda"):
                    torch.cuda.empty_cache()
                self.batch_tokens = max(1, self.batch_tokens // 2)
                half = len(batch) // 2
                pending[:0] = [batch[:half], batch[half:]]
                continue
            progress(done)

    def _score_naive(
        self, requests: Sequence[ScoreRequest], out: np.ndarray, progress: Progress
    ) -> None:
        def score(batch: list[int]) -> int:
            rows = [requests[i].context + requests[i].continuation for i in batch]
            ids = _right_pad(rows, self.pad_id, self.device)
            attention = _positions_mask([0] * len(rows), [len(r) for r in rows], ids.shape[1])
            logits = self.model(input_ids=ids, attention_mask=attention.to(self.device)).logits
            # logits[:, t] predicts ids[:, t + 1]
            starts = [len(requests[i].context) + requests[i].scored_from - 1 for i in batch]
            ends = [len(r) - 1 for r in rows]
            mask = _positions_mask(starts, ends, ids.shape[1] - 1).to(self.device)
            out[batch] = masked_sums(token_logprobs(logits[:, :-1], ids[:, 1:]), mask)
            return len(batch)

        lengths = [len(r.context) + len(r.continuation) for r in requests]
        self._score_batches(range(len(requests)), lengths, score, progress)

    def _prefill_contexts(
        self, contexts: Sequence[tuple[int, ...]]
    ) -> Iterator[tuple[tuple[int, ...], Any, torch.Tensor]]:
        """Each context's key/value cache and next-token logits. The prefix that all contexts
        share (a system prompt, say) is computed once and extended for each."""
        shared = common_prefix_length(contexts)
        if len(contexts) < 2 or shared == 0:
            for context in contexts:
                yield context, *self._prefill(context)
            return
        base, _ = self._prefill(contexts[0][:shared])
        for context in contexts:
            cache = copy.deepcopy(base)
            rest = torch.tensor([list(context[shared:])], dtype=torch.long, device=self.device)
            out = self.model(
                input_ids=rest, past_key_values=cache, use_cache=True, logits_to_keep=1
            )
            yield context, out.past_key_values, out.logits[:, -1, :]

    def _score_cached(
        self, requests: Sequence[ScoreRequest], out: np.ndarray, progress: Progress
    ) -> None:
        """Each distinct context is run once; each distinct stem once on top of it (packed by
        length), carrying on into its most common branch; every other branch (an action after
        a reasoning, say) on top of its stem."""
        by_context: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            by_context[request.context].append(index)
        for context, cache, first_logits in self._prefill_contexts(list(by_context)):
            stems: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for index in by_context[context]:
                request = requests[index]
                stems[request.continuation[: request.stem_length]].append(index)
            keys = list(stems)
            rows = [key + _common_branch(key, [requests[i] for i in stems[key]]) for key in keys]
            group = _StemGroup(cache, first_logits, requests, keys, rows, stems, out)
            score = functools.partial(self._score_stems, group)
            self._score_batches(range(len(keys)), [len(r) for r in rows], score, progress)

    def _score_stems(self, group: _StemGroup, batch: Sequence[int]) -> int:
        """Run the stems `group.keys[batch]`, each carried on into its common branch, on the
        context's key/value cache; write the values of the requests that this pass holds
        (the stem itself, or the stem and that branch), then score the other branches off the
        stems."""
        keys, rows = [group.keys[b] for b in batch], [group.rows[b] for b in batch]
        ids = _right_pad(rows, self.pad_id, self.device)
        context_length = group.cache.get_seq_length()
        one_row = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        cache = _select_rows(group.cache, one_row)  # the context's one row, once per stem
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        # stem token 0 is predicted by the context's last logits, token t by logits[t-1]
        first = token_logprobs(group.first_logits.expand(len(rows), -1)[:, None, :], ids[:, :1])
        logprobs = torch.cat([first, token_logprobs(logits[:, :-1], ids[:, 1:])], dim=1)
        held, branches = [], []
        for b, key in enumerate(keys):
            for index in group.members[key]:
                continuation = group.requests[index].continuation
                inside = continuation == rows[b][: len(continuation)]
                (held if inside else branches).append((b, index))
        if held:
            picked = torch.tensor([b for b, _ in held], device=self.device)
            starts = [group.requests[i].scored_from for _, i in held]
            ends = [len(group.requests[i].continuation) for _, i in held]
            mask = _positions_mask(starts, ends, ids.shape[1])
            group.out[[i for _, i in held]] = masked_sums(logprobs[picked], mask.to(self.device))
        if branches:
            attached = [(b, index, _attach_point(group.requests[index], rows[b]))
                        for b, index in branches]  # fmt: skip
            points = sorted({(b, at) for b, _, at in attached})
            firsts = [logits[b, at - 1] if at else group.first_logits[0] for b, at in points]
            stem = _Stems(
                cache, context_length, ids.shape[1], dict(zip(points, firsts, strict=True))
            )
            self._score_branches(stem, group, attached)
        return len(held) + len(branches)

    def _score_branches(
        self, stem: _Stems, group: _StemGroup, branches: Sequence[tuple[int, int, int]]
    ) -> None:
        """Each distinct branch (stem row, the point where it leaves the row, its own tokens)
        once. The branches of a stem row are packed into one sequence that reads the row's
        key/value cache as it is: a 4D attention mask lets each branch token see the context,
        the row's tokens before the branch's attach point and the earlier tokens of its own
        branch, at the positions after that point."""
        unique: dict[tuple[int, int, tuple[int, ...], int], list[int]] = defaultdict(list)
        for b, index, at in branches:
            request = group.requests[index]
            unique[(b, at, request.continuation[at:], request.scored_from - at)].append(index)
        packs = _packs(list(unique), min(self.batch_tokens, PACK_TOKENS))
        lengths = [sum(len(tail) for _, _, tail, _ in pack) for pack in packs]
        for chunk in length_batches(lengths, max(self.batch_tokens, max(lengths))):
            chosen = [packs[i] for i in chunk]
            sums = self._score_packs(stem, chosen)
            for pack, values in zip(chosen, sums, strict=True):
                for key, value in zip(pack, values, strict=True):
                    group.out[unique[key]] = value

    def _score_packs(self, stem: _Stems, packs: Sequence[list[tuple]]) -> list[list[float]]:
        """Summed log-probabilities of the scored tokens of each branch of each pack."""
        layout = _PackLayout.of(packs, stem, self.device)
        cache = _select_rows(stem.cache, layout.rows)
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(layout.allowed.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~layout.allowed, torch.finfo(dtype).min)
        logits = self.model(
            input_ids=layout.ids, attention_mask=mask, position_ids=layout.positions,
            past_key_values=cache, use_cache=True,
        ).logits  # fmt: skip
        # a branch's first token is predicted by the row's logits at its attach point, the
        # others by the token before them in the pack, which is the same branch's previous one
        rest = token_logprobs(logits[:, :-1], layout.ids[:, 1:])
        logprobs = torch.cat([torch.zeros_like(rest[:, :1]), rest], dim=1).double().cpu()
        items = [(p, start, item) for p, pack in enumerate(packs)
                 for start, item in zip(layout.starts[p], pack, strict=True)]  # fmt: skip
        first_logits = torch.stack([stem.first_logits[(b, at)] for _, _, (b, at, _, _) in items])
        first_ids = layout.ids[[p for p, _, _ in items], [start for _, start, _ in items]]
        firsts = token_logprobs(first_logits[:, None, :], first_ids[:, None])[:, 0].double().cpu()
        sums: list[list[float]] = [[] for _ in packs]
        for (p, start, (_, _, tail, scored)), first in zip(items, firsts.tolist(), strict=True):
            total = float(logprobs[p, start + max(scored, 1) : start + len(tail)].sum())
            sums[p].append(total + (first if scored == 0 else 0.0))
        return sums


def _attach_point(request: ScoreRequest, row: Sequence[int]) -> int:
    """Where a branch leaves its stem row: after the tokens it shares with the row (the mid
    before an action, say), but no later than where its scored tokens begin."""
    shared = 0
    for mine, theirs in zip(request.continuation, row, strict=False):
        if mine != theirs:
            break
        shared += 1
    return min(shared, request.scored_from)


def _packs(items: list[tuple], budget: int) -> list[list[tuple]]:
    """The branches grouped by stem row, each group cut into packs of at most `budget` tokens
    (a pack holds at least one branch)."""
    by_row: dict[int, list[tuple]] = defaultdict(list)
    for item in items:
        by_row[item[0]].append(item)
    packs = []
    for row_items in by_row.values():
        pack: list[tuple] = []
        for item in row_items:
            if pack and sum(len(t) for _, _, t, _ in pack) + len(item[2]) > budget:
                packs.append(pack)
                pack = []
            pack.append(item)
        packs.append(pack)
    return packs


@dataclass
class _PackLayout:
    """Packed branches as model inputs: ids, positions, the 4D attention pattern, and where
    each branch starts in its pack."""

    rows: torch.Tensor  # the stem row of each pack
    ids: torch.Tensor
    positions: torch.Tensor
    offsets: torch.Tensor  # each token's position within its branch
    allowed: torch.Tensor  # (packs, 1, width, context + stem width + width)
    starts: list[list[int]]

    @classmethod
    def of(cls, packs: Sequence[list[tuple]], stem: _Stems, device: str) -> _PackLayout:
        width = max(sum(len(t) for _, _, t, _ in pack) for pack in packs)
        n, past = len(packs), stem.context_length + stem.width
        ids = torch.zeros((n, width), dtype=torch.long)
        branch = torch.full((n, width), -1, dtype=torch.long)
        offsets = torch.zeros((n, width), dtype=torch.long)
        attach = torch.zeros((n, width), dtype=torch.long)  # each token's branch's attach point
        starts = []
        for p, pack in enumerate(packs):
            at, pack_starts = 0, []
            for number, (_, point, tail, _) in enumerate(pack):
                ids[p, at : at + len(tail)] = torch.tensor(tail)
                branch[p, at : at + len(tail)] = number
                offsets[p, at : at + len(tail)] = torch.arange(len(tail))
                attach[p, at : at + len(tail)] = point
                pack_starts.append(at)
                at += len(tail)
            starts.append(pack_starts)
        rows = torch.tensor([pack[0][0] for pack in packs])
        allowed = torch.zeros((n, 1, width, past + width), dtype=torch.bool)
        allowed[..., : stem.context_length] = True
        row_positions = torch.arange(stem.width)[None, None, :] < attach[:, :, None]
        allowed[:, 0, :, stem.context_length : past] = row_positions
        same_branch = (branch[:, :, None] == branch[:, None, :]) & (branch[:, None, :] >= 0)
        causal = offsets[:, None, :] <= offsets[:, :, None]
        allowed[:, 0, :, past:] = same_branch & causal
        positions = stem.context_length + attach + offsets
        return cls(
            rows.to(device), ids.to(device), positions.to(device), offsets.to(device),
            allowed.to(device), starts,
        )  # fmt: skip
