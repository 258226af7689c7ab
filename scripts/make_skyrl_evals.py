"""Write SkyRL's evaluation dumps for tests/fixtures/trainer-dumps/skyrl/dumped_evals/ with
SkyRL's own `dump_per_dataset_eval_results`.

With `trainer.dump_eval_results=true` (the default), `skyrl/train/evaluate.py::evaluate()`
writes `{export_path}/dumped_evals/global_step_{N}_evals/{data_source}.jsonl` (the source's
'/' made '_') and `aggregated_results.jsonl` through
`skyrl.train.utils.trainer_utils.dump_per_dataset_eval_results` (`skyrl==0.4.0`; the function
is the same at NovaSky-AI/SkyRL a956457, and in `skyrl-train==0.3.1` as
`skyrl_train/utils/trainer_utils.py`). This script feeds it what `evaluate()` feeds it for a
non-step-wise run: each eval batch goes through SkyRL's own `prepare_generator_input` (as the
eval dataloader's `PromptDataset.collate_fn` yields it: `prompt`, `env_class`, `env_extras`,
`uid`), its generator output through SkyRL's `validate_generator_output`; data sources are
`env_extras["data_source"]`; the batches joined by SkyRL's `concatenate_generator_outputs`
and the metrics computed by its `calculate_per_dataset_metrics` and
`get_metrics_from_generator_output`, as `evaluate()` does.

The batch is tests/fixtures/trainer-dumps/batch.json (6 prompts x 4 responses sampled from
examples/demo-run/global_step_100), with the first 6 rows of examples/prompts/gridworld.jsonl
and the gridworld reward (examples/rewards/gridworld.py). Two eval batches of 3 prompts
(`eval_batch_size=3`, `eval_n_samples_per_prompt=4`): prompts 0-2 are data source
`gridworld/near`, prompts 3-5 `gridworld/far`, both with the agent loop's per-token score
lists (the reward on the last response token; a run's rewards are all of one form, SkyRL's
concatenation refuses a mix). `stop_reason` is "stop" when the response ends with the
checkpoint's eos token, else "length".

SkyRL is never kept in this repository: the wheel is fetched with `pip download --no-deps`
into a temporary folder, unzipped (not installed), and imported from there. Stubbed, because
the modules used import them but the code run never touches them: the third-party packages
`ray`, `omegaconf`, `torchdata`, `datasets` and `skyrl_gym` (placeholder modules from a
meta-path finder, see `stub_modules`), and, blanked in the temporary copy,
`skyrl/backends/__init__.py` (imports the Tinker backend) and
`skyrl/train/generators/__init__.py` (imports the generator implementations, whose pydantic
TypedDicts need Python >= 3.12).

Run it with the venv of scripts/make_skyrl_batches.py (torch, numpy, jaxtyping, loguru,
transformers; the wheel's own modules also need pydantic, which transformers brings):

    /tmp/skyrl-venv/bin/python scripts/make_skyrl_evals.py [--export-path DIR]

`--export-path` defaults to tests/fixtures/trainer-dumps/skyrl (the step folder is replaced).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from trainer_sources import (
    BATCH,
    DUMPS,
    POLICY,
    PROMPTS,
    fetch_wheel,
    load_reward,
    stub_modules,
)
from transformers import AutoTokenizer

EXPORT_PATH = DUMPS / "skyrl"

WHEEL = "skyrl==0.4.0"
BLANKED = ("skyrl/backends/__init__.py", "skyrl/train/generators/__init__.py")
STUBBED = ["ray", "omegaconf", "torchdata", "datasets", "skyrl_gym"]
GLOBAL_STEP = 2
ENV_CLASS = "gridworld"
EVAL_BATCH_SIZE = 3  # prompts per eval batch
SOURCES = ["gridworld/near", "gridworld/far"]  # one per eval batch
PER_TOKEN = {"gridworld/far", "gridworld/near"}  # the agent loop's per-token rewards


def eos_ids() -> set[int]:
    eos = json.loads((POLICY / "generation_config.json").read_text())["eos_token_id"]
    return set(eos) if isinstance(eos, list) else {eos}


def eval_batches(tokenizer) -> list[tuple[list[dict], list[dict]]]:
    """Per eval batch: the dataloader's prompts (`PromptDataset.collate_fn`) and what the
    generator returns for each of their samples, in batch.json's order."""
    groups = json.loads(BATCH.read_text())
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    compute_score = load_reward()
    stops = eos_ids()
    batches = []
    for b, source in enumerate(SOURCES):
        prompts, samples = [], []
        for i in range(b * EVAL_BATCH_SIZE, (b + 1) * EVAL_BATCH_SIZE):
            group, row = groups[i], rows[i]
            user = row["messages"][-1]["content"]
            assert user in tokenizer.decode(group["ids"]), f"group {i} is not prompt {user!r}"
            prompts.append({
                "prompt": row["messages"],
                "env_class": ENV_CLASS,
                "env_extras": {
                    "data_source": source,
                    "reward_spec": {"ground_truth": row["ground_truth"]},
                },
                "uid": str(i),  # PromptDataset.__getitem__: the row index
            })  # fmt: skip
            for response in group["responses"]:
                text = tokenizer.decode(response, skip_special_tokens=False)
                reward = compute_score("gridworld", text, row["ground_truth"])
                samples.append({
                    "prompt_token_ids": list(group["ids"]),
                    "response_ids": list(response),
                    "reward": reward,
                    "stop_reason": "stop" if response[-1] in stops else "length",
                })  # fmt: skip
        batches.append((prompts, samples))
    return batches


