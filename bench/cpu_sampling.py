"""Where the CPU's sampling time goes (issue 57, item 7), on the real pretrained model of
bench/real_model.py (SmolLM2-135M-Instruct, float32), measured in one run:

1. one `torch.profiler` trace of a sampling stage as the sampler runs it, its self time by kind
   of work;
2. the whole stage three ways, alternating: as it runs now (the key/value cache laid out for
   decoding, `decode_cache.PreallocatedLayer`, and samples version 2's draw); with the cache
   concatenated every step instead (transformers' `DynamicLayer`, the sampler before); and
   with samples version 1's draw instead (Exp(1) noise over the whole vocabulary for every row
   from its prompt's generator, argmax(p / q), as `torch.multinomial` draws);
3. the draw alone at the stage's shape, each version.

The stage: PROMPTS random prompts of PROMPT_TOKENS tokens, K = 4, NEW_TOKENS new tokens with
the stop tokens ignored (every row decodes to the limit, so each run does the same work), all
rows decoded together. Where the model is not installed it says so in one line and ends
(`make bench-real` installs it).

    python bench/cpu_sampling.py [--write]
"""

from __future__ import annotations

import argparse
import datetime
import random
import statistics

import torch
from bench_scoring import alternating, machine, publish
from cpu_profile import profiled_shares
from real_model import (
    add_real_model_arguments,
    converted_checkpoint,
    matmul_gflops,
    rate_cells,
    seconds_of,
)

from collapsecheck.engines.backends import hf
from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend, inverse_cdf
from collapsecheck.settings import LoadSettings

HEADING = "## Where the CPU's sampling time goes"
PROMPTS, PROMPT_TOKENS, K, NEW_TOKENS = 16, 60, 4, 96
KINDS = {  # profiler op -> kind of work (the rest: other)
    "matmul (linear layers, LM head)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention (SDPA)": ("attention",),
    "the cache's concatenation, copies, indexing": (
        "aten::cat", "aten::copy_", "aten::index", "aten::index_put", "aten::_to_copy",
        "aten::clone", "aten::fill_", "aten::index_select",
    ),
    "the draw (softmax, noise or running sums, argmax or search)": (
        "aten::_softmax", "aten::exponential", "aten::cumsum", "aten::searchsorted",
        "aten::argmax", "aten::div",
    ),
    "finiteness and stop checks": ("aten::amax", "aten::isfinite", "aten::abs", "aten::eq",
                                   "aten::ne", "aten::all", "aten::isin"),
    "element-wise (norms, rotary, activations)": (
        "aten::mul", "aten::add", "aten::silu", "aten::pow", "aten::mean", "aten::rsqrt",
        "aten::neg", "aten::where",
    ),
}  # fmt: skip


def concatenating(cache, picked, new_tokens: int) -> bool:
    """The sampler's cache before: every row picked, each step concatenated on."""
    cache.batch_select_indices(picked)
    return False


STAGES = {  # arm -> (the cache concatenated, version 1's draw)
    "as it runs now (cache laid out, draw by inverse CDF)": (False, False),
    "the cache concatenated every step (transformers' DynamicLayer)": (True, False),
    "samples version 1's draw (Exp(1) noise over the vocabulary)": (False, True),
}


def stage(backend: TransformersBackend, prompts, arm: str) -> float:
    """Seconds of one sampling stage, the sampler as `STAGES[arm]` says."""
    concatenated, exponential = STAGES[arm]
    laid_out, drawn = hf.preallocate, hf.inverse_cdf
    if concatenated:
        hf.preallocate = concatenating
    if exponential:  # no row leaves the batch (stop tokens ignored): a block per prompt
        generators = [torch.Generator().manual_seed(i) for i in range(PROMPTS)]
        hf.inverse_cdf = lambda probs, uniforms: exponential_draw(probs, generators)
    try:
        params = SamplingParams(k=K, max_new_tokens=NEW_TOKENS, seed=0)
        return seconds_of(lambda: backend.generate(prompts, params, no_progress))
    finally:
        hf.preallocate, hf.inverse_cdf = laid_out, drawn


