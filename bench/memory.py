"""Memory and precision at a real shape, on CPU (issue 23, item 4).

1. A Qwen2.5-0.5B-shaped model (random initialisation: hidden 896, 24 layers, 14 heads with 2
   key/value heads, intermediate 4864, vocabulary 151936; 494M parameters) scores 1,024-token
   reasoning under 1,024-token prompts with the cached scorer. The process's peak resident
   memory above the loaded model is measured against the activation budget the scorer plans
   for (`auto_batch_tokens`: 2 GiB on CPU).
2. bfloat16 against float32 on a trained demo checkpoint: the same sampled traces (a float32
   scan's dump) re-scored in each dtype with `score`; the largest per-entry difference and
   how far the metrics and verdicts move.

Writes its section of docs/benchmarks.md.

    python bench/memory.py
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np
import psutil
import torch
from bench_scoring import machine, write_section
from transformers import Qwen2Config, Qwen2ForCausalLM

from collapsecheck import scan, score
from collapsecheck.engines.backends.base import ScoreRequest
from collapsecheck.engines.backends.hf import CPU_SCORING_BUDGET, TransformersBackend
from collapsecheck.reports.dump import read_dump
from collapsecheck.settings import LoadSettings

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-run" / "global_step_200"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
MARKER = "## Memory and precision at a real shape"
KEYS = ("normalized_mi", "retrieval_skill", "conditional_entropy_est", "action_state_share",
        "action_reasoning_share", "action_input_share")  # fmt: skip
GIB = 2**30


def qwen_shape(tmp: Path) -> Path:
    config = Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp / "qwen-0.5b-shape")
    return tmp / "qwen-0.5b-shape"


class PeakMemory:
    """The process's highest resident memory while the block runs, polled every 5 ms (the
    process-wide high-water mark cannot be reset, and the model's pages count in it)."""

    def __enter__(self) -> PeakMemory:
        self.process, self.peak, self.running = psutil.Process(), 0, True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *_: object) -> None:
        self.running = False
        self.thread.join()


def memory_rows(tmp: Path, prompts: int, tokens: int) -> list[str]:
    path = qwen_shape(tmp)
    backend = TransformersBackend.from_checkpoint(path, LoadSettings(device="cpu", dtype="float32"))
    params = sum(p.numel() for p in backend.model.parameters())
    rng = np.random.default_rng(0)
    contexts = [tuple(rng.integers(10, 150000, size=tokens).tolist()) for _ in range(prompts)]
    reasoning = [tuple(rng.integers(10, 150000, size=tokens).tolist()) for _ in range(prompts)]
    requests = [ScoreRequest(c, z) for c in contexts for z in reasoning]
    backend.loglikelihood([ScoreRequest(contexts[0][:8], reasoning[0][:8])], lambda _: None)
    loaded = psutil.Process().memory_info().rss  # every weight paged in by that first pass
    started = time.perf_counter()
    with PeakMemory() as memory:
        values = backend.loglikelihood(requests, lambda _: None)
    elapsed = time.perf_counter() - started
    above = memory.peak - loaded
    assert np.isfinite(values).all()
    return [
        f"| Qwen2.5-0.5B shape, random ({params / 1e6:.0f}M) | float32 | {prompts} x {prompts} "
        f"| {tokens} / {tokens} | {backend.batch_tokens:,} | {CPU_SCORING_BUDGET / GIB:.1f} | "
        f"{above / GIB:.2f} | {loaded / GIB:.2f} | {elapsed:.0f} |"
    ]


def metric(report, key) -> float:
    value = report.metrics.get(key)
    return float("nan") if value is None else float(getattr(value, "value", value))


def precision_rows(tmp: Path) -> list[str]:
    dump = tmp / "f32"
    scan(DEMO, PROMPTS, k=8, max_new_tokens=64, device="cpu", dtype="float32", dump=dump)
    reports = {}
    for dtype in ("float32", "bfloat16"):
        reports[dtype] = score(DEMO, dump, device="cpu", dtype=dtype, dump=tmp / dtype)
    f32, bf16 = read_dump(tmp / "float32")[0], read_dump(tmp / "bfloat16")[0]
    per_token = np.nanmax(np.abs(f32.mean - bf16.mean))  # NaN: negatives not drawn
    per_trace = np.nanmax(np.abs(f32.sum - bf16.sum))
    wide, narrow = reports["float32"], reports["bfloat16"]
    diffs = " | ".join(
        f"{metric(wide, k):.3f} / {metric(narrow, k) - metric(wide, k):+.3f}" for k in KEYS
    )
    return [
        f"| {DEMO.relative_to(ROOT)} | {per_trace:.3f} | {per_token:.4f} | {diffs} | "
        f"{wide.verdict.regime} / {narrow.verdict.regime} | "
        f"{wide.flow.regime} / {narrow.flow.regime} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as scratch:
        precision = precision_rows(Path(scratch))
        memory = memory_rows(Path(scratch), args.prompts, args.tokens)
    lines = [
        MARKER,
        "",
        f"`python bench/memory.py` ({date.today()}, {machine('cpu')}).",
        "",
        "**Peak memory.** The cached scorer on every (prompt, reasoning) pair; peak resident "
        "memory of the process above the loaded model, against the activation budget "
        "`--batch-tokens auto` plans for on CPU.",
        "",
        "| model | dtype | prompts x reasoning | prompt / reasoning tokens | batch tokens (auto) "
        "| budget GiB | peak above model GiB | model loaded GiB | scoring s |",
        "|---|---|---|---|---|---|---|---|---|",
        *memory,
        "",
        "**bfloat16 against float32.** The same traces (one float32 scan of all 32 gridworld "
        "prompts, K = 8, default sampled negatives) "
        "re-scored in each dtype; log-softmax in float32 on every path (`token_logprobs`). "
        "Each metric cell: float32 value / bfloat16 minus float32.",
        "",
        "| checkpoint | max diff per trace (nats) | max diff per token | "
        + " | ".join(KEYS)
        + " | verdict f32 / bf16 | flow f32 / bf16 |",
        "|---|---|---|" + "---|" * len(KEYS) + "---|---|",
        *precision,
    ]
    write_section(MARKER, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
