"""Checkpoints written by veRL 0.9.1's own code (scripts/make_verl_fixtures.py: its FSDP2
engine and FSDPCheckpointManager under torchrun with gloo, then its model merger), read as
veRL meant: the weights veRL's merger gathers, bit for bit, and the same scan numbers."""

import json

import pytest
import torch

from collapsecheck import scan
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import load_model, require_checkpoint
from collapsecheck.settings import LoadSettings
from tests.conftest import PROMPTS, ROOT

VERL = ROOT / "tests" / "fixtures" / "verl-0.9.1"
BASE = VERL / "base"
TINY = {"k": 2, "num_prompts": 4, "max_new_tokens": 12, "whole_response": True,
        "device": "cpu", "bootstrap": 50}  # fmt: skip


def actor(case: str):
    return VERL / case / "global_step_1" / "actor"


def weights(path, dtype=torch.float32, base_model=None) -> dict[str, torch.Tensor]:
    """The weights collapsecheck reads from a path, as a state dict."""
    checkpoint = require_checkpoint(path, base_model=base_model)
    settings = LoadSettings(base_model=None if base_model is None else str(base_model))
    return load_model(checkpoint, "cpu", dtype, settings).state_dict()


def hf_weights(path, dtype=torch.float32) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).state_dict()


def peft_merged(adapter_dir, base=BASE) -> dict[str, torch.Tensor]:
    """PEFT's own merge of a base and an adapter veRL's merger wrote."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().state_dict()


def largest_difference(ours, reference) -> float:
    assert set(ours) == set(reference)
    return max((ours[k].float() - reference[k].float()).abs().max().item() for k in reference)


def test_the_shards_are_what_veRL_wrote():
    hsdp = torch.load(actor("hsdp") / "model_world_size_4_rank_1.pt", weights_only=False)
    placements = {str(tensor.placements) for tensor in hsdp.values()}
    assert placements == {"(Replicate(), Shard(dim=0))"}
    meta = json.loads((actor("lora") / "lora_train_meta.json").read_text())
    assert meta == {"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}
    lora_only = torch.load(actor("lora-only") / "model_world_size_2_rank_0.pt", weights_only=False)
    assert lora_only and all("lora_" in key for key in lora_only)


@pytest.mark.parametrize("case", ["fsdp2", "hsdp"])
def test_shards_equal_veRLs_merged_output_bit_for_bit(case):
    # veRL's merger writes bfloat16; read in the same dtype, every tensor is identical
    ours = weights(actor(case), torch.bfloat16)
    reference = hf_weights(VERL / case / "merged", torch.bfloat16)
    assert largest_difference(ours, reference) == 0.0
    # and the training step moved the weights: the check compares a trained model
    assert largest_difference(weights(actor(case)), hf_weights(BASE)) > 1e-3


def test_hsdp_scan_numbers_equal_those_of_veRLs_merged_output():
    ours = scan(actor("hsdp"), PROMPTS, dtype="bfloat16", **TINY)
    reference = scan(VERL / "hsdp" / "merged", PROMPTS, dtype="bfloat16", **TINY)
    assert ours.metrics == reference.metrics
    assert ours.verdict.regime == reference.verdict.regime


@pytest.mark.parametrize("case", ["lora", "lora-only"])
def test_lora_shards_merge_as_peft_merges_veRLs_adapter(case):
    base_model = BASE if case == "lora-only" else None
    ours = weights(actor(case), base_model=base_model)
    reference = peft_merged(VERL / case / "merged" / "lora_adapter")
    # veRL's merger stores the adapter in bfloat16: equal up to its rounding of B A
    assert largest_difference(ours, reference) < 2e-4
    assert largest_difference(ours, hf_weights(BASE)) > 1e-3  # the adapter is applied
    assert require_checkpoint(actor(case), base_model=base_model).note is not None


def test_lora_only_shards_without_a_base_name_the_flag():
    with pytest.raises(CollapsecheckError, match="--base-model"):
        weights(actor("lora-only"))


def test_veRLs_merger_lora_folder_reads_base_plus_adapter():
    merged = VERL / "lora" / "merged"
    checkpoint = require_checkpoint(merged)
    assert "lora_adapter" in (checkpoint.note or "")
    # the base there is the one veRL's merger wrote beside the adapter (in bfloat16)
    reference = peft_merged(merged / "lora_adapter", base=merged)
    for path in (merged, merged / "lora_adapter"):  # the adapter folder finds its base above
        assert largest_difference(weights(path), reference) < 1e-6


@pytest.mark.parametrize("layout", ["skyrl", "verl-agent"])
def test_the_same_shards_in_skyrls_and_verl_agents_folders(tmp_path, layout):
    """SkyRL's `global_step_N/policy/` holds veRL's shards with `huggingface/` (its FSDP
    strategy's save_checkpoint); verl-agent's older veRL puts config and tokenizer beside the
    shards, no `huggingface/`. Both read as veRL's merger reads them, bit for bit."""
    import shutil

    if layout == "skyrl":
        folder = tmp_path / "global_step_1"
        shutil.copytree(actor("fsdp2"), folder / "policy")
    else:
        folder = tmp_path / "global_step_1" / "actor"
        shutil.copytree(actor("fsdp2"), folder)
        for file in (folder / "huggingface").iterdir():
            file.rename(folder / file.name)
        (folder / "huggingface").rmdir()
    checkpoint = require_checkpoint(folder)
    assert checkpoint.kind == "verl-fsdp"
    reference = hf_weights(VERL / "fsdp2" / "merged", torch.bfloat16)
    assert largest_difference(weights(folder, torch.bfloat16), reference) == 0.0
