"""Write tests/fixtures/trainer-dumps/areal/rollout/ with AReaL's own code: the batch of
tests/fixtures/trainer-dumps/batch.json goes through AReaL's `WorkflowExecutor` (submit, its
task-id counter, `_execute_workflow`, `_dump_trajectory` with `dump_to_file`), wrapping
`GroupedRolloutWorkflow(RLVRWorkflow, group_size=4)` (the prompt from AReaL's chat-template
call, rewards through `AsyncRewardWrapper`, the tensors built by `RLVRWorkflow.arun_episode`,
padded by `concat_padded_tensors`). Only the inference engine is ours: a stand-in that answers
`agenerate` with the batch's sampled response ids, each tagged with the current version.

Run it outside the collapsecheck venv (AReaL is not a dependency):

    pip download areal==1.0.4 --no-deps -d /tmp/areal-src
    unzip -q /tmp/areal-src/areal-1.0.4-py3-none-any.whl -d /tmp/areal-src/wheel
    python3.11 -m venv /tmp/areal-venv
    /tmp/areal-venv/bin/pip install torch==2.13.0 transformers==5.24.0 requests torchdata \\
        aiofiles aiohttp httpx uvloop pyyaml colorlog orjson einops numpy pillow lark \\
        tenacity openai omegaconf==2.4.0.dev2 hydra-core==1.4.0.dev1
    /tmp/areal-venv/bin/python scripts/make_areal_rollouts.py /tmp/areal-src/wheel /tmp/areal-out

It writes `{out}/logs/{user}/collapsecheck/fixture/rollout/{version}/{task_id}.jsonl` (AReaL's
path) and, with `--install`, copies that `rollout/` to the fixture. Read with areal 1.0.4
(the dump code matches inclusionAI/AReaL 4aef98d but for `RTensor.localize`), torch 2.13.0+cpu,
transformers 5.24.0, Python 3.11.

Stubbed, since the dump path never uses them: the packages `areal` and `areal.infra` are bare
namespace modules, so their `__init__` (controllers, launchers, schedulers) is not run; the
third-party modules ray, numba, swanlab, trackio, wandb and tensorboardX are empty modules
whose attributes are MagicMocks. Logprobs are 0.0 (they are not dumped).

Versions and task ids: groups 0-2 are generated under version 4 and groups 3-5 under
version 5. Two rollout workers, each its own `WorkflowExecutor` whose counter starts at 0:
worker A runs groups 0 and 1 and then restarts (a fresh executor, counter back at 0) and runs
groups 4 and 5; worker B runs groups 2 and 3. So group g has task id g % 2 and the files
0.jsonl hold two prompts each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import types
from pathlib import Path
from unittest import mock

from trainer_sources import BATCH, DUMPS, POLICY, PROMPTS, load_reward

compute_score = load_reward()
FIXTURE = DUMPS / "areal"
STUBBED = ("ray", "numba", "swanlab", "trackio", "wandb", "tensorboardX")
EXPERIMENT, TRIAL = "collapsecheck", "fixture"
# (worker, version) per group; a worker name seen again after "restart" gets a new executor
PLAN = [("A", 4), ("A", 4), ("B", 4), ("B", 5), ("A'", 5), ("A'", 5)]


class _Stub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=f"{self.__name__}.{name}")


def load_areal(source: Path) -> None:
    """Make `areal` importable from an unpacked wheel without running its package inits."""
    for name in STUBBED:
        sys.modules.setdefault(name, _Stub(name))
    for name, path in (("areal", source / "areal"), ("areal.infra", source / "areal" / "infra")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    import areal.infra.workflow_context as workflow_context

    sys.modules["areal"].workflow_context = workflow_context


def grid_reward(prompt, completions, prompt_ids, completion_ids, ground_truth, **kwargs):
    """AReaL's reward signature around the gridworld reward (the completion is decoded with
    special tokens kept, as RLVRWorkflow does)."""
    return compute_score("grid", completions, ground_truth)


class SampledEngine:
    """The inference engine's part that the workflows use: `get_version` and `agenerate`,
    answering each prompt with its sampled responses in order."""

    def __init__(self, groups: list[dict]):
        self.version = 0
        self.pending = {tuple(g["ids"]): list(g["responses"]) for g in groups}

    def get_version(self) -> int:
        return self.version

    async def agenerate(self, req):
        from areal.api.io_struct import ModelResponse

        output = self.pending[tuple(req.input_ids)].pop(0)
        stopped = output[-1] in req.gconfig.stop_token_ids
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=list(output),
            output_logprobs=[0.0] * len(output),
            output_versions=[self.version] * len(output),
            stop_reason="stop" if stopped else "length",
            tokenizer=req.tokenizer,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("areal_source", type=Path, help="the unpacked areal wheel")
    parser.add_argument("out", type=Path, help="AReaL's fileroot, emptied first")
    parser.add_argument("--install", action="store_true", help="copy rollout/ to the fixture")
    args = parser.parse_args()
    load_areal(args.areal_source)

    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.infra.remote_inf_engine import GroupedRolloutWorkflow
    from areal.infra.workflow_executor import WorkflowExecutor
    from areal.utils import logging
    from areal.utils.stats_logger import StatsLogger
    from areal.workflow.rlvr import RLVRWorkflow

    batch = json.loads(BATCH.read_text())
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[: len(batch)]]
    shutil.rmtree(args.out, ignore_errors=True)
    config = InferenceEngineConfig(
        experiment_name=EXPERIMENT,
        trial_name=TRIAL,
        fileroot=str(args.out),
        tokenizer_path=str(POLICY),
        dump_to_file=True,
        consumer_batch_size=1,
        max_head_offpolicyness=100,
    )
    engine = SampledEngine(batch)
    gconfig = GenerationHyperparameters(n_samples=len(batch[0]["responses"]))
    rlvr = RLVRWorkflow(grid_reward, gconfig, str(POLICY))
    workflow = GroupedRolloutWorkflow(rlvr, gconfig.n_samples, logging.getLogger("Grouped"))
    executors: dict[str, WorkflowExecutor] = {}
    try:
        for row, group, (worker, version) in zip(rows, batch, PLAN, strict=True):
            if worker not in executors:
                executors[worker] = WorkflowExecutor(config, engine)
                executors[worker].initialize(train_data_parallel_size=1)
            engine.version = version
            executor = executors[worker]
            executor.submit(row, workflow)
            (traj,) = executor.wait(1, timeout=120)
            seqs = [
                ids[mask.bool()].tolist()
                for ids, mask in zip(traj["input_ids"], traj["attention_mask"], strict=True)
            ]
            assert seqs == [group["ids"] + r for r in group["responses"]], "ids differ"
    finally:
        for executor in executors.values():
            executor.destroy()
    log_path = StatsLogger.get_log_path(
        experiment_name=EXPERIMENT, trial_name=TRIAL, fileroot=str(args.out)
    )
    rollout = Path(log_path) / "rollout"
    print(f"wrote {rollout}")
    if args.install:
        shutil.rmtree(FIXTURE, ignore_errors=True)
        shutil.copytree(rollout, FIXTURE / "rollout")
        print(f"copied to {FIXTURE / 'rollout'}")


if __name__ == "__main__":
    main()
