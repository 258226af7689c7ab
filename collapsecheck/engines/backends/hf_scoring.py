"""Scoring with a transformers model (the backend's `loglikelihood`), two scorers:

- `cached` (default): each distinct context (a prompt) is run once; its key/value cache is
  copied to a batch of continuations, which are packed by length (right padding), each stem
  with its branches in one row (`hf_layout`).
- `naive` (reference, SPEC-exact by construction): one plain forward pass over
  [context | continuation] for every request.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from collapsecheck.engines.backends.base import Progress, ScoreRequest, TokenLogProbs
from collapsecheck.engines.backends.hf_layout import RowLayout, StemRow, cells_on_device, on_device
from collapsecheck.engines.backends.logit_head import FULL_LOGITS, LogitHead
from collapsecheck.errors import CollapsecheckError

# docs/benchmarks.md, "Early answering": at the demo shape, 3/4 cut the scoring time of a
# scan with early answering by a quarter and left the scan without it as it was (1/2 before)
PACKED_SHARE = 0.75


def length_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices grouped longest first so that (batch size x longest length) <= max_tokens and
    each batch's lengths are over PACKED_SHARE of its longest: padding adds at most a third
    to the work (a few long rows, such as a trace's own row with its early answers, get a
    batch of their own instead of widening every row of their context)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for index in order:
        longest = lengths[batch[0]] if batch else lengths[index]
        too_short = lengths[index] <= PACKED_SHARE * longest
        if batch and ((len(batch) + 1) * longest > max_tokens or too_short):
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


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


def cache_keyword(model: Any) -> str:
    """The keyword a model's forward takes its key/value cache by: `cache` in the newer
    transformers (which warn on the old name), `past_key_values` in the older ones."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The key/value cache a forward pass returned, under whichever name this transformers
    gives it (read as a mapping: the old attribute warns in the newer versions)."""
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


LOGPROB_ROWS = 8  # rows of logits turned into log-probabilities at a time


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature; at temperature 1 no copy is made (the scoring hot path)."""
    logits = logits.float()
    return logits if temperature == 1 else logits / temperature


def float32_logsumexp(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logsumexp over the vocabulary of logits / temperature in float32: (B, T, V) -> (B, T).
    Works through a few rows at a time, so the float32 work space stays small whatever the
    batch and the model's dtype."""
    out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], LOGPROB_ROWS):
        rows = slice(start, start + LOGPROB_ROWS)
        out[rows] = torch.logsumexp(tempered(logits[rows], temperature), dim=-1)
    return out


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature)[target] in float32: logits (B, T, V), targets (B, T)
    -> (B, T). The temperature is the one the traces were sampled at (SPEC "Sampling")."""
    picked = tempered(logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1), temperature)
    return picked - float32_logsumexp(logits, temperature)


def predicted_logprobs(
    logits: torch.Tensor, first_logits: torch.Tensor, predictor: torch.Tensor,
    targets: torch.Tensor, temperature: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """log p(targets[b, t]) in float32, at `temperature`, when the token is predicted by the
    logits at input position `predictor[b, t]` of its row, or by `first_logits` (1, V) where
    that is -1: a stem token by the one before it, a branch's first token by the stem token it
    leaves after. `logits` (B, inputs, V) may be narrower than `targets` (B, T)."""
    rows = torch.arange(targets.shape[0], device=targets.device)[:, None]
    at = predictor.clamp(min=0)
    lse = float32_logsumexp(logits, temperature)[rows, at]
    picked = tempered(logits[rows, at, targets], temperature) - lse
    first = first_token_logprobs(first_logits, targets, temperature)
    return torch.where(predictor >= 0, picked, first)


def first_token_logprobs(
    first_logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log p(targets) under the context's next-token logits (1, V), at `temperature`."""
    first_row = tempered(first_logits[0], temperature)
    return first_row[targets] - torch.logsumexp(first_row, dim=-1)


