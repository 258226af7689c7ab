"""Where the CPU's scoring time goes (issue 57: "profile first"), on the real pretrained model
of bench/real_model.py (SmolLM2-135M-Instruct, float32), measured in one run:

1. one `torch.profiler` trace of a scoring call, its self time by kind of work;
2. the whole call's rate (GFLOP/s at 2 FLOPs per parameter and token, and its share of this
   machine's fp32 matmul rate) with the LM head's tiles as first chosen (1024 x 16,384) and
   as measured here (`logit_head.TILES["cpu"]`), alternating;
3. the head alone: torch.logsumexp against the in-place one (`logit_head.logsumexp_`), at
   both tile sizes;
4. attention at the model's shape: the key/value heads repeated per query head (what
   transformers' SDPA path does with a mask) against SDPA's grouped-query mode;
5. with --compile, `torch.compile` of the decoder: its compile time and the compiled call
   against the eager one.

The traces are random tokens (a scoring call's cost does not depend on which tokens): each
of CONTEXTS contexts of 60 tokens is scored with 64 traces of 62, the rows per context of a
scan at N = 16 x K = 4 (bench/real_model.py's shape). Where the model is not installed it
says so in one line and ends (`make bench-real` installs it).

    python bench/cpu_profile.py [--compile] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import random
import statistics

import torch
from bench_scoring import alternating, machine, publish, timed
from real_model import (
    add_real_model_arguments,
    converted_checkpoint,
    matmul_gflops,
    rate_cells,
    seconds_of,
)

from collapsecheck.engines.backends import logit_head
from collapsecheck.engines.backends.base import ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.settings import LoadSettings

HEADING = "## Where the CPU's scoring time goes"
CONTEXTS, TRACES, CONTEXT_TOKENS, TRACE_TOKENS = 4, 64, 60, 62
FIRST_TILES = (1024, 16384)
KINDS = {  # profiler op -> kind of work (the rest: other)
    "matmul (linear layers, LM head)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention (SDPA)": ("attention",),
    "log-sum-exp passes over the vocabulary": (
        "aten::exp", "aten::amax", "aten::sub", "aten::log", "aten::logsumexp",
        "aten::logaddexp", "aten::sum",
    ),
    "element-wise (norms, rotary, activations)": (
        "aten::mul", "aten::add", "aten::silu", "aten::pow", "aten::mean", "aten::rsqrt",
        "aten::neg", "aten::div", "aten::where",
    ),
    "copies, concatenation, indexing": (
        "aten::copy_", "aten::cat", "aten::index", "aten::_to_copy", "aten::gather",
        "aten::clone", "aten::fill_", "aten::zero_",
    ),
}  # fmt: skip


def random_requests() -> list[ScoreRequest]:
    rng = random.Random(0)
    contexts = [
        tuple(rng.randrange(10, 49000) for _ in range(CONTEXT_TOKENS)) for _ in range(CONTEXTS)
    ]
    traces = [tuple(rng.randrange(10, 49000) for _ in range(TRACE_TOKENS)) for _ in range(TRACES)]
    return [ScoreRequest(c, z) for c in contexts for z in traces]


def kind_of(name: str, kinds: dict[str, tuple[str, ...]]) -> str:
    """An op's kind: `aten::exp` and `aten::exp_` are one op; "attention" is any SDPA kernel."""
    for kind, ops in kinds.items():
        if any(name in (op, op + "_") or (op == "attention" and op in name) for op in ops):
            return kind
    return "other"