def generator_output(samples: list[dict], per_token: bool) -> dict:
    """The generator's `GeneratorOutput` for one eval batch (single-turn, no logprobs)."""
    rewards = [
        [0.0] * (len(s["response_ids"]) - 1) + [s["reward"]] if per_token else s["reward"]
        for s in samples
    ]
    return {
        "prompt_token_ids": [s["prompt_token_ids"] for s in samples],
        "response_ids": [s["response_ids"] for s in samples],
        "rewards": rewards,
        "loss_masks": [[1] * len(s["response_ids"]) for s in samples],
        "stop_reasons": [s["stop_reason"] for s in samples],
        "rollout_metrics": {},
        "rollout_logprobs": None,
    }


def write(export_path: Path) -> Path:
    from skyrl.train.generators.utils import (
        concatenate_generator_outputs,
        get_metrics_from_generator_output,
        prepare_generator_input,
    )
    from skyrl.train.utils.trainer_utils import (
        calculate_per_dataset_metrics,
        dump_per_dataset_eval_results,
        validate_generator_output,
    )

    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    n_samples = len(json.loads(BATCH.read_text())[0]["responses"])
    # evaluate(): step 1, generation per eval batch
    generator_outputs, all_envs, env_extras, uids = [], [], [], []
    for (prompts, samples), source in zip(eval_batches(tokenizer), SOURCES, strict=True):
        generator_input, batch_uids = prepare_generator_input(
            prompts, n_samples, {}, ENV_CLASS, "eval", GLOBAL_STEP
        )
        output = generator_output(samples, source in PER_TOKEN)
        validate_generator_output(len(generator_input["prompts"]), output)
        generator_outputs.append(output)
        all_envs.extend(generator_input["env_classes"])
        env_extras.extend(generator_input["env_extras"])
        uids.extend(batch_uids)
    concat = concatenate_generator_outputs(generator_outputs)
    data_sources = [extra.get("data_source") for extra in env_extras]
    # evaluate(): steps 2 and 3, the metrics
    eval_metrics = calculate_per_dataset_metrics(concat, uids, data_sources, n_samples)
    overall = get_metrics_from_generator_output(concat, uids)
    eval_metrics.update({
        "eval/all/avg_score": overall["avg_score"],
        f"eval/all/pass_at_{n_samples}": overall["pass_at_n"],
        "eval/all/mean_positive_reward": overall["mean_positive_reward"],
    })  # fmt: skip
    # evaluate(): step 4, the dump
    folder = export_path / "dumped_evals" / f"global_step_{GLOBAL_STEP}_evals"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dump_per_dataset_eval_results(
        folder, tokenizer, concat, data_sources, all_envs, env_extras, eval_metrics
    )
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-path", type=Path, default=EXPORT_PATH)
    args = parser.parse_args()
    stub_modules(STUBBED)
    with tempfile.TemporaryDirectory() as tmp:
        fetch_wheel(WHEEL, Path(tmp), BLANKED, python_version="3.12")
        print("wrote", write(args.export_path))


if __name__ == "__main__":
    main()