def head_predicted_logprobs(
    head: LogitHead, hidden: torch.Tensor, first_logits: torch.Tensor, layout: RowLayout,
    temperature: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """`predicted_logprobs` from the decoder's hidden states (B, inputs, H): the LM head runs
    in tiles on the predicting positions only (`logit_head`), never on the whole rows."""
    rows, at = layout.predicted
    states = hidden[rows, layout.predictor[rows, at]]
    picked = torch.zeros(layout.targets.shape, dtype=torch.float32, device=hidden.device)
    picked[rows, at] = head.logprobs(states, layout.targets[rows, at], temperature)
    first = first_token_logprobs(first_logits, layout.targets, temperature)
    return torch.where(layout.predictor >= 0, picked, first)


def masked_sums(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row sum of the masked log-probabilities, in float64, where they are."""
    return (logprobs.double() * mask).sum(dim=1)


PENDING_VALUES = 2**20  # values kept on the device before they are read back (8 MiB)


class Scored:
    """What one scoring call writes: each request's sum and, where asked (`per_token`), the
    log-probability of each of its scored tokens, all requests' one after another in one
    array allocated once (`TokenLogProbs`' layout). Batches' values stay on the device until
    PENDING_VALUES of them wait or the call ends, then are read back in one copy: the device
    never waits on the host between batches."""

    def __init__(self, requests: Sequence[ScoreRequest], per_token: bool) -> None:
        self.sums = np.zeros(len(requests), dtype=np.float64)
        self.values: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        if per_token:
            lengths = [len(r.continuation) - r.scored_from for r in requests]
            self.offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            self.values = np.empty(int(self.offsets[-1]), dtype=np.float64)
        # (where in sums or values, the values there) of batches not yet read back
        self._sums: list[tuple[np.ndarray, torch.Tensor]] = []
        self._values: list[tuple[np.ndarray, torch.Tensor]] = []
        self._waiting = 0

    def put(
        self, requests: Sequence[int], sums: torch.Tensor, logprobs: torch.Tensor,
        spans: Sequence[tuple[int, int, int]],
    ) -> None:  # fmt: skip
        """The `requests`' sums (on the device) and, per token, `logprobs[row, start:end]` of
        each one's span (row, start, end), gathered at once."""
        where = np.asarray(requests, dtype=np.int64)
        self._sums.append((where, sums.double()))
        self._waiting += len(where)
        if self.values is not None:
            places, rows, columns = self._token_cells(where, spans)
            picked = logprobs[on_device(rows, logprobs.device), on_device(columns, logprobs.device)]
            self._values.append((places, picked.double()))
            self._waiting += len(places)
        if self._waiting >= PENDING_VALUES:
            self.flush()

    def _token_cells(
        self, requests: np.ndarray, spans: Sequence[tuple[int, int, int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every token of the `requests`' spans (row, start, end), in order: its place in
        `values`, and its row and column in the batch's log-probabilities."""
        spans_ = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
        lengths = spans_[:, 2] - spans_[:, 1]
        first = self.offsets[requests]
        if not np.array_equal(lengths, self.offsets[requests + 1] - first):
            raise RuntimeError("a scored span's length is not its request's scored tokens")
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return (
            np.repeat(first, lengths) + within,
            np.repeat(spans_[:, 0], lengths),
            np.repeat(spans_[:, 1], lengths) + within,
        )

    def flush(self) -> None:
        """The waiting values, read back from the device in one copy."""
        pending = self._sums + self._values
        if not pending:
            return
        device = pending[0][1].device
        read = torch.cat([values.to(device) for _, values in pending]).cpu().numpy()
        summed = sum(len(where) for where, _ in self._sums)
        self.sums[np.concatenate([where for where, _ in self._sums])] = read[:summed]
        if self._values:
            self.values[np.concatenate([where for where, _ in self._values])] = read[summed:]
        self._sums, self._values, self._waiting = [], [], 0

    def result(self) -> TokenLogProbs:
        return TokenLogProbs(self.sums, self.values, self.offsets)


def _right_pad(rows: Sequence[Sequence[int]], pad: int, device: str) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return on_device(out, device)


def _positions_mask(starts: Sequence[int], ends: Sequence[int], width: int) -> np.ndarray:
    position = np.arange(width)[None, :]
    return (position >= np.array(starts)[:, None]) & (position < np.array(ends)[:, None])


def _select_rows(cache: Any, rows: torch.Tensor) -> Any:
    """A cache holding the given batch rows of `cache`, which stays as it is: each layer's
    keys and values are indexed into new tensors, and nothing else is copied."""
    clone = copy.copy(cache)
    clone.layers = [copy.copy(layer) for layer in cache.layers]
    clone.reorder_cache(rows)
    return clone


@dataclass
class _StemGroup:
    """The rows of one context, each a stem with its branches, and the context's key/value
    cache."""

    cache: Any
    first_logits: torch.Tensor  # the context's logits for the first stem token
    sequences: list[StemRow]
    out: Scored
    offset: int = 0  # what a continuation's positions add beyond the context's length
    temperature: float = 1.0  # the one the traces were sampled at


class TransformersScoring:
    """The scorers of `TransformersBackend` (which holds `model`, `device`, `scorer`,
    `batch_tokens`, `pad_id` and `cache_keyword`)."""

    model: Any
    device: str
    scorer: str
    batch_tokens: int
    pad_id: int
    cache_keyword: str
    head: LogitHead | None  # None: the model's full logits (`logit_head`)

    def logits_path(self) -> str:
        """How log-probabilities are read, for the report's settings (`logits`)."""
        if self.head is not None:
            return self.head.describe()
        return f"{FULL_LOGITS} ({self.why_full_logits()})"

    def why_full_logits(self) -> str:
        return f"model type {self.model.config.model_type}: its head is not known"

    def position_offset(self, context: Sequence[int]) -> int:
        """What a continuation's positions add beyond the context's length (0 for text; a
        vision-language model's rope delta after its images)."""
        return 0

    def _prefill(self, context: Sequence[int]) -> tuple[Any, torch.Tensor]:
        """Key/value cache of one context and the logits that predict its next token."""
        ids = torch.tensor([list(context)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        return returned_cache(out), out.logits[:, -1, :]

    def _forward_cached(self, cache: Any, **inputs: Any) -> Any:
        """The model's forward on `inputs` after the key/value cache `cache`."""
        return self.model(**inputs, **{self.cache_keyword: cache})

    def _hidden(self, **inputs: Any) -> torch.Tensor:
        """The decoder's last hidden states (its final norm applied) on `inputs`: the model's
        forward less its LM head (`logit_head.KNOWN_HEADS`)."""
        return self.model.base_model(**inputs).last_hidden_state

    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        return self._score(requests, progress, temperature, per_token=False).sums

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        return self._score(requests, progress, temperature, per_token=True).result()

    @torch.inference_mode()
    def _score(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float,
        per_token: bool,
    ) -> Scored:  # fmt: skip
        out = Scored(requests, per_token)
        if self.scorer == "naive":
            self._score_naive(requests, out, progress, temperature)
        else:
            self._score_cached(requests, out, progress, temperature)
        out.flush()
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
        self, requests: Sequence[ScoreRequest], out: Scored, progress: Progress,
        temperature: float,
    ) -> None:  # fmt: skip
        def score(batch: list[int]) -> int:
            rows = [requests[i].context + requests[i].continuation for i in batch]
            # right padding after every real token: causal attention alone keeps the padding
            # out of every real token's view, with no mask for the model to inspect
            inputs = {"input_ids": _right_pad(rows, self.pad_id, self.device)}
            ids = inputs["input_ids"]
            # position t predicts ids[:, t + 1]
            starts = [len(requests[i].context) + requests[i].scored_from - 1 for i in batch]
            ends = [len(r) - 1 for r in rows]
            scored = _positions_mask(starts, ends, ids.shape[1] - 1)
            mask = on_device(scored, self.device)
            if self.head is None:
                logits = self.model(**inputs).logits
                logprobs = token_logprobs(logits[:, :-1], ids[:, 1:], temperature)
            else:  # the head on the scored positions only
                hidden = self._hidden(**inputs)[:, :-1]
                cells = cells_on_device(scored, self.device)
                logprobs = self.head.logprobs_at(hidden, ids[:, 1:], cells, temperature)
            spans = [(b, s, e) for b, (s, e) in enumerate(zip(starts, ends, strict=True))]
            out.put(batch, masked_sums(logprobs, mask), logprobs, spans)
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
            out = self._forward_cached(cache, input_ids=rest, use_cache=True, logits_to_keep=1)
            yield context, returned_cache(out), out.logits[:, -1, :]

    def _score_cached(
        self, requests: Sequence[ScoreRequest], out: Scored, progress: Progress,
        temperature: float,
    ) -> None:  # fmt: skip
        """Each distinct context is run once; each distinct stem once on top of it (batched by
        length), carrying on into its most common branch, with every other branch (an action
        after a reasoning, say) appended to the same row."""
        by_context: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            by_context[request.context].append(index)
        for context, cache, first_logits in self._prefill_contexts(list(by_context)):
            stems: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for index in by_context[context]:
                stems[requests[index].stem_row].append(index)
            sequences = [StemRow.of(stem, requests, members) for stem, members in stems.items()]
            group = _StemGroup(
                cache, first_logits, sequences, out, self.position_offset(context), temperature
            )
            score = functools.partial(self._score_stems, group)
            for kind in (False, True):  # plain rows apart: no mask, no branched row's width
                members = [i for i, s in enumerate(sequences) if s.branched == kind]
                widths = [len(sequences[i].ids) for i in members]
                self._score_batches(members, widths, score, progress)

    def _score_stems(self, group: _StemGroup, batch: Sequence[int]) -> int:
        """Run the sequences `group.sequences[batch]` (each stem carried on into its common
        branch, its other branches appended) on the context's key/value cache in one forward
        pass, and write the value of every request they hold."""
        layout = RowLayout.of([group.sequences[b] for b in batch], self.device)
        context_length = group.cache.get_seq_length()
        one_row = torch.zeros(len(batch), dtype=torch.long, device=self.device)
        cache = _select_rows(group.cache, one_row)  # the context's one row, once per stem
        inputs = {"input_ids": layout.ids, "use_cache": True, self.cache_keyword: cache}
        positions = context_length + group.offset + layout.positions
        if layout.branched:
            dtype = next(self.model.parameters()).dtype
            allowed = layout.allowed(context_length)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(dtype).min)
            inputs |= {"attention_mask": mask, "position_ids": positions}
        elif group.offset:  # plain rows after images: their positions said
            inputs["position_ids"] = positions
        # else plain rows: causal on the context, right padding after every real token
        logprobs = self._predicted(inputs, group, layout)
        totals = torch.nn.functional.pad(logprobs.double().cumsum(dim=1), (1, 0))
        row, start, end = (on_device(column, self.device) for column in np.array(layout.spans).T)
        sums = totals[row, end] - totals[row, start]
        group.out.put(layout.requests, sums, logprobs, layout.spans)
        return len(layout.requests)

    def _predicted(
        self, inputs: dict[str, Any], group: _StemGroup, layout: RowLayout
    ) -> torch.Tensor:
        """Each target's log-probability in the rows `inputs` run on the context's cache:
        through the tiled head where the model's is known, else from its full logits."""
        if self.head is None:
            logits = self.model(**inputs).logits
            return predicted_logprobs(
                logits, group.first_logits, layout.predictor, layout.targets, group.temperature
            )
        return head_predicted_logprobs(
            self.head, self._hidden(**inputs), group.first_logits, layout, group.temperature
        )
