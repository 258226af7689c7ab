"""One rank of a veRL actor (run by torchrun): veRL's FSDP2 engine built from a base model,
one optimizer step, then veRL's FSDPCheckpointManager saves the shards. Arguments: base model
folder, output folder, fsdp_size (-1: every rank; smaller: HSDP), LoRA rank (0: none),
save_lora_only (0/1), what to save (comma-separated: model,optimizer,extra)."""

import sys

import torch
import torch.distributed as dist
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine


def main() -> None:
    base, out, fsdp_size, lora_rank, lora_only, contents = sys.argv[1:7]
    dist.init_process_group("gloo")
    model = HFModelConfig(
        path=base,
        override_config={"attn_implementation": "sdpa"},
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        lora_rank=int(lora_rank),
        lora_alpha=2 * int(lora_rank) if int(lora_rank) else 16,
    )
    engine = FSDPEngine(
        model,
        FSDPEngineConfig(strategy="fsdp2", fsdp_size=int(fsdp_size), use_torch_compile=False),
        FSDPOptimizerConfig(lr=1e-2),
        CheckpointConfig(save_contents=contents.split(","), save_lora_only=lora_only == "1"),
    )
    engine.initialize()
    # one step of language-model training, so the saved weights (and LoRA's B) move away
    # from the base
    torch.manual_seed(dist.get_rank())
    ids = torch.randint(5, model.hf_config.vocab_size, (2, 16))
    engine.module.train()
    engine.module(input_ids=ids, labels=ids).loss.backward()
    engine.optimizer.step()
    engine.save_checkpoint(out, global_step=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