def exponential_draw(probs: torch.Tensor, generators) -> torch.Tensor:
    """Samples version 1's draw: each prompt's (K, vocabulary) block of Exp(1) noise from its
    generator, the token argmax(p / q)."""
    noise = torch.empty_like(probs)
    for block, generator in zip(noise.split(K), generators, strict=True):
        block.exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def draw_ms(vocabulary: int, rounds: int) -> dict[str, float]:
    """ms of one step's draw for the stage's rows, each way, best of rounds + 3."""
    probs = torch.softmax(torch.randn(PROMPTS * K, vocabulary), dim=-1)
    generators = [torch.Generator().manual_seed(i) for i in range(PROMPTS)]
    uniforms = hf.step_uniforms(generators, K, 1)[0]
    ways = {
        "version 1: Exp(1) noise over the vocabulary, argmax(p / q)": (
            lambda: exponential_draw(probs, generators)
        ),
        "version 2: one uniform a row, running sums (inverse_cdf)": (
            lambda: inverse_cdf(probs, uniforms)
        ),
    }
    return {
        name: 1000 * min(seconds_of(way) for _ in range(rounds + 3)) for name, way in ways.items()
    }


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    add_real_model_arguments(parser, rounds=2)
    args = parser.parse_args()
    checkpoint = converted_checkpoint(args.models)
    if checkpoint is None:
        return
    backend = TransformersBackend.from_checkpoint(checkpoint, LoadSettings(device="cpu"))
    backend.stop_ids = ()  # every row decodes to the limit: the same work each run
    parameters = sum(p.numel() for p in backend.model.parameters())
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 49000) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
    matmul = matmul_gflops()
    now = next(iter(STAGES))
    stage(backend, prompts, now)  # every weight paged in
    shares = profiled_shares(lambda: stage(backend, prompts, now), KINDS)
    runs = alternating(lambda arm: stage(backend, prompts, arm), args.rounds, arms=list(STAGES))
    medians = {arm: statistics.median(seconds) for arm, seconds in runs.items()}
    draws = draw_ms(backend.model.config.vocab_size, args.rounds)
    tokens = PROMPTS * K * NEW_TOKENS

    def rate(seconds: float) -> str:
        cells = rate_cells(parameters, tokens, seconds, matmul)
        return f"{seconds:.1f} | {tokens / seconds:.0f} | {cells}"

    lines = [
        HEADING,
        "",
        f"`python bench/cpu_sampling.py` ({datetime.date.today()}, {machine('cpu')}): "
        f"SmolLM2-135M-Instruct (float32, bench/real_model.py's checkpoint); {PROMPTS} random "
        f"prompts of {PROMPT_TOKENS} tokens x K = {K}, {NEW_TOKENS} new tokens each (stop "
        f"tokens ignored), the {PROMPTS * K} rows decoded together. This machine's fp32 "
        f"matmul rate in the same run: **{matmul:.0f} GFLOP/s**. No GPU was lent to the "
        "session that wrote this (issue 57, item 7 asks for a GPU's profile).",
        "",
        "One `torch.profiler` trace of the stage as the sampler runs it now (the cache laid "
        "out for decoding, the inverse-CDF draw), self time by kind:",
        "",
        "| kind of work | share of the stage |",
        "|---|---|",
        *(f"| {kind} | {share:.1%} |" for kind, share in shares.items()),
        "",
        f"The whole stage, the three ways alternating, medians of {args.rounds}:",
        "",
        "| sampler | seconds | tokens/s | GFLOP/s | of matmul | its time / now's |",
        "|---|---|---|---|---|---|",
        *(
            f"| {arm} | {rate(seconds)} | {seconds / medians[now]:.2f} |"
            for arm, seconds in medians.items()
        ),
        "",
        f"One step's draw for the {PROMPTS * K} rows over the "
        f"{backend.model.config.vocab_size:,}-token vocabulary, best of {args.rounds + 3}: "
        + "; ".join(f"{name} {ms:.1f} ms" for name, ms in draws.items())
        + ".",
    ]
    publish(HEADING, "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
