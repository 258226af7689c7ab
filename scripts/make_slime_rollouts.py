"""Write tests/fixtures/trainer-dumps/slime/ with slime's OWN code: `Sample`
(slime/utils/types.py) and `save_debug_rollout_data` (slime/observability/rollout_data_utils.py),
called the way `RolloutManager.generate` / `RolloutManager.eval` (slime/ray/rollout.py) call it.

slime (THUDM/slime) is not on PyPI, so at run time this script extracts its source with
`git archive` from a local snapshot (a bare or normal git repo: `--slime-repo`, else
$SLIME_REPO, else /work/.mirror/THUDM+slime/repo; `--rev`, default HEAD) into a temporary
folder and puts that folder first on sys.path. No slime code is copied into this repository.

Stubs: importing those two modules pulls in slime/utils/misc.py -> slime/utils/http_utils.py,
which imports `httpx` at module level (it only uses it for HTTP clients, never on the dump
path). When such a third-party module is not installed, and only then, an empty placeholder
module is put in sys.modules for it; any attribute of it is a class that raises if used. Only
the names in STUBBABLE may be stubbed (httpx, and ray / sglang / megatron should a later
slime import them at module level); every other missing module, torch or numpy included, is
an error. What was stubbed is printed.

The content is the batch in tests/fixtures/trainer-dumps/batch.json (6 gridworld prompts x 4
responses sampled from examples/demo-run/global_step_100; a response ends with the stop token
when it stopped, otherwise it was cut at the token budget), the prompts and ground truth from
examples/prompts/gridworld.jsonl, texts decoded with that checkpoint's tokenizer (special
tokens kept, as slime's default --rollout-skip-special-tokens False and no_stop_trim do), and
the reward of examples/rewards/gridworld.py. `--dump-details DIR` sets the template
DIR/rollout_data/{rollout_id}.pt, which gives:

  3.pt       rollout 3, a number reward per sample
  eval_3.pt  the evaluation after it, one dataset, through the evaluation=True path
             (eval samples carry group_index None; index counts within the dataset)
  4.pt       rollout 4, the dapo reward model's dict {"score", "acc", "pred"}, and sample
             index 1 (prompt 0, second response) aborted

Run with an interpreter that has torch, numpy and transformers (not the project's venv):
  python scripts/make_slime_rollouts.py [--out DIR] [--slime-repo REPO] [--rev REV]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

from trainer_sources import BATCH, DUMPS, POLICY, PROMPTS, ROOT, git_archive, load_reward

OUT = DUMPS / "slime"
# a vision run: make_trainer_dumps.py's scan of the vision demo policy, its images' files
VISION_BATCH = DUMPS / "batch-vision.json"
VISION_POLICY = ROOT / "examples" / "checkpoints" / "vision" / "grounded"
VISION_PROMPTS = ROOT / "examples" / "prompts" / "visual-gridworld.jsonl"
VISION_OUT = DUMPS / "slime-vision"
DEFAULT_REPO = "/work/.mirror/THUDM+slime/repo"
EVAL_DATASET = "gridworld"
WEIGHT_VERSION = "1"

# third-party modules that may be replaced by a placeholder when missing
STUBBABLE = ("httpx", "ray", "sglang", "megatron")


def stub_module(name: str) -> None:
    """An empty module whose every attribute is a class that refuses to be used."""

    class Missing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"{name} is a stub in make_slime_rollouts.py")

    module = types.ModuleType(name)
    module.__getattr__ = lambda attr: type(attr, (Missing,), {})
    module.__path__ = []  # so that `import name.sub` finds the stubbed submodules below
    sys.modules[name] = module


def import_slime(source: Path):
    """slime's Sample and save_debug_rollout_data, stubbing only missing STUBBABLE modules."""
    sys.path.insert(0, str(source))
    stubbed = []
    while True:
        try:
            types_module = importlib.import_module("slime.utils.types")
            rollout_data_utils = importlib.import_module("slime.observability.rollout_data_utils")
            break
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if missing.split(".")[0] not in STUBBABLE or missing in sys.modules:
                raise
            stub_module(missing)
            stubbed.append(missing)
            for loaded in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
                del sys.modules[loaded]  # re-import from scratch with the stub in place
    origin = Path(types_module.__file__).resolve()
    assert origin.is_relative_to(source.resolve()), f"slime imported from {origin}"
    print(f"stubbed (not installed): {', '.join(stubbed) or 'nothing'}", file=sys.stderr)
    return types_module.Sample, rollout_data_utils.save_debug_rollout_data


def load_batch(tokenizer, compute_score):
    """[(prompt text, prompt ids, ground truth, [(ids, text, stopped, reward)])] per prompt."""
    batch = json.loads(BATCH.read_text())
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    generation = json.loads((POLICY / "generation_config.json").read_text())
    eos = generation.get("eos_token_id", tokenizer.eos_token_id)
    stops = set(eos if isinstance(eos, list) else [eos])
    groups = []
    for group, row in zip(batch, rows[: len(batch)], strict=True):
        truth = row["ground_truth"]
        responses = []
        for ids in group["responses"]:
            text = tokenizer.decode(ids, skip_special_tokens=False)
            stopped = bool(ids) and ids[-1] in stops
            responses.append((ids, text, stopped, compute_score("grid", text, truth)))
        prompt = tokenizer.decode(group["ids"], skip_special_tokens=False)
        groups.append((prompt, group["ids"], truth, responses))
    return groups


