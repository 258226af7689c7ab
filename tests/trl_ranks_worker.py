"""One rank of a 2-process GRPOTrainer run with CollapseCallback (torchrun, gloo on CPU), for
tests/test_trl_callback.py: each rank writes the collapse keys of its log_history and its
last step to OUT/rank-R.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from collapsecheck.integrations.trl import CollapseCallback
from tests.conftest import EXAMPLES, PROMPTS
from tests.test_trl_callback import PROBE, grpo_trainer


def main(out: Path, policy: str, fail_on: str) -> None:
    trainer = grpo_trainer(EXAMPLES / "demo-run" / policy, out / "run", steps=4)
    trainer.add_callback(CollapseCallback(trainer, PROMPTS, every=2, fail_on=fail_on, **PROBE))
    trainer.train()
    keys = [
        {k: v for k, v in e.items() if k.startswith("collapse/") or k == "step"}
        for e in trainer.state.log_history
        if "collapse/mi_estimate" in e
    ]
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    record = {"world": world, "step": trainer.state.global_step, "logged": keys}
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():  # a gloo group left to interpreter shutdown may abort the process
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
