"""Sample the batch every trainer-dump fixture of tests/fixtures/trainer-dumps/ holds
(batch.json; batch-vision.json, a vision run's), and write the two dumps whose trainer's code
does not run here, following its source line by line (file and commit named at each writer;
docs/formats.md says what each holds): verl-agent's rows (veRL's older in-tree writer) and
AReaL's text dumps from before its JSONL ones. Every other trainer's dump is written from
these batches by that trainer's own code, each by its own script (scripts/make_slime_rollouts.py,
make_skyrl_batches.py, make_skyrl_evals.py, make_areal_rollouts.py, make_roll_dumps.py,
make_prime_rl_traces.py, make_ragen_trajectories.py; `make trainer-dumps` names them).

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

from trainer_sources import DUMPS, POLICY, PROMPTS, ROOT, load_reward

sys.path.insert(0, str(ROOT))
from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.prompts import load_prompts, render_prompts
from collapsecheck.settings import LoadSettings, PromptSettings

OUT = DUMPS
compute_score = load_reward()
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
    for folder in ("verl-agent", "areal-0.5"):
        shutil.rmtree(OUT / folder, ignore_errors=True)
    write_verl_agent(groups, tokenizer, OUT / "verl-agent")
    write_areal_text(groups, tokenizer, OUT / "areal-0.5")
    write_vision_batch(OUT / "batch-vision.json")
    (OUT / "batch.json").write_text(json.dumps(
        [{"ids": g.ids, "responses": [r.ids for r in g.responses]} for g in groups]
    ))  # fmt: skip
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
