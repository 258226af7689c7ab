"""The transformers backend: loading, memory sizing, and sampling with the model's own
key/value cache. Its scorers (`cached`, `naive`) live in `hf_scoring`."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from collapsecheck.engines.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    decode_ids,
    prompt_seed,
    stop_token_ids,
)
from collapsecheck.engines.backends.decode_cache import preallocate
from collapsecheck.engines.backends.grammar import Grammars, RowGrammars
from collapsecheck.engines.backends.hf_scoring import (
    TransformersScoring,
    cache_keyword,
    returned_cache,
)
from collapsecheck.engines.backends.layer_kinds import attending_layers, stateful_kinds
from collapsecheck.engines.backends.logit_head import LogitHead, tile_bytes
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

AUTO = "auto"
CPU_SCORING_BUDGET = 2 * 2**30  # bytes of activations a CPU scoring batch may use
GPU_BUDGET_SHARE = 0.5  # share of the free GPU memory a scoring batch may use


def auto_batch_tokens(model: Any, tiled: bool | None = None) -> int:
    """Tokens per scoring batch that fit the memory at hand: a budget (half the free GPU
    memory, or 2 GiB on CPU) over a per-token estimate (key/values, activations, and either
    the float32 logits with their log-softmax work space, or, where the LM head runs in tiles
    (`logit_head`), each scored position's hidden state, the tiles' fixed work space taken
    off the budget first; `tiled`: which, where not the model's own). A heuristic: the
    out-of-memory guard backs it up."""
    config = model.config.get_text_config()
    element = next(model.parameters()).element_size()
    tiled = LogitHead.of(model) is not None if tiled is None else tiled
    per_token = (
        (4 * config.hidden_size * 4 if tiled else 4 * config.vocab_size * 4)
        + kv_bytes_per_token(model)
        + 16 * config.hidden_size * element  # activations of one layer
        + 3 * getattr(config, "intermediate_size", 0) * element  # its MLP's
    )
    device = next(model.parameters()).device
    budget = memory_budget(device) - (tile_bytes(device) if tiled else 0)
    return int(min(max(budget // per_token, 256), 2**17))


def kv_bytes_per_token(model: Any) -> int:
    """The keys and values one token keeps in the cache, over the layers that attend
    (`layer_kinds`; a layer that carries a state keeps the same few bytes whatever the
    length)."""
    layers = attending_layers(model)
    if not layers:
        return 0
    config = model.config.get_text_config()
    query_heads = config.num_attention_heads
    heads = getattr(config, "num_key_value_heads", None) or query_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // query_heads
    element = next(model.parameters()).element_size()
    return 2 * layers * heads * head_dim * element


def memory_budget(device: torch.device) -> float:
    """Bytes a batch may use: half the free GPU memory, or CPU_SCORING_BUDGET on a CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free * GPU_BUDGET_SHARE
    return CPU_SCORING_BUDGET


def state_bytes_per_sequence(model: Any) -> int:
    """Bytes a sequence's cache keeps whatever its length, in the layers that carry a state
    (`layer_kinds`; 0 for a model without): measured as every tensor of the cache a
    one-token prefill leaves (its one token's keys and values are a rounding error)."""
    if not stateful_kinds(model):
        return 0
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True)
    return sum(t.numel() * t.element_size() for t in _tensors_in(returned_cache(out)))


def _tensors_in(cache: Any) -> list[torch.Tensor]:
    """The tensors a cache holds: in its attributes and its layers', dicts and lists opened."""
    holders = (cache, *getattr(cache, "layers", []))
    return [t for holder in holders for t in _flat(getattr(holder, "__dict__", holder))]


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _flat(item)]
    return []


