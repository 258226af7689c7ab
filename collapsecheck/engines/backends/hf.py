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
import inspect
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collapsecheck.engines.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    decode_ids,
    prompt_seed,
    stop_token_ids,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import (
    Checkpoint,
    load_model,
    load_tokenizer,
    require_checkpoint,
    resolve_device,
    resolve_dtype,
)
from collapsecheck.settings import SAMPLE_BATCH_CAP, LoadSettings


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
    per_token = (
        4 * config.vocab_size * 4  # logits (float32), log-softmax temporaries
        + kv_bytes_per_token(model)
        + 16 * config.hidden_size * element  # activations of one layer
    )
    budget = memory_budget(next(model.parameters()).device)
    return int(min(max(budget // per_token, 256), 2**17))


def kv_bytes_per_token(model: Any) -> int:
    """The keys and values one token keeps in the cache, over all layers."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * element


def memory_budget(device: torch.device) -> float:
    """Bytes a batch may use: half the free GPU memory, or CPU_SCORING_BUDGET on a CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free * GPU_BUDGET_SHARE
    return CPU_SCORING_BUDGET


def auto_sample_batch(model: Any, length: int) -> int:
    """Sequences of up to `length` tokens (prompt and response) to decode together: as many
    as the memory budget of `auto_batch_tokens` holds at a per-sequence estimate (their
    key/values at full length, float32 work space over the vocabulary for sampling), up to
    SAMPLE_BATCH_CAP."""
    vocab = model.config.get_text_config().vocab_size
    per_sequence = (
        kv_bytes_per_token(model) * length
        + 6 * vocab * 4  # logits, probabilities, noise, sort (float32)
    )
    device = next(model.parameters()).device
    cap = SAMPLE_BATCH_CAP["cuda" if device.type == "cuda" else "cpu"]
    return int(max(1, min(memory_budget(device) // per_sequence, cap)))


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
    first_row = tempered(first_logits[0], temperature)
    first = first_row[targets] - torch.logsumexp(first_row, dim=-1)
    return torch.where(predictor >= 0, picked, first)


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


def _common_branch(tails: dict[tuple[tuple[int, ...], int], list[int]]) -> tuple[int, ...]:
    """Of the tokens after a stem (with where their scoring starts, and the requests that
    ask for them), those that most requests continue with (none if none does): the stem's
    own pass runs them, so those requests need no branch of their own."""
    counts: Counter[tuple[int, ...]] = Counter()
    for (tail, _), indices in tails.items():
        if tail:
            counts[tail] += len(indices)
    return max(counts, key=counts.__getitem__) if counts else ()


@dataclass
class _StemGroup:
    """The rows of one context, each a stem with its branches, and the context's key/value
    cache."""

    cache: Any
    first_logits: torch.Tensor  # the context's logits for the first stem token
    sequences: list[_Sequence]
    out: np.ndarray
    offset: int = 0  # what a continuation's positions add beyond the context's length
    temperature: float = 1.0  # the one the traces were sampled at


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
        sample_batch: int | str = AUTO,
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
        self.cache_keyword = cache_keyword(model)
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
        """Load a checkpoint of any supported format (see `collapsecheck.inputs.checkpoint`)."""
        _, model, tokenizer, options = cls.load_parts(checkpoint, settings, scorer)
        return cls(model, tokenizer, **options)

    @staticmethod
    def load_parts(
        checkpoint: Checkpoint | str | Path, settings: LoadSettings | None, scorer: str | None
    ) -> tuple[Checkpoint, Any, Any, dict[str, Any]]:
        """The checkpoint recognised, its model (eval mode, on its device) and tokenizer, and
        the backend's options."""
        settings = settings or LoadSettings()
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = require_checkpoint(checkpoint, settings.base_model)
        tokenizer = load_tokenizer(checkpoint, settings.trust_remote_code)
        device = resolve_device(settings.device)
        model = load_model(checkpoint, device, resolve_dtype(settings.dtype, device), settings)
        options = {
            "scorer": scorer or "cached",
            "batch_tokens": settings.batch_tokens,
            "sample_batch": settings.sample_batch,
        }
        return checkpoint, model, tokenizer, options

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

    # -- sampling -----------------------------------------------------------------------

    @staticmethod
    def _next_tokens(
        logits: torch.Tensor, rows: torch.Tensor, params: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> torch.Tensor:  # fmt: skip
        """The next token of each decoded row (`rows`: their numbers, prompt after prompt, K
        each), drawn as `torch.multinomial` would draw a prompt's K rows from its generator:
        argmax(p / q) with q ~ Exp(1) over all K rows (a finished row's noise too, so that the
        prompt's stream, and its traces, are the same whichever rows are still decoded). The
        softmax, nucleus cut and argmax run over all rows at once; only the noise is drawn
        prompt by prompt."""
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
        k = params.k
        prompt_of, sample_of = (rows // k).tolist(), (rows % k).tolist()
        noise = torch.empty_like(probs)
        start = 0
        for prompt, group in itertools.groupby(range(len(prompt_of)), key=prompt_of.__getitem__):
            members = list(group)
            drawn = torch.empty((k, probs.shape[-1]), dtype=probs.dtype, device=probs.device)
            drawn.exponential_(generator=generators[prompt])
            noise[start : start + len(members)] = drawn[[sample_of[m] for m in members]]
            start += len(members)
        return (probs / noise).argmax(dim=-1)

    def _sample_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """K samples for each of several prompts, decoded together (prompts left-padded).

        Each prompt draws from its own seeded generator, so its traces do not depend on the
        sampling order of the others.
        """
        ids, mask = _left_pad(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        return self._decode(
            returned_cache(out), out.logits[:, -1, :], mask, positions[:, -1:], params, seeds
        )

    def _decode(
        self, cache: Any, logits: torch.Tensor, mask: torch.Tensor, position: torch.Tensor,
        params: SamplingParams, seeds: Sequence[int],
    ) -> list[list[Sample]]:  # fmt: skip
        """K samples for each prefilled prompt (one row each of `cache`, `logits`, `mask`,
        and the last `position`), drawn from its own seeded generator. A row that has ended
        is carried no further: once a quarter of the decoded rows have ended, they leave the
        batch (its cache, mask and positions keep the others)."""
        k = params.k
        generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        total = len(seeds) * k
        logits = logits.repeat_interleave(k, dim=0)
        cache.batch_repeat_interleave(k)
        mask = mask.repeat_interleave(k, dim=0)
        position = position.repeat_interleave(k, dim=0)
        stops = torch.tensor(self.stop_ids or [-1], device=self.device)
        rows = torch.arange(total, device=self.device)  # the decoded rows' numbers
        ended = torch.zeros(total, dtype=torch.bool, device=self.device)  # of the decoded rows
        steps: list[torch.Tensor] = []
        for _ in range(params.max_new_tokens):
            tokens = self._next_tokens(logits, rows, params, generators)
            tokens = torch.where(ended, torch.full_like(tokens, self.pad_id), tokens)
            steps.append(torch.full((total,), self.pad_id, device=self.device).index_put(
                (rows,), tokens))  # fmt: skip
            ended |= torch.isin(tokens, stops)
            if bool(ended.all()):
                break
            if 4 * int(ended.sum()) >= len(rows):
                going = (~ended).nonzero().squeeze(-1)
                cache.reorder_cache(going)
                rows, tokens, mask, position = (
                    rows[going],
                    tokens[going],
                    mask[going],
                    position[going],
                )
                ended = ended[going]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            position = position + 1
            out = self._forward_cached(
                cache, input_ids=tokens[:, None], attention_mask=mask, position_ids=position,
                use_cache=True,
            )  # fmt: skip
            cache, logits = returned_cache(out), out.logits[:, -1, :]
        decoded = torch.stack(steps, dim=1).tolist()
        return [self._split_samples(decoded[i * k : (i + 1) * k]) for i in range(len(seeds))]

    def _split_samples(self, rows: list[list[int]]) -> list[Sample]:
        samples = []
        for row in rows:
            stop = next((i for i, token in enumerate(row) if token in self.stop_ids), None)
            samples.append(Sample(tuple(row[:stop]), truncated=stop is None))
        return samples

    def sequences_per_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> int:
        """--sample-batch: the number given, or auto (`auto_sample_batch`) for the longest
        prompt and the length limit."""
        if self.sample_batch != AUTO:
            return int(self.sample_batch)
        longest = max((len(p) for p in prompts), default=0) + params.max_new_tokens
        return auto_sample_batch(self.model, longest)

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0,
    ) -> list[list[Sample]]:  # fmt: skip
        per_batch = max(1, self.sequences_per_batch(prompts, params) // params.k)
        results: list[list[Sample]] = []
        for start in range(0, len(prompts), per_batch):
            chunk = range(start, min(start + per_batch, len(prompts)))
            seeds = [prompt_seed(params.seed, offset + i) for i in chunk]
            results += self._sample_batch([prompts[i] for i in chunk], params, seeds)
            progress(len(chunk))
        return results

    # -- scoring ------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        out = np.zeros(len(requests), dtype=np.float64)
        if self.scorer == "naive":
            self._score_naive(requests, out, progress, temperature)
        else:
            self._score_cached(requests, out, progress, temperature)
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
        self, requests: Sequence[ScoreRequest], out: np.ndarray, progress: Progress,
        temperature: float,
    ) -> None:  # fmt: skip
        def score(batch: list[int]) -> int:
            rows = [requests[i].context + requests[i].continuation for i in batch]
            ids = _right_pad(rows, self.pad_id, self.device)
            attention = _positions_mask([0] * len(rows), [len(r) for r in rows], ids.shape[1])
            logits = self.model(input_ids=ids, attention_mask=attention.to(self.device)).logits
            # logits[:, t] predicts ids[:, t + 1]
            starts = [len(requests[i].context) + requests[i].scored_from - 1 for i in batch]
            ends = [len(r) - 1 for r in rows]
            mask = _positions_mask(starts, ends, ids.shape[1] - 1).to(self.device)
            logprobs = token_logprobs(logits[:, :-1], ids[:, 1:], temperature)
            out[batch] = masked_sums(logprobs, mask)
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
        self, requests: Sequence[ScoreRequest], out: np.ndarray, progress: Progress,
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
                request = requests[index]
                stems[request.continuation[: request.stem_length]].append(index)
            sequences = [_Sequence.of(stem, requests, members) for stem, members in stems.items()]
            group = _StemGroup(
                cache, first_logits, sequences, out, self.position_offset(context), temperature
            )
            score = functools.partial(self._score_stems, group)
            widths = [len(sequence.ids) for sequence in sequences]
            self._score_batches(range(len(sequences)), widths, score, progress)

    def _score_stems(self, group: _StemGroup, batch: Sequence[int]) -> int:
        """Run the sequences `group.sequences[batch]` (each stem carried on into its common
        branch, its other branches appended) on the context's key/value cache in one forward
        pass, and write the value of every request they hold."""
        layout = _RowLayout.of([group.sequences[b] for b in batch], self.device)
        context_length = group.cache.get_seq_length()
        one_row = torch.zeros(len(batch), dtype=torch.long, device=self.device)
        cache = _select_rows(group.cache, one_row)  # the context's one row, once per stem
        positions = context_length + group.offset + layout.positions
        if layout.branched:
            dtype = next(self.model.parameters()).dtype
            allowed = layout.allowed(context_length)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(dtype).min)
            logits = self._forward_cached(
                cache, input_ids=layout.ids, attention_mask=mask, position_ids=positions,
                use_cache=True,
            ).logits  # fmt: skip
        elif group.offset:  # plain rows after images: their positions said
            logits = self._forward_cached(
                cache, input_ids=layout.ids, position_ids=positions, use_cache=True
            ).logits
        else:  # plain rows: causal on the context, right padding after every real token
            logits = self._forward_cached(cache, input_ids=layout.ids, use_cache=True).logits
        logprobs = predicted_logprobs(
            logits, group.first_logits, layout.predictor, layout.targets, group.temperature
        )
        totals = torch.nn.functional.pad(logprobs.double().cumsum(dim=1), (1, 0)).cpu()
        spans = torch.tensor(layout.spans, dtype=torch.long)  # (row, start, end) per request
        values = totals[spans[:, 0], spans[:, 2]] - totals[spans[:, 0], spans[:, 1]]
        group.out[layout.requests] = values.numpy()
        return len(layout.requests)


def _shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` begin with in common."""
    shared = 0
    for mine, theirs in zip(a, b, strict=False):
        if mine != theirs:
            break
        shared += 1
    return shared


@dataclass(frozen=True)
class _Sequence:
    """One stem row, its distinct other branches appended, as one sequence. Its tokens are
    its targets: for each, the token whose logits predict it (`predictor`, an index into the
    inputs; -1: the context's last). Its inputs are the tokens whose logits something reads
    (a branch's last token, and the row's when no branch leaves after it, are scored but
    never run): for each its id, branch (-1: the row), offset in that branch, position and
    how many row tokens it sees. For each request it answers, the span of its targets."""

    ids: list[int]
    branch: list[int]
    offset: list[int]
    position: list[int]
    row_seen: list[int]
    targets: list[int]
    predictor: list[int]
    requests: list[int]
    spans: list[tuple[int, int]]

    @classmethod
    def of(
        cls, stem: tuple[int, ...], requests: Sequence[ScoreRequest], members: Sequence[int]
    ) -> _Sequence:
        tails: dict[tuple[tuple[int, ...], int], list[int]] = defaultdict(list)
        for index in members:  # requests asking for the same tokens are laid out once
            request = requests[index]
            tails[(request.continuation[len(stem) :], request.scored_from)].append(index)
        carried = _common_branch(tails)
        row = stem + carried
        width = len(row)
        ids, branch, offset = list(row), [-1] * width, list(range(width))
        position, row_seen = list(range(width)), list(range(1, width + 1))
        predictor = list(range(-1, width - 1))
        starts: dict[tuple[int, tuple[int, ...]], int] = {}
        order, spans = [], []
        for (tail, scored_from), indices in tails.items():
            order += indices
            if tail == carried[: len(tail)]:  # inside the row
                spans += [(scored_from, len(stem) + len(tail))] * len(indices)
                continue
            # the branch leaves the row after the tokens it shares with it (the mid before
            # an action, say), but no later than where its scored tokens begin
            at = min(len(stem) + _shared_length(tail, carried), scored_from)
            own = (stem + tail)[at:]
            if (at, own) not in starts:
                start = starts[(at, own)] = len(ids)
                ids += own
                branch += [len(starts) - 1] * len(own)
                offset += range(len(own))
                position += range(at, at + len(own))
                row_seen += [at] * len(own)
                predictor += [at - 1, *range(start, start + len(own) - 1)]
            start = starts[(at, own)]
            spans += [(start + scored_from - at, start + len(own))] * len(indices)
        inputs = _read_inputs(predictor)
        kept = {token: index for index, token in enumerate(inputs)}
        return cls(
            [ids[t] for t in inputs], [branch[t] for t in inputs], [offset[t] for t in inputs],
            [position[t] for t in inputs], [row_seen[t] for t in inputs], ids,
            [kept.get(t, -1) for t in predictor], order, spans,
        )  # fmt: skip


def _read_inputs(predictor: Sequence[int]) -> list[int]:
    """The tokens whose logits predict another (and the first, so that no sequence is
    empty), in order. The others are a branch's last token, or the row's when nothing leaves
    after it: no token sees them (a branch token sees its own branch's earlier tokens and
    the row before its attach point), so leaving them out of the pass is exact."""
    read = set(predictor)
    return [t for t in range(len(predictor)) if t in read or t == 0]


@dataclass
class _RowLayout:
    """Sequences right-padded into model inputs (padding sees only the context)."""

    ids: torch.Tensor
    branch: torch.Tensor
    offset: torch.Tensor
    positions: torch.Tensor
    row_seen: torch.Tensor
    targets: torch.Tensor
    predictor: torch.Tensor
    requests: list[int]
    spans: list[tuple[int, int, int]]  # (row in the batch, start, end) of targets per request

    @property
    def branched(self) -> bool:
        return bool((self.branch >= 0).any())

    @classmethod
    def of(cls, sequences: Sequence[_Sequence], device: str) -> _RowLayout:
        def real(lengths: Sequence[int]) -> np.ndarray:
            """Which cells of the padded (rows, longest) array hold a token, row-major."""
            lengths = np.array(lengths)
            return np.arange(lengths.max())[None, :] < lengths[:, None]

        inputs = real([len(s.ids) for s in sequences])
        targets = real([len(s.targets) for s in sequences])

        def padded(field: str, fill: int, cells: np.ndarray) -> torch.Tensor:
            out = np.full(cells.shape, fill, dtype=np.int64)
            out[cells] = np.fromiter(chain.from_iterable(getattr(s, field) for s in sequences),
                                     dtype=np.int64, count=int(cells.sum()))  # fmt: skip
            return torch.from_numpy(out).to(device)

        requests = [index for s in sequences for index in s.requests]
        spans = [(b, *span) for b, s in enumerate(sequences) for span in s.spans]
        return cls(
            padded("ids", 0, inputs), padded("branch", -2, inputs), padded("offset", 0, inputs),
            padded("position", 0, inputs), padded("row_seen", 0, inputs),
            padded("targets", 0, targets), padded("predictor", -1, targets), requests, spans,
        )  # fmt: skip

    def allowed(self, context_length: int) -> torch.Tensor:
        """(rows, 1, width, context + width): every token sees the context; a row token the
        row up to itself; a branch token the row before its attach point and its own branch
        up to itself."""
        query, key = (slice(None), slice(None), None), (slice(None), None, slice(None))
        sees_row = (self.branch[key] == -1) & (self.offset[key] < self.row_seen[query])
        own_branch = (self.branch[key] == self.branch[query]) & (self.branch[query] >= 0)
        sees_branch = own_branch & (self.offset[key] <= self.offset[query])
        context = torch.ones(
            (*self.ids.shape, context_length), dtype=torch.bool, device=self.ids.device
        )
        return torch.cat([context, sees_row | sees_branch], dim=-1)[:, None]
