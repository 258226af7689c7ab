"""Write the veRL test checkpoints with veRL's own code (`make verl-fixtures`). Tests never run
this; they read what it wrote, shipped in tests/fixtures/verl-0.9.1/.

Runs in an environment with veRL 0.9.1 (the Makefile makes one). Each case is veRL's FSDP2
engine under `torchrun` with gloo on CPU (a CPU platform registered through veRL's platform
plugin hook, scripts/verl/cpu_platform.py), one optimizer step from a tiny base model, then
veRL's FSDPCheckpointManager writing `global_step_1/actor/`; then veRL's own merger
(`python -m verl.model_merger merge --backend fsdp`) writes the reference HF folder:

- fsdp2: 2 ranks, every rank one shard (with optimizer and extra state, as veRL saves them);
- hsdp: 4 ranks, fsdp_size 2: a 2x2 mesh, placements (Replicate(), Shard(0));
- lora: 2 ranks, LoRA rank 4 (PEFT-wrapped keys, lora_train_meta.json);
- lora-only: the same with save_lora_only (the shards hold only the LoRA tensors). veRL's
  merger writes the adapter to lora_adapter/ and then refuses its own output for lacking base
  weights; the adapter it wrote is kept as the reference.

Also a training log by veRL's own file logger (`Tracking(default_backend=["file"])`), with
numpy values and a NaN, which veRL's JSON writer turns into null.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from make_fixtures import build_model, build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "verl-0.9.1"
HERE = Path(__file__).resolve().parent / "verl"
# (case, ranks, fsdp_size, LoRA rank, save_lora_only, what to save)
CASES = [
    ("fsdp2", 2, -1, 0, 0, "model,optimizer,extra"),
    ("hsdp", 4, 2, 0, 0, "model,extra"),
    ("lora", 2, -1, 4, 0, "model,extra"),
    ("lora-only", 2, -1, 4, 1, "model,extra"),
]


def write_base(directory: Path) -> None:
    """A tiny gridworld-tokenizer Llama, randomly initialised (seeded): the run's base model."""
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, hidden_size=32, intermediate_size=64, layers=2, heads=1, max_positions=256,
        tie_embeddings=False,
    )  # fmt: skip
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


def write_file_log(root: Path) -> None:
    """Ten steps of a veRL run's metrics, written by veRL's file logger."""
    import numpy as np
    from verl.utils.tracking import Tracking

    os.environ["VERL_FILE_LOGGER_ROOT"] = str(root)
    tracking = Tracking(project_name="gridworld", experiment_name="grpo", default_backend=["file"])
    for step in range(1, 11):
        metrics = {
            "critic/score/mean": np.float32(0.3 + step / 20),
            "actor/entropy": 0.5 - step / 100,
            "actor/pg_loss": float("nan") if step == 4 else -0.01 * step,
            "training/global_step": step,
        }
        tracking.log(metrics, step=step)


def verl_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "VERL_USE_EXTERNAL_MODULES": "cpu_platform",
        "VERL_PLATFORM": "cpu",
        "OMP_NUM_THREADS": "1",
    }


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=verl_env())


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    base = OUT / "base"
    write_base(base)
    bin_dir = Path(sys.executable).parent
    for case, ranks, fsdp_size, lora_rank, lora_only, contents in CASES:
        actor = OUT / case / "global_step_1" / "actor"
        run(
            [
                str(bin_dir / "torchrun"),
                f"--nproc_per_node={ranks}",
                str(HERE / "save_actor.py"),
                str(base),
                str(actor),
                str(fsdp_size),
                str(lora_rank),
                str(lora_only),
                contents,
            ]
        )
        merger = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
        merged = OUT / case / "merged"
        try:
            run([*merger, "--local_dir", str(actor), "--target_dir", str(merged)])
        except subprocess.CalledProcessError:
            if not lora_only:
                raise
            print(f"{case}: veRL's merger refused its LoRA-only output; lora_adapter/ kept")
    write_file_log(OUT / "file_logger")
    (OUT / "VERSIONS").write_text(
        f"verl {version('verl')}\ntorch {torch.__version__}\n"
        f"transformers {version('transformers')}\npeft {version('peft')}\n"
    )


def version(package: str) -> str:
    from importlib.metadata import version as installed

    return installed(package)


if __name__ == "__main__":
    main()