def auto_sample_batch(model: Any, length: int, state_bytes: int = 0) -> int:
    """Sequences of up to `length` tokens (prompt and response) to decode together: as many
    as the memory budget of `auto_batch_tokens` holds at a per-sequence estimate (their
    key/values at full length, the `state_bytes` of layers that carry a state, float32 work
    space over the vocabulary for sampling), up to SAMPLE_BATCH_CAP."""
    vocab = model.config.get_text_config().vocab_size
    per_sequence = (
        kv_bytes_per_token(model) * length
        + state_bytes
        + 6 * vocab * 4  # logits, probabilities, their float64 running sums, sort (float32 units)
    )
    device = next(model.parameters()).device
    cap = SAMPLE_BATCH_CAP["cuda" if device.type == "cuda" else "cpu"]
    return int(max(1, min(memory_budget(device) // per_sequence, cap)))


def resolve_batch_tokens(value: int | str, model: Any) -> int:
    """--batch-tokens (checked in LoadSettings): a number, or `auto` sized to the memory."""
    return auto_batch_tokens(model) if value == AUTO else int(value)


def scorer_for(model: Any, asked: str) -> tuple[str, str | None]:
    """The scorer that runs, and why where it is not the one asked for: a model with layers
    that carry a state (`layer_kinds`) is scored by `naive`, one plain pass per request, since
    the cached scorer carries a context's cache into packed rows."""
    kinds = stateful_kinds(model)
    if asked != "cached" or not kinds:
        return asked, None
    model_type = model.config.get_text_config().model_type
    return "naive", (
        f"not cached: {model_type}'s {', '.join(kinds)} layers carry a state, which packed "
        "rows cannot share"
    )


def _left_pad(rows: Sequence[Sequence[int]], pad: int, device: str) -> tuple[torch.Tensor, ...]:
    """Left-padded ids and their attention mask, for decoding several prompts together."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def shared_contexts(
    prompts: Sequence[Sequence[int]],
) -> tuple[list[Sequence[int]], list[int]]:  # fmt: skip
    """The distinct prompts (in order of first appearance) and, for each prompt, the
    index of its ids among them: what one prefill per distinct context needs."""
    index: dict[tuple[int, ...], int] = {}
    distinct: list[Sequence[int]] = []
    for prompt in prompts:
        if index.setdefault(tuple(prompt), len(distinct)) == len(distinct):
            distinct.append(prompt)
    return distinct, [index[tuple(prompt)] for prompt in prompts]


# decode steps between reads of which rows have ended, by device type. Each read makes the host
# wait for the device: on a GPU that would hold every step's kernel launches back until its
# work is done; a CPU has nothing to overlap. A row that has ended draws padding, and each
# row's uniforms are drawn before decoding (`step_uniforms`), so reading later changes no trace.
ENDED_READ_EVERY = {"cpu": 1, "other": 8}


def sampleable(logits: torch.Tensor) -> torch.Tensor:
    """Whether every row of logits is a distribution to sample from, as a 0-d bool on the
    logits' device: no NaN, no +inf, and not every token at -inf. A token at -inf alone is
    probability 0, and fine. One reduction per row (`amax` propagates NaN), no copy of the
    logits."""
    return torch.isfinite(logits.amax(dim=-1)).all()


def require_finite(finite: torch.Tensor) -> None:
    """Stop with one line where the logits sampled from held a NaN or an infinity
    (`sampleable`)."""
    if not bool(finite):
        raise CollapsecheckError(
            "the model produced NaN or infinite logits while sampling: no verdict "
            "(check the checkpoint's weights, or try --dtype float32)"
        )


def step_uniforms(
    generators: Sequence[torch.Generator], k: int, steps: int
) -> torch.Tensor:  # fmt: skip
    """SPEC "Sampling": every uniform a batch's decoding uses, (steps, prompts x K) float64,
    drawn once per prompt, (steps, K) from its own generator, so that a prompt's traces are
    the same whichever rows are decoded beside it and whenever its rows end."""
    device = generators[0].device
    per_prompt = [
        torch.rand((steps, k), generator=g, dtype=torch.float64, device=device) for g in generators
    ]
    return torch.cat(per_prompt, dim=1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """SPEC "Sampling": each row's token is the first whose cumulative probability (float64
    sums, in vocabulary order) passes u x the row's total, so a token is drawn with its share
    of the total and one of probability 0 never. A row that is not finite draws the last
    token; `require_finite` stops the scan on it."""
    cumulative = probs.double().cumsum(dim=-1)
    total = cumulative[:, -1:]
    point = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, total.new_zeros(())))
    tokens = torch.searchsorted(cumulative, point, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


class TransformersBackend(TransformersScoring):
    """Backend over a transformers causal LM loaded from a local checkpoint directory; it
    scores with `TransformersScoring`."""

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
        self.scorer, self.scorer_reason = scorer_for(model, scorer)
        self.attends = attending_layers(model) > 0
        self.state_bytes: int | None = None  # measured when a sampling batch is first sized
        self.batch_tokens = resolve_batch_tokens(batch_tokens, model)
        self.sample_batch = sample_batch
        self.device = str(next(model.parameters()).device)
        self.cache_keyword = cache_keyword(model)
        self.head = LogitHead.of(model)
        generation = getattr(model, "generation_config", None)
        self.stop_ids = stop_token_ids(
            getattr(generation, "eos_token_id", None), tokenizer.eos_token_id
        )
        self.pad_id = int(self.stop_ids[0]) if self.stop_ids else 0
        self.grammars: Grammars | None = None  # compiled where a request asks a JSON schema

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
            "scorer": self.scorer + (f" ({self.scorer_reason})" if self.scorer_reason else ""),
            "logits": self.logits_path(),
        }

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    @staticmethod
    def _next_tokens(
        logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
    ) -> torch.Tensor:  # fmt: skip
        """The next token of each decoded row, drawn from its uniform (`inverse_cdf`). The
        softmax, nucleus cut and draw run over all rows at once."""
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0))
        return inverse_cdf(probs, uniforms)

    def _sample_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int]
    ) -> list[list[Sample]]:
        """K samples for each of several prompts, decoded together, each prompt's from its
        own seed. Prompts whose ids are identical (the K episodes of a start state at turn 1,
        a harness's requests with the same messages) are prefilled once and their rows
        decoded from that one prefill (SPEC "Sampling"): each draws what it would alone."""
        distinct, picked = shared_contexts(prompts)
        return self._decode(*self.prefill_together(distinct), params, seeds, picked)

    def prefill_together(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, ...]:
        """One prefill of several prompts, left-padded. Returns the cache, each prompt's
        last logits, the mask and each prompt's last position."""
        ids, mask = _left_pad(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = returned_cache(out)
        if cache is None:  # BERT's LM head, say: it sees the whole input
            raise CollapsecheckError(
                f"the model ({self.model.config.model_type}) returns no cache of what it has "
                "read (an encoder such as BERT, or a model transformers runs without one): "
                "collapsecheck samples causal language models with their cache"
            )
        return cache, out.logits[:, -1, :], mask, positions[:, -1:]

    def _decode(
        self, cache: Any, logits: torch.Tensor, mask: torch.Tensor, position: torch.Tensor,
        params: SamplingParams, seeds: Sequence[int], prefilled: Sequence[int],
    ) -> list[list[Sample]]:  # fmt: skip
        """K samples for each prompt, drawn from its own seeded generator (`seeds`), prompt i
        read from prefilled row `prefilled[i]` (of `cache`, `logits`, `mask` and the last
        `position`): rows that share a prefill are copied apart here, where they begin to
        diverge. Which rows have ended is read every ENDED_READ_EVERY steps: once a quarter of
        the decoded rows have, they leave the batch (its cache, mask and positions keep the
        others), unless the cache is of a model's own class (`preallocate`). The cache and the
        mask are sized for the whole decode once (`decode_cache`): a step writes its own
        token's part."""
        k = params.k
        generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        total = len(seeds) * k
        picked = torch.tensor(prefilled, device=self.device).repeat_interleave(k)
        logits = logits.index_select(0, picked)
        shrinks = preallocate(cache, picked, params.max_new_tokens)
        width = mask.shape[1]  # the mask's filled part: its ones after it are the new tokens'
        mask = torch.cat([mask, mask.new_ones((len(mask), params.max_new_tokens))], dim=1)
        mask = mask.index_select(0, picked)
        position = position.index_select(0, picked)
        stops = torch.tensor(self.stop_ids or [-1], device=self.device)
        rows = torch.arange(total, device=self.device)  # the decoded rows' numbers
        uniforms = step_uniforms(generators, k, params.max_new_tokens)
        ended = torch.zeros(total, dtype=torch.bool, device=self.device)  # of the decoded rows
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        every = ENDED_READ_EVERY.get(torch.device(self.device).type, ENDED_READ_EVERY["other"])
        grammars = self.constrained_rows(params, total, logits.shape[-1])
        steps: list[torch.Tensor] = []
        for step in range(1, params.max_new_tokens + 1):
            finite &= sampleable(logits)
            tokens = self._drawn(logits, params, uniforms[step - 1, rows], ended, rows, grammars)
            steps.append(torch.full((total,), self.pad_id, device=self.device).index_put(
                (rows,), tokens))  # fmt: skip
            ended |= torch.isin(tokens, stops)
            if step % every == 0 or step == params.max_new_tokens:
                require_finite(finite)
                done = ended.tolist()
                if all(done) or step == params.max_new_tokens:
                    break
                if shrinks and 4 * sum(done) >= len(done):
                    kept = [i for i, row_ended in enumerate(done) if not row_ended]
                    going = torch.tensor(kept, device=self.device)
                    cache.reorder_cache(going)
                    rows, tokens, mask, position, ended = (
                        rows[going], tokens[going], mask[going], position[going], ended[going]
                    )  # fmt: skip
            width, position = width + 1, position + 1
            # a model with no attention layer (Mamba's) folded the padding into its state at
            # the prefill, and reads a mask as the new token's alone, as its own generate does
            out = self._forward_cached(
                cache, input_ids=tokens[:, None], position_ids=position, use_cache=True,
                attention_mask=mask[:, :width] if self.attends else None,
            )  # fmt: skip
            cache, logits = returned_cache(out), out.logits[:, -1, :]
        decoded = torch.stack(steps, dim=1).tolist()
        return [self._split_samples(decoded[i * k : (i + 1) * k]) for i in range(len(seeds))]

    def _drawn(
        self, logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor,
        ended: torch.Tensor, rows: torch.Tensor, grammars: RowGrammars | None,
    ) -> torch.Tensor:  # fmt: skip
        """The decoded rows' next tokens, each drawn from its uniform (under its grammar where
        the samples are constrained), padding where a row has ended."""
        if grammars is not None:
            logits = grammars.limited(logits, rows)
        tokens = self._next_tokens(logits, params, uniforms)
        tokens = torch.where(ended, torch.full_like(tokens, self.pad_id), tokens)
        if grammars is not None:
            grammars.drew(tokens, rows)
        return tokens

    def constrained_rows(
        self, params: SamplingParams, rows: int, vocab_size: int
    ) -> RowGrammars | None:  # fmt: skip
        """Each decoded row's grammar where the samples are drawn under a JSON schema."""
        if params.json_schema is None:
            return None
        if self.grammars is None:
            self.grammars = Grammars(self.tokenizer, self.stop_ids)
        return self.grammars.rows(params.json_schema, rows, vocab_size)

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
        if self.state_bytes is None:
            self.state_bytes = state_bytes_per_sequence(self.model)
        return auto_sample_batch(self.model, longest, self.state_bytes)

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
        per_batch = max(1, self.sequences_per_batch(prompts, params) // params.k)
        results: list[list[Sample]] = []
        for start in range(0, len(prompts), per_batch):
            chunk = range(start, min(start + per_batch, len(prompts)))
            drawn = [prompt_seed(params.seed, offset + i) if seeds is None else seeds[i]
                     for i in chunk]  # fmt: skip
            results += self._sample_batch([prompts[i] for i in chunk], params, drawn)
            progress(len(chunk))
        return results