def make_samples(Sample, groups, *, evaluation: bool, dict_reward: bool) -> list:
    """One `Sample` per response, as `generate_and_rm` leaves it: group_index the prompt
    counter (None in evaluation), index the running sample counter."""
    samples = []
    for g, (prompt, prompt_ids, truth, responses) in enumerate(groups):
        for ids, text, stopped, reward in responses:
            index = len(samples)
            if dict_reward:  # the dapo reward model's result
                reward = {"score": 2 * reward - 1, "acc": reward > 0, "pred": "up"}
            status = Sample.Status.COMPLETED if stopped else Sample.Status.TRUNCATED
            samples.append(
                Sample(
                    group_index=None if evaluation else g,
                    index=index,
                    prompt=prompt,  # --apply-chat-template: the rendered text
                    tokens=list(prompt_ids) + list(ids),
                    response=text,
                    response_length=len(ids),
                    label=truth,
                    reward=reward,
                    loss_mask=[1] * len(ids),
                    weight_versions=[WEIGHT_VERSION],
                    rollout_log_probs=[0.0] * len(ids),
                    status=status,
                    session_id=f"session-{g}-{index}",
                )
            )
    return samples


def vision_samples(Sample, compute_score) -> list:
    """A vision run's samples as slime's rollout leaves them: `tokens` with each image's tokens
    as the processor expanded them, `multimodal_inputs` the raw PIL images (slime keeps them
    so; its processor outputs, `multimodal_train_inputs`, are left out here)."""
    from PIL import Image
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(VISION_POLICY))
    rows = [json.loads(line) for line in VISION_PROMPTS.read_text().splitlines() if line.strip()]
    samples = []
    batch = json.loads(VISION_BATCH.read_text())
    for g, (group, row) in enumerate(zip(batch, rows[: len(batch)], strict=True)):
        images = [Image.open(ROOT / path) for path in group["images"]]
        for ids in group["responses"]:
            text = tokenizer.decode(ids, skip_special_tokens=False)
            stopped = bool(ids) and ids[-1] == tokenizer.eos_token_id
            samples.append(Sample(
                group_index=g, index=len(samples),
                prompt=tokenizer.decode(group["ids"], skip_special_tokens=False),
                tokens=list(group["ids"]) + list(ids),
                multimodal_inputs={"images": images, "videos": None},
                response=text, response_length=len(ids), label=row["ground_truth"],
                reward=compute_score("grid", text, row["ground_truth"]),
                loss_mask=[1] * len(ids), weight_versions=[WEIGHT_VERSION],
                rollout_log_probs=[0.0] * len(ids),
                status=Sample.Status.COMPLETED if stopped else Sample.Status.TRUNCATED,
                session_id=f"session-vision-{g}-{len(samples)}",
            ))  # fmt: skip
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the --dump-details DIR")
    parser.add_argument("--slime-repo", default=os.environ.get("SLIME_REPO", DEFAULT_REPO))
    parser.add_argument("--rev", default="HEAD")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    compute_score = load_reward()
    tokenizer = AutoTokenizer.from_pretrained(str(POLICY))
    groups = load_batch(tokenizer, compute_score)

    with tempfile.TemporaryDirectory(prefix="slime-src-") as source:
        commit = git_archive(args.slime_repo, args.rev, "slime", Path(source))
        Sample, save_debug_rollout_data = import_slime(Path(source))

        shutil.rmtree(args.out / "rollout_data", ignore_errors=True)
        template = f"{args.out}/rollout_data/{{rollout_id}}.pt"  # what --dump-details sets

        # RolloutManager.generate(3): the flattened list[Sample]
        data = make_samples(Sample, groups, evaluation=False, dict_reward=False)
        save_debug_rollout_data(template, data, rollout_id=3, evaluation=False)

        # RolloutManager.eval(3): eval_rollout's {dataset: {rewards, truncated, samples}}
        data = make_samples(Sample, groups, evaluation=True, dict_reward=False)
        results = {
            EVAL_DATASET: {
                "rewards": [sample.reward for sample in data],
                "truncated": [sample.status == Sample.Status.TRUNCATED for sample in data],
                "samples": data,
            }
        }
        save_debug_rollout_data(template, results, rollout_id=3, evaluation=True)

        # RolloutManager.generate(4): a dict reward and one aborted sample
        data = make_samples(Sample, groups, evaluation=False, dict_reward=True)
        data[1].status = Sample.Status.ABORTED
        save_debug_rollout_data(template, data, rollout_id=4, evaluation=False)

        # a vision run's RolloutManager.generate(6)
        shutil.rmtree(VISION_OUT / "rollout_data", ignore_errors=True)
        data = vision_samples(Sample, compute_score)
        vision_template = f"{VISION_OUT}/rollout_data/{{rollout_id}}.pt"
        save_debug_rollout_data(vision_template, data, rollout_id=6, evaluation=False)

    print(f"wrote {args.out}/rollout_data with slime {commit[:12]}")


if __name__ == "__main__":
    main()
