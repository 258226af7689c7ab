"""Scan a tiny random checkpoint of each causal-LM type the installed transformers knows, and
say which ones the scan fails on (docs/decisions.md, "Policies whose layers carry a state").
Run it after upgrading transformers: a new kind of layer or cache shows up here first.

Each type gets a small config (hidden size 64, four layers: a hybrid's three of linear
attention, then one of full attention; a type whose config keeps a part at full size, over
MAX_PARAMETERS, is skipped), the demo tokenizer, and `collapsecheck scan` on four gridworld
prompts x K = 2, 12 tokens, the whole response as the reasoning. A type whose own forward or
`generate` fails on that config is skipped (the config, not collapsecheck, is at fault); a
scan refused in one line (exit 2: an encoder such as BERT) is listed as such, and any other
failure of the scan as failed.
Random weights make every verdict template_collapse or near it: only the exit code counts.

    python scripts/architecture_sweep.py [TYPE ...]     # default: every causal-LM type
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "examples" / "checkpoints" / "grounded-compressed"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
SHAPE = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4,
    "max_position_embeddings": 512, "vocab_size": 57, "pad_token_id": 0, "eos_token_id": 1,
}  # fmt: skip
MAX_PARAMETERS = 50_000_000  # a type whose config kept a part at full size is skipped
SCAN = ["-n", "4", "-k", "2", "--max-new-tokens", "12", "--whole-response", "--fail-on", "none"]


def tiny_config(model_type: str):
    """A small config of `model_type`; multimodal ones get their text part made small."""
    default = AutoConfig.for_model(model_type)
    shape = dict(SHAPE)
    kinds = getattr(default.get_text_config(), "layer_types", None)
    if kinds and {"linear_attention", "full_attention"} <= set(kinds):  # a hybrid
        shape["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    if default.get_text_config() is not default:
        return AutoConfig.for_model(model_type, text_config=shape)
    return AutoConfig.for_model(model_type, **shape)


def runs_on_its_own(model) -> bool:
    """Whether the model's own forward and `generate` run on a padded batch."""
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 7, 8, 9]])
    mask = (ids != 0).long()
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
            model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=4)
    except Exception:  # any failure of its own: the config is not valid for it
        return False
    return True


def checkpoint_of(model_type: str, folder: Path) -> Path | None:
    """A saved tiny checkpoint of `model_type` with the demo tokenizer, None if the type
    cannot be made small or does not run on its own."""
    try:
        config = tiny_config(model_type)
        with torch.device("meta"):  # its size first: a part this script did not shrink
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            return None
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    except Exception:  # a config this script cannot shrink: skipped, and listed
        return None
    if not runs_on_its_own(model):
        return None
    path = folder / model_type
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, path / name)
    return path


def scan(path: Path) -> tuple[int, str]:
    """The scan's exit code and its last line."""
    command = [sys.executable, "-m", "collapsecheck", "scan", str(path), "-p", str(PROMPTS)]
    done = subprocess.run(command + SCAN, capture_output=True, text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("types", nargs="*", help="model types (default: every causal LM)")
    types = parser.parse_args().types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    warnings.filterwarnings("ignore")
    failed, refused, skipped = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for model_type in types:
            path = checkpoint_of(model_type, Path(scratch))
            if path is None:
                skipped.append(model_type)
                continue
            code, last = scan(path)
            print(f"{model_type}: exit {code}", flush=True)
            if code == 2:  # one clear line: the model is not one collapsecheck reads
                refused.append(f"{model_type}: {last}")
            elif code not in (0, 1):
                failed.append(f"{model_type}: {last}")
            shutil.rmtree(path)
    print(f"skipped (the config could not be made small, or fails on its own): {skipped}")
    print("refused in one line (exit 2):", *refused, sep="\n")
    print("failed:" if failed else "no scan failed", *failed, sep="\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
