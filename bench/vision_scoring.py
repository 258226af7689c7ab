"""What images cost the cached scorer (docs/benchmarks.md, "Images in the cached scorer"):
the tiny Qwen2-VL-shaped checkpoint (tests/fixtures/qwen2-vl-tiny) scores N x K random
continuations under every one of N visual-gridworld prompts, once with the prompts' images
and once with each image's tokens replaced by a text token (the same sequence lengths, no
vision tower, no 3D positions), in one run on one machine. Then sampling: K samples of
every prompt, one prompt per prefill (`--sample-batch K`) against all N prompts prefilled and
decoded together (`--sample-batch N*K`), the same traces either way.

    python bench/vision_scoring.py [--prompts 16] [--k 8] [--tokens 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np

from collapsecheck.engines.backends.base import SamplingParams, ScoreRequest
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.prompts import load_prompts, render_prompts
from collapsecheck.progress import no_progress
from collapsecheck.settings import LoadSettings, PromptSettings

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "fixtures" / "qwen2-vl-tiny"
PROMPTS = ROOT / "examples" / "prompts" / "visual-gridworld.jsonl"


def requests(contexts, k: int, tokens: int, vocab: int) -> list[ScoreRequest]:
    rng = np.random.default_rng(0)
    traces = [
        tuple(int(t) for t in rng.integers(6, vocab, size=tokens))
        for _ in contexts
        for _ in range(k)
    ]
    return [ScoreRequest(tuple(c), z) for z in traces for c in contexts]


def best_time(backend, batch: list[ScoreRequest], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        backend.loglikelihood(batch, no_progress)
        times.append(time.perf_counter() - started)
    return min(times)


def sampling_time(checkpoint, prompts, k: int, per_prefill: int, repeats: int) -> float:
    """Best time to sample K traces of every prompt, `per_prefill` prompts at a time."""
    backend = load_backend(checkpoint, LoadSettings(device="cpu", sample_batch=k * per_prefill))
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    params = SamplingParams(k=k, max_new_tokens=24, seed=0)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        backend.generate([r.ids for r in rendered], params, no_progress)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backend = load_backend(require_checkpoint(TINY, None), LoadSettings(device="cpu"))
    prompts = load_prompts(PROMPTS, num_prompts=args.prompts)
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    with_images = [r.ids for r in rendered]
    # each image token replaced by a text token: prompt j also gets its own token, so the
    # prompts stay distinct and the scorer runs each one
    text_only = [tuple(j + 6 if t < 0 else t for t in ids) for j, ids in enumerate(with_images)]
    vocab = len(backend.tokenizer)
    image_s = best_time(backend, requests(with_images, args.k, args.tokens, vocab), args.repeats)
    text_s = best_time(backend, requests(text_only, args.k, args.tokens, vocab), args.repeats)
    pairs = args.prompts * args.k * args.prompts
    machine = platform.processor() or platform.machine()
    length = len(with_images[0])
    print(f"machine: {machine}; {pairs} pairs, prompts of {length} tokens (9 image tokens)")
    print("| N x K | pairs | with images s | text only s | images / text |")
    print("|---|---|---|---|---|")
    print(f"| {args.prompts} x {args.k} | {pairs} | {image_s:.2f} | {text_s:.2f} | "
          f"{image_s / text_s:.2f}x |")  # fmt: skip
    checkpoint = require_checkpoint(TINY, None)
    alone = sampling_time(checkpoint, prompts, args.k, 1, args.repeats)
    together = sampling_time(checkpoint, prompts, args.k, args.prompts, args.repeats)
    print()
    print("| N x K, 24 new tokens | one prompt per prefill s | all together s | speed-up |")
    print("|---|---|---|---|")
    print(f"| {args.prompts} x {args.k} | {alone:.2f} | {together:.2f} | "
          f"{alone / together:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