def profiled_shares(work, kinds: dict[str, tuple[str, ...]] = KINDS) -> dict[str, float]:
    """Each kind of work's share of the self CPU time of one call of `work`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        work()
    totals: dict[str, float] = {}
    for event in trace.key_averages():
        kind = kind_of(event.key, kinds)
        totals[kind] = totals.get(kind, 0.0) + event.self_cpu_time_total
    whole = sum(totals.values())
    return {kind: value / whole for kind, value in sorted(totals.items(), key=lambda kv: -kv[1])}


def with_torch_logsumexp(head: logit_head.LogitHead, hidden: torch.Tensor) -> None:
    """The head's log-sum-exp as first written: torch.logsumexp on each tile (a new tensor
    per pass)."""
    tokens, vocabulary = head.tiles
    for start in range(0, hidden.shape[0], tokens):
        states = hidden[start : start + tokens]
        lse = torch.full((states.shape[0],), -torch.inf)
        for first in range(0, head.weight.shape[0], vocabulary):
            tile = torch.nn.functional.linear(states, head.weight[first : first + vocabulary])
            lse = torch.logaddexp(lse, torch.logsumexp(tile, dim=-1))


def head_rates(model, rounds: int) -> list[tuple[str, tuple[int, int], float]]:
    """GFLOP/s of the LM head alone on 4,096 hidden states, each variant and tile size."""
    weight = model.get_output_embeddings().weight
    hidden = torch.randn(4096, weight.shape[1]) / weight.shape[1] ** 0.5
    targets = torch.randint(0, weight.shape[0], (4096,))
    flops = 2 * hidden.shape[0] * weight.numel()
    rows = []
    for tiles in (FIRST_TILES, logit_head.TILES["cpu"]):
        head = logit_head.LogitHead(weight, tiles)
        for name, run in (
            ("torch.logsumexp", functools.partial(with_torch_logsumexp, head, hidden)),
            ("in place (logsumexp_)", functools.partial(head.logprobs, hidden, targets)),
        ):
            best = min(seconds_of(run) for _ in range(rounds + 1))
            rows.append((name, tiles, flops / best / 1e9))
    return rows


def attention_ms(config, rounds: int) -> dict[str, float]:
    """One layer's masked attention over 64 rows at the model's head shape, in ms."""
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    keys = CONTEXT_TOKENS + TRACE_TOKENS
    query = torch.randn(TRACES, heads, TRACE_TOKENS, dim)
    key, value = (torch.randn(TRACES, groups, keys, dim) for _ in range(2))
    mask = torch.zeros(TRACES, 1, TRACE_TOKENS, keys)
    mask[..., CONTEXT_TOKENS:] = torch.full((TRACE_TOKENS,) * 2, -1e30).triu(1)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def repeated():
        def repeat(t):
            return t.repeat_interleave(heads // groups, dim=1)

        return sdpa(query, repeat(key), repeat(value), attn_mask=mask)

    def grouped():
        return sdpa(query, key, value, attn_mask=mask, enable_gqa=True)

    assert torch.allclose(repeated(), grouped(), atol=1e-5)
    return {
        name: 1000 * min(seconds_of(run) for _ in range(rounds + 3))
        for name, run in (("repeated per query head", repeated), ("grouped-query mode", grouped))
    }


def compiled(backend: TransformersBackend, requests: list[ScoreRequest], rounds: int) -> dict:
    """Compile time (the first call's seconds) and eager against compiled calls."""
    eager = backend.model.model.forward
    fast = torch.compile(eager, dynamic=True)
    first = _timed_with(backend, fast, requests)
    runs = alternating(lambda on: _timed_with(backend, fast if on else eager, requests), rounds)
    backend.model.model.forward = eager
    return {
        "first": first,
        "eager": statistics.median(runs[False]),
        "compiled": statistics.median(runs[True]),
    }


def _timed_with(backend, forward, requests) -> float:
    backend.model.model.forward = forward
    return timed(backend, requests)[1]


@torch.inference_mode()  # as the scorer runs: the weights are parameters
def main() -> None:
    parser = argparse.ArgumentParser()
    add_real_model_arguments(parser, rounds=2)
    parser.add_argument("--compile", action="store_true", help="measure torch.compile too")
    args = parser.parse_args()
    checkpoint = converted_checkpoint(args.models)
    if checkpoint is None:
        return
    backend = TransformersBackend.from_checkpoint(checkpoint, LoadSettings(device="cpu"))
    parameters = sum(p.numel() for p in backend.model.parameters())
    requests = random_requests()
    tokens = len(requests) * TRACE_TOKENS
    matmul = matmul_gflops()
    backend.loglikelihood(requests[:TRACES], no_progress)  # every weight paged in
    shares = profiled_shares(lambda: backend.loglikelihood(requests, no_progress))
    measured_tiles = backend.head.tiles

    def run(measured: bool) -> float:
        tiles = measured_tiles if measured else FIRST_TILES
        backend.head = logit_head.LogitHead(backend.head.weight, tiles)
        return timed(backend, requests)[1]

    calls = alternating(run, args.rounds)
    heads = head_rates(backend.model, args.rounds)
    attention = attention_ms(backend.model.config, args.rounds)
    compile_run = compiled(backend, requests, args.rounds) if args.compile else None

    def rate(seconds: float) -> str:
        return f"{seconds:.1f} | {rate_cells(parameters, tokens, seconds, matmul)}"

    lines = [
        HEADING,
        "",
        f"`python bench/cpu_profile.py{' --compile' if args.compile else ''}` "
        f"({datetime.date.today()}, {machine('cpu')}): SmolLM2-135M-Instruct (float32, "
        f"bench/real_model.py's checkpoint); {CONTEXTS} contexts of {CONTEXT_TOKENS} tokens, "
        f"each scored with {TRACES} traces of {TRACE_TOKENS} ({tokens:,} tokens), the cached "
        f"scorer at `--batch-tokens auto`. This machine's fp32 matmul rate in the same run: "
        f"**{matmul:.0f} GFLOP/s**. No GPU was lent to the session that wrote this: the "
        "profile issue 57 asks for first is a GPU's, and this one says where a CPU's time "
        "goes.",
        "",
        "One `torch.profiler` trace of the call (the measured tiles), self time by kind:",
        "",
        "| kind of work | share of the call |",
        "|---|---|",
        *(f"| {kind} | {share:.1%} |" for kind, share in shares.items()),
        "",
        f"The whole call, the head's tiles as first chosen and as measured here, alternating, "
        f"medians of {args.rounds}:",
        "",
        "| LM head tiles (tokens x vocabulary) | seconds | GFLOP/s | of matmul |",
        "|---|---|---|---|",
        f"| {FIRST_TILES[0]} x {FIRST_TILES[1]:,} | {rate(statistics.median(calls[False]))} |",
        f"| {measured_tiles[0]} x {measured_tiles[1]:,} | {rate(statistics.median(calls[True]))} |",
        "",
        "The LM head alone (4,096 hidden states, the model's 49,152 x 576 head), best of "
        f"{args.rounds + 1}:",
        "",
        "| log-sum-exp | tiles | GFLOP/s |",
        "|---|---|---|",
        *(f"| {name} | {t[0]} x {t[1]:,} | {gflops:.0f} |" for name, t, gflops in heads),
        "",
        f"One layer's attention with a mask ({TRACES} rows, {TRACE_TOKENS} queries over "
        f"{CONTEXT_TOKENS + TRACE_TOKENS} keys, "
        f"{backend.model.config.num_attention_heads} query heads over "
        f"{backend.model.config.num_key_value_heads} key/value heads), same values: "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in attention.items())
        + ".",
    ]
    if compile_run:
        lines += [
            "",
            f"`torch.compile(model.model.forward, dynamic=True)`: the first call took "
            f"{compile_run['first']:.0f} s (compiling); then eager {compile_run['eager']:.1f} s "
            f"against compiled {compile_run['compiled']:.1f} s a call "
            f"({compile_run['eager'] / compile_run['compiled']:.2f}x), medians of "
            f"{args.rounds} alternating.",
        ]
    publish(HEADING, "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
