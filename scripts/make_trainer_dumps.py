"""Write the rollout dumps of trainers that do not install here, for
tests/fixtures/trainer-dumps/ (`make trainer-dumps`): each file is what that trainer's own
writer makes of one batch, following its source line by line (file and commit named at each
writer; docs/formats.md says what each holds). slime's, AReaL's, ROLL's, prime-rl's and
SkyRL's training batches are written by their own code instead (scripts/make_slime_rollouts.py,
scripts/make_areal_rollouts.py, scripts/make_roll_dumps.py, scripts/make_prime_rl_traces.py
with verifiers' classes, scripts/make_skyrl_batches.py), from the batch.json this script
writes.

The batch is real: the gridworld prompts rendered with the demo policy's chat template
(examples/demo-run/global_step_100), K responses each sampled from that policy, scored with
the gridworld reward. Every trainer's dump holds the same sampled ids, written its own way,
so a test can score each and check it against a plain forward pass of the same ids.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "rewards"))
from gridworld import compute_score  # noqa: E402

from collapsecheck.engines.backends.base import SamplingParams, no_progress  # noqa: E402
from collapsecheck.engines.backends.registry import load_backend  # noqa: E402
from collapsecheck.inputs.checkpoint import require_checkpoint  # noqa: E402
from collapsecheck.inputs.prompts import load_prompts, render_prompts  # noqa: E402
from collapsecheck.settings import LoadSettings, PromptSettings  # noqa: E402

POLICY = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
OUT = ROOT / "tests" / "fixtures" / "trainer-dumps"
N, K, NEW_TOKENS, SEED = 6, 4, 48, 7


@dataclass
class Response:
    ids: list[int]  # as sampled, the stop token included when it stopped
    text: str  # decoded with special tokens kept
    stopped: bool
    reward: float


@dataclass
class Group:
    messages: list[dict]
    text: str  # the prompt rendered by the chat template
    ids: list[int]
    ground_truth: str
    responses: list[Response]


def sample_batch() -> tuple[list[Group], object]:
    backend = load_backend(require_checkpoint(POLICY), LoadSettings(device="cpu"))
    prompts = load_prompts(PROMPTS, num_prompts=N)
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings())
    params = SamplingParams(k=K, max_new_tokens=NEW_TOKENS, seed=SEED)
    drawn = backend.generate([r.ids for r in rendered], params, no_progress)
    stop = backend.stop_ids[0]
    groups = []
    for prompt, render, samples in zip(prompts, rendered, drawn, strict=True):
        responses = []
        for sample in samples:
            ids = list(sample.ids) + ([] if sample.truncated else [stop])
            text = backend.tokenizer.decode(ids, skip_special_tokens=False)
            truth = prompt.row["ground_truth"]
            responses.append(
                Response(ids, text, not sample.truncated, compute_score("grid", text, truth))
            )
        groups.append(
            Group(
                prompt.content, render.text, list(render.ids), prompt.row["ground_truth"], responses
            )
        )
    return groups, backend.tokenizer


# -- SkyRL: NovaSky-AI/SkyRL a956457, skyrl/train/utils/trainer_utils.py
#    dump_per_dataset_eval_results, called by skyrl/train/evaluate.py::evaluate ---------------


def write_skyrl_evals(groups: list[Group], tokenizer, folder: Path) -> None:
    """`{export_path}/dumped_evals/global_step_2_evals/`: one file per data source (the
    source's '/' made '_'), a line per sample, a prompt's samples consecutive; the agent loop's
    per-token score list for the second source; the metrics in aggregated_results.jsonl."""
    out = folder / "dumped_evals" / "global_step_2_evals"
    out.mkdir(parents=True)
    sources = {"gridworld/near": groups[:3], "gridworld/far": groups[3:]}
    for source, members in sources.items():
        lines = []
        for group in members:
            for response in group.responses:
                per_token = [0.0] * (len(response.ids) - 1) + [response.reward]
                entry = {
                    "input_prompt": tokenizer.decode(group.ids),
                    "output_response": tokenizer.decode(response.ids),
                    "score": per_token if source.endswith("far") else response.reward,
                    "stop_reason": "stop" if response.stopped else "length",
                    "env_class": "gridworld",
                    "env_extras": {
                        "data_source": source,
                        "reward_spec": {"ground_truth": group.ground_truth},
                    },
                    "data_source": source,
                }
                lines.append(json.dumps(entry, ensure_ascii=False) + "\n")
        (out / f"{source.replace('/', '_')}.jsonl").write_text("".join(lines), encoding="utf-8")
    mean = sum(r.reward for g in groups for r in g.responses) / sum(
        len(g.responses) for g in groups
    )
    (out / "aggregated_results.jsonl").write_text(json.dumps({"eval/all/avg_score": mean}) + "\n")


# -- RAGEN: mll-lab-nu/RAGEN 20daedc, ragen/llm_agent/agent_proxy.py _save_as_jsonl -----------


def write_ragen(groups: list[Group], tokenizer, folder: Path) -> None:
    """`results/eval/val_rollouts_{timestamp}.jsonl` (output.format=jsonl): a line per
    trajectory, two per group (the group's environments), two turns each: the state as a user
    message ("(reward: r)" after the first), the raw response as the assistant's."""
    folder.mkdir(parents=True)
    lines = []
    for g, group in enumerate(groups):
        for j in range(2):
            first, second = group.responses[2 * j], group.responses[2 * j + 1]
            after = groups[(g + 1) % len(groups)].messages[-1]["content"]
            messages = [
                {"role": "user", "content": group.messages[-1]["content"]},
                {"role": "assistant", "content": response_text(first, tokenizer)},
                {"role": "user", "content": f"{after} (reward: {first.reward})"},
                {"role": "assistant", "content": response_text(second, tokenizer)},
                {"role": "user", "content": group.messages[-1]["content"]},
            ]
            metadata = {
                "env_id": 2 * g + j, "group_id": g, "num_turns": 2,
                "total_reward": first.reward + second.reward, "success": False,
                "GridWorld/success": float(second.reward > 0), "GridWorld/num_actions": 2,
            }  # fmt: skip
            row = {"custom_id": f"traj_{2 * g + j}", "messages": messages, "metadata": metadata}
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    (folder / "val_rollouts_20261125_101500.jsonl").write_text("".join(lines), encoding="utf-8")


def response_text(response: Response, tokenizer) -> str:
    """The generation decoded without special tokens (the stop token is not in RAGEN's text)."""
    return tokenizer.decode(response.ids, skip_special_tokens=True)


# -- verl-agent: langfengQ/verl-agent 796ed31, verl/trainer/ppo/ray_trainer.py
#    _dump_generations (the older veRL writer: no gts) ----------------------------------------


def write_verl_agent(groups: list[Group], tokenizer, folder: Path) -> None:
    """`{rollout_data_dir}/3.jsonl`: a row per environment step of each trajectory, its input
    the step's prompt (a user message: the observation, the history summarised inside it)
    rendered and decoded with special tokens skipped, its score the episode's return; one row
    copied at the end, as adjust_batch pads the batch."""
    folder.mkdir(parents=True)
    rows = []
    for group in groups:
        for j in range(2):
            first, second = group.responses[2 * j], group.responses[2 * j + 1]
            state = group.messages[-1]["content"]
            # verl-agent's history text, lower-cased: the demo tokenizer has no capitals
            after = f"prior to this step: observation 1: '{state}', action 1: 'move'. {state}"
            episode = first.reward + second.reward
            for observation, response in ((state, first), (after, second)):
                chat = [{"role": "user", "content": observation}]
                text = tokenizer.apply_chat_template(
                    chat, add_generation_prompt=True, tokenize=False
                )
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                rows.append({
                    "input": tokenizer.decode(ids, skip_special_tokens=True),
                    "output": tokenizer.decode(response.ids, skip_special_tokens=True),
                    "score": episode, "step": 3,
                })  # fmt: skip
    rows.append(rows[5])
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (folder / "3.jsonl").write_text(text, encoding="utf-8")


# -- AReaL before v0.5.2 (its JSONL dumps: scripts/make_areal_rollouts.py, by AReaL's code) --


def write_areal_text(groups: list[Group], tokenizer, folder: Path) -> None:
    """AReaL v0.5.1 (areal/workflow/rlvr.py arun_episode, dump_dir = the log folder's
    `generated/`): `generated/{version}/{qid}.txt`, a colored three-part record per sample,
    appended; version 2, the question's `id` as qid."""
    out = folder / "generated" / "2"
    out.mkdir(parents=True)
    yellow_dim, reset = "\x1b[33m" + "\x1b[2m", "\x1b[0m"  # colorama Fore.YELLOW + Style.DIM
    for g, group in enumerate(groups):
        prompt = tokenizer.decode(group.ids)
        with open(out / f"grid-{g}.txt", "a") as stream:
            for i, response in enumerate(group.responses):
                info = "\n".join([
                    f"idx: {i + 1} / {K}, seqlen: {len(group.ids) + len(response.ids)}, "
                    f"reward is {response.reward}.",
                    f"prompt is \n{yellow_dim}{prompt}{reset}",
                    f"sequence is: \n{yellow_dim}{tokenizer.decode(response.ids)}{reset}",
                ])  # fmt: skip
                stream.write(info + "\n")


# -- a vision run's batch, for slime's vision dump (scripts/make_slime_rollouts.py) ----------

VISION_POLICY = ROOT / "examples" / "checkpoints" / "vision" / "grounded"
VISION_PROMPTS = ROOT / "examples" / "prompts" / "visual-gridworld.jsonl"
VISION_SCAN = {"num_prompts": 4, "k": 2, "max_new_tokens": 24, "device": "cpu", "bootstrap": 50}


def write_vision_batch(out: Path) -> None:
    """A scan of the vision demo policy (VISION_SCAN), its prompts' ids with each image's
    tokens as the processor expands them (the image token, not the scan's slot), the images'
    files and the sampled ids: what a trainer's vision rollout holds."""
    import tempfile

    import collapsecheck

    config = json.loads((VISION_POLICY / "config.json").read_text())
    with tempfile.TemporaryDirectory() as dump:
        collapsecheck.scan(VISION_POLICY, VISION_PROMPTS, dump=dump, **VISION_SCAN)
        prompts = [
            json.loads(line) for line in Path(dump, "prompts.jsonl").read_text().splitlines()
        ]
        traces = [json.loads(line) for line in Path(dump, "traces.jsonl").read_text().splitlines()]
    stop = json.loads((VISION_POLICY / "generation_config.json").read_text())["eos_token_id"]
    stop = stop[0] if isinstance(stop, list) else stop
    batch = [{
        "ids": [config["image_token_id"] if t < 0 else t for t in prompt["ids"]],
        "images": [str(Path(i["source"]).resolve().relative_to(ROOT)) for i in prompt["images"]],
        "responses": [t["response_ids"] + ([] if t["truncated"] else [stop])
                      for t in traces if t["prompt_index"] == prompt["index"]],
    } for prompt in prompts]  # fmt: skip
    out.write_text(json.dumps(batch))


def main() -> None:
    groups, tokenizer = sample_batch()
    written = (
        "skyrl/dumped_evals",
        "ragen",
        "verl-agent",
        "areal-0.5",
    )
    for folder in written:  # the others: their own scripts, by the trainers' own code
        shutil.rmtree(OUT / folder, ignore_errors=True)
    write_skyrl_evals(groups, tokenizer, OUT / "skyrl")
    write_ragen(groups, tokenizer, OUT / "ragen")
    write_verl_agent(groups, tokenizer, OUT / "verl-agent")
    write_areal_text(groups, tokenizer, OUT / "areal-0.5")
    write_vision_batch(OUT / "batch-vision.json")
    (OUT / "batch.json").write_text(json.dumps(
        [{"ids": g.ids, "responses": [r.ids for r in g.responses]} for g in groups]
    ))  # fmt: skip
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
