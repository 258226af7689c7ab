"""Checkpoint formats built from the demo checkpoints: each route gives the plain route's
numbers."""

import argparse
import json
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp

from collapsecheck import scan
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import require_checkpoint
from tests.conftest import HEALTHY, PROMPTS

FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 100}
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja")  # fmt: skip


def demo_state_dict():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(HEALTHY).state_dict()


def save_fsdp_rank(rank, world, port, actor_dir):
    """One rank of a real 2-process gloo group saving its FSDP2 shard as veRL does:
    `model_world_size_{W}_rank_{R}.pt`, a state dict of DTensors sharded along dim 0."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    shard = {
        key: DTensor.from_local(
            torch.tensor_split(tensor, world, dim=0)[rank].clone(), mesh, [Shard(0)],
            run_check=False,
        )
        for key, tensor in demo_state_dict().items()
    }  # fmt: skip
    torch.save(shard, f"{actor_dir}/model_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def save_hsdp_rank(rank, world, port, actor_dir, replicas):
    """One rank of a real 4-process gloo group saving an HSDP shard: a 2-D mesh of
    `replicas` x (world / replicas), placements (Replicate(), Shard(0)), as veRL writes with
    fsdp_size smaller than the world size; a buffer every rank holds whole stays plain."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shards = world // replicas
    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("ddp", "fsdp"))
    local = mesh["fsdp"].get_local_rank()
    state = demo_state_dict()
    shard = {
        key: DTensor.from_local(
            torch.tensor_split(tensor, shards, dim=0)[local].clone(), mesh,
            [Replicate(), Shard(0)], run_check=False,
        )
        for key, tensor in state.items()
        if key != "model.norm.weight"
    }  # fmt: skip
    shard["model.norm.weight"] = state["model.norm.weight"].clone()
    torch.save(shard, f"{actor_dir}/model_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_hf_folder(destination):
    destination.mkdir(parents=True)
    for name in CONFIG_FILES:
        shutil.copy(HEALTHY / name, destination)


@pytest.fixture(scope="module")
def plain_report():
    return scan(HEALTHY, PROMPTS, **FAST)


def same_numbers(report, plain):
    assert report.metrics == plain.metrics
    assert report.verdict == plain.verdict


def test_verl_fsdp_shards_merge_to_the_same_model(tmp_path, plain_report):
    actor = tmp_path / "global_step_40" / "actor"
    make_hf_folder(actor / "huggingface")
    mp.spawn(save_fsdp_rank, args=(2, free_port(), str(actor)), nprocs=2)
    checkpoint = require_checkpoint(tmp_path / "global_step_40")
    assert (checkpoint.kind, checkpoint.path) == ("verl-fsdp", actor)
    same_numbers(scan(tmp_path / "global_step_40", PROMPTS, **FAST), plain_report)


def test_hsdp_shards_read_one_replica(tmp_path, plain_report):
    """(Replicate(), Shard(0)) on a 2 x 2 mesh: the shards of one replica, concatenated; a plain
    tensor every rank holds whole is taken once."""
    actor = tmp_path / "global_step_8" / "actor"
    make_hf_folder(actor / "huggingface")
    mp.spawn(save_hsdp_rank, args=(4, free_port(), str(actor), 2), nprocs=4)
    same_numbers(scan(tmp_path / "global_step_8", PROMPTS, **FAST), plain_report)


def test_shards_that_do_not_fit_the_config_name_what_does_not(tmp_path):
    actor = tmp_path / "actor"
    make_hf_folder(actor / "huggingface")
    state = demo_state_dict()
    state["model.embed_tokens.weight"] = torch.cat([state["model.embed_tokens.weight"]] * 2)
    state["extra.weight"] = torch.zeros(2)
    del state["model.norm.weight"]
    for rank in range(2):
        torch.save(state, actor / f"model_world_size_2_rank_{rank}.pt")
    with pytest.raises(CollapsecheckError) as error:
        scan(actor, PROMPTS, **FAST)
    message = str(error.value)
    assert "1 missing (model.norm.weight)" in message
    assert "1 unexpected (extra.weight)" in message
    assert "1 of another shape (model.embed_tokens.weight" in message


def test_ranks_with_different_plain_tensors_are_refused(tmp_path):
    actor = tmp_path / "actor"
    make_hf_folder(actor / "huggingface")
    state = demo_state_dict()
    for rank in range(2):
        shard = {k: torch.tensor_split(v, 2, dim=0)[rank].clone() for k, v in state.items()}
        torch.save(shard, actor / f"model_world_size_2_rank_{rank}.pt")
    with pytest.raises(CollapsecheckError, match="the ranks hold different plain tensors"):
        scan(actor, PROMPTS, **FAST)


def test_a_merger_lora_folder_is_the_base_with_its_adapter(tmp_path):
    """veRL's model merger, for a LoRA run: base weights in the target folder, the adapter in
    lora_adapter/ with no base named. Read as base + adapter, and said so."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # the adapter's weights: not whatever earlier tests left the RNG at
    base = AutoModelForCausalLM.from_pretrained(HEALTHY)
    adapted = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    target = tmp_path / "merged"
    make_hf_folder(target)
    AutoModelForCausalLM.from_pretrained(HEALTHY).save_pretrained(target)
    adapted.save_pretrained(target / "lora_adapter")
    config_path = target / "lora_adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": None}))
    reference_dir = tmp_path / "reference"
    adapted.merge_and_unload().save_pretrained(reference_dir)
    make_hf_folder_files(reference_dir)
    reference = scan(reference_dir, PROMPTS, **FAST)
    for path in (target, target / "lora_adapter"):
        report = scan(path, PROMPTS, **FAST)
        same_numbers(report, reference)
        assert "read as" in report.settings["checkpoint_note"]


def make_hf_folder_files(destination):
    for name in CONFIG_FILES:
        if name != "config.json":
            shutil.copy(HEALTHY / name, destination)


def test_a_trl_output_dir_with_step_checkpoints_is_a_run(tmp_path):
    """`trainer.save_model(output_dir)` leaves a model in output_dir beside checkpoint-N/."""
    from collapsecheck.inputs.discovery import find_checkpoints

    root = tmp_path / "output"
    shutil.copytree(HEALTHY, root)
    for step in (2, 4):
        shutil.copytree(HEALTHY, root / f"checkpoint-{step}")
    (root / "checkpoint-6").mkdir()  # an interrupted save: no weights
    (root / "trainer_state.json").write_text(json.dumps({"global_step": 5, "log_history": []}))
    notes = []
    single, run = find_checkpoints(root, notes=notes)
    assert single is None
    assert [c.label for c in run] == ["2", "4", "5"]
    assert run[-1].name == "final model"
    assert any("scanned as a run" in n for n in notes)
    assert any("left out" in n and "checkpoint-6" in n for n in notes)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA run's state as veRL's FSDP engine saves it: PEFT-wrapped keys (base_layer,
    lora_A/lora_B) and lora_train_meta.json; and the merged model PEFT itself makes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(HEALTHY), config)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    state = {k: v.clone() for k, v in adapted.state_dict().items()}
    reference = tmp_path_factory.mktemp("lora-merged")
    adapted.merge_and_unload().save_pretrained(reference)
    for name in CONFIG_FILES[1:]:
        shutil.copy(HEALTHY / name, reference)
    return state, scan(reference, PROMPTS, **FAST)


def write_lora_actor(actor, state):
    make_hf_folder(actor / "huggingface")
    (actor / "lora_train_meta.json").write_text(
        '{"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}'
    )
    for rank in range(2):  # every rank holds the whole (small) state: taken once
        torch.save(state, actor / f"model_world_size_2_rank_{rank}.pt")


def test_verl_lora_shards_merge_as_peft_merges(tmp_path, lora_run):
    state, reference = lora_run
    assert any(".base_layer." in k for k in state) and any("lora_A.default" in k for k in state)
    actor = tmp_path / "global_step_3" / "actor"
    write_lora_actor(actor, state)
    report = scan(tmp_path / "global_step_3", PROMPTS, **FAST)
    same_numbers(report, reference)
    assert "alpha/r" in report.settings["checkpoint_note"]


def test_verl_save_lora_only_shards_take_their_base(tmp_path, lora_run):
    state, reference = lora_run
    only = {k: v for k, v in state.items() if "lora_" in k}
    actor = tmp_path / "actor"
    write_lora_actor(actor, only)
    with pytest.raises(CollapsecheckError, match="save_lora_only"):
        scan(actor, PROMPTS, **FAST)
    same_numbers(scan(actor, PROMPTS, base_model=HEALTHY, **FAST), reference)
    config = json.loads((actor / "huggingface" / "config.json").read_text())
    config["_name_or_path"] = str(HEALTHY)  # the config names a local base: found by itself
    (actor / "huggingface" / "config.json").write_text(json.dumps(config))
    same_numbers(scan(actor, PROMPTS, **FAST), reference)


def test_a_pickle_shard_needs_the_flag(tmp_path, plain_report):
    actor = tmp_path / "actor"
    make_hf_folder(actor / "huggingface")
    state = demo_state_dict()
    for rank in range(2):
        shard = {k: v.clone() for k, v in state.items()}  # plain tensors every rank holds whole
        shard["trainer_args"] = argparse.Namespace(lr=1e-6)  # a Python object, not a tensor
        torch.save(shard, actor / f"model_world_size_2_rank_{rank}.pt")
    with pytest.raises(
        CollapsecheckError, match="pass --trust-checkpoint-pickle only if you trust"
    ):
        scan(actor, PROMPTS, **FAST)
    same_numbers(scan(actor, PROMPTS, trust_checkpoint_pickle=True, **FAST), plain_report)


def test_lora_adapter_on_a_demo_base(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(HEALTHY)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    adapted = get_peft_model(base, config)
    with torch.no_grad():  # a trained adapter: small, but not the identity
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    adapted.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(HEALTHY)
    merged = adapted.merge_and_unload()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[key], demo_state_dict()[key])
    merged.save_pretrained(tmp_path / "merged")
    for name in CONFIG_FILES[2:]:
        shutil.copy(HEALTHY / name, tmp_path / "merged")
    reference = scan(tmp_path / "merged", PROMPTS, **FAST)
    assert require_checkpoint(tmp_path / "adapter").kind == "peft"
    same_numbers(scan(tmp_path / "adapter", PROMPTS, **FAST), reference)

    # an adapter whose base is a hub name: it must be given locally
    adapter_config = tmp_path / "adapter" / "adapter_config.json"
    data = json.loads(adapter_config.read_text())
    adapter_config.write_text(json.dumps({**data, "base_model_name_or_path": "org/some-hub-model"}))
    with pytest.raises(
        CollapsecheckError, match="not a local directory; give its path with --base-model"
    ):
        scan(tmp_path / "adapter", PROMPTS, **FAST)
    same_numbers(scan(tmp_path / "adapter", PROMPTS, base_model=HEALTHY, **FAST), reference)


def test_sharded_safetensors_with_an_index(tmp_path, plain_report):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(HEALTHY).save_pretrained(tmp_path, max_shard_size="300KB")
    for name in CONFIG_FILES[2:]:
        shutil.copy(HEALTHY / name, tmp_path)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    same_numbers(scan(tmp_path, PROMPTS, **FAST), plain_report)


def test_an_unknown_directory_says_what_was_found(tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "optimizer.pt").write_bytes(b"x")
    (tmp_path / "odd" / "huggingface").mkdir()
    with pytest.raises(CollapsecheckError, match=r"found: huggingface; expected config.json"):
        require_checkpoint(tmp_path / "odd")
