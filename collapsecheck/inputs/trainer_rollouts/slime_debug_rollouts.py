"""slime with `--save-debug-rollout-data TEMPLATE` (or `--dump-details DIR`, which sets it to
`DIR/rollout_data/{rollout_id}.pt`): one `torch.save` file per rollout, the template filled
with the rollout id (`eval_{id}` for evaluation dumps), holding
`{"rollout_id": id, "samples": [Sample.to_dict(), ...]}` (slime's
`observability/rollout_data_utils.py`, `Sample` in `utils/types.py`; read at THUDM/slime
624b824).

What a sample holds: `tokens` (the prompt's ids, then the response's: the exact ids sampled,
so nothing is tokenized again), `response_length`, `prompt` (the rendered text, or the
messages), `response` (SGLang's text, special tokens and stop string kept), `status`
(completed, truncated, aborted, failed), `reward` (a number, or the reward model's dict that
slime's `--reward-key` picks from: here `--reward-field KEY`), `group_index` (the prompt's
group; None in evaluation dumps, grouped by their prompt's ids then). The file is read as data
(`inputs.safe_load`), never unpickled by running code: a vision run's images
(`multimodal_inputs["images"]`, PIL images) are read as their pixels, and each image's tokens in
the ids (as slime's processor expanded them) hold the image's slot, checked against this
checkpoint's processor; videos are not read.

Which weights sampled rollout r: slime's synchronous loop samples rollout r with the weights
it saves as `iter_{r-1}` (then trains on it and saves `iter_r`); an evaluation dump `eval_r`
reads the weights of `iter_r`. `train_async.py` samples one rollout ahead (`iter_{r-2}`): the
pairing's gap says 1 then, not 0. Aborted and failed samples (slime trains on neither) are
left out, counted in a note."""

from __future__ import annotations

import re
import zipfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.images import PromptImage
from collapsecheck.inputs.safe_load import PickledImage, load_torch
from collapsecheck.inputs.trainer_configs import SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    TrainerRollouts,
    folder_holding,
    number,
    require,
)

TRAINER = "slime"
# the rollout id: the last number in the name, `eval_` before it in an evaluation dump
ROLLOUT_ID = re.compile(r"(?P<eval>eval_)?(?P<id>\d+)(?!.*\d)")
FOLDER = "rollout_data"  # --dump-details DIR writes DIR/rollout_data/{rollout_id}.pt
FIELDS = ("prompt", "tokens", "response_length", "status")
KEPT = ("completed", "truncated")  # aborted and failed samples are not trained on


def matches(path: Path) -> bool:
    """A `torch.save` file (`read` says so when it is not slime's)."""
    return path.is_file() and path.suffix == ".pt" and zipfile.is_zipfile(path)


def rollout_id(path: Path) -> int | None:
    found = ROLLOUT_ID.search(path.stem)
    return int(found.group("id")) if found else None


def is_evaluation(path: Path) -> bool:
    found = ROLLOUT_ID.search(path.stem)
    return found is not None and found.group("eval") is not None


# slime's arguments are saved in no file read without running code (W&B's config holds them)
SAVED_CONFIG = SavedConfig(
    TRAINER,
    training=TemperatureKeys((), "slime samples at --rollout-temperature, 1.0 by default", 1.0),
    evaluation=TemperatureKeys(
        (), "slime evaluates at --eval-temperature (or its --eval-config's), else at "
        "--rollout-temperature, 1.0 by default", 1.0,
    ),
    evaluates=is_evaluation,
)  # fmt: skip


def step_of(path: Path) -> int | None:
    """The rollout id of a training dump; None for an evaluation dump (no training step) or a
    name without the id."""
    return None if is_evaluation(path) else rollout_id(path)


def policy_step(path: Path) -> int | None:
    """The `iter_N` whose weights sampled the file (module docstring)."""
    rollout = rollout_id(path)
    if rollout is None:
        return None
    return rollout if is_evaluation(path) else rollout - 1


def beside(run_dir: Path) -> Path | None:
    """`rollout_data/` of `--dump-details DIR`, when the run directory is that DIR."""
    return folder_holding(run_dir, FOLDER, matches)


def samples_of(path: Path) -> list[Any]:
    data = load_torch(path)
    if not (isinstance(data, dict) and isinstance(data.get("samples"), list)):
        raise CollapsecheckError(
            f"{path}: not a slime rollout dump (no 'samples' list; slime writes "
            "{'rollout_id': ..., 'samples': [...]})"
        )
    return data["samples"]


def reward_fields(reward: Any, where: str) -> dict[str, Any]:
    """A number as `reward`; a reward model's dict as its own fields (`--reward-field KEY`
    picks one, as slime's --reward-key does); None as no reward."""
    if reward is None:
        return {}
    if isinstance(reward, dict):
        return {str(k): v for k, v in reward.items() if isinstance(v, int | float)}
    return {"reward": number(reward, where, "reward")}


def reward_notes(samples: Iterable[dict[str, Any]]) -> list[str]:
    """Which of a reward dict's keys (those `reward_fields` keeps) is read: `score` (the
    default reward field) unless --reward-field names another."""
    keys = sorted({
        key for sample in samples if isinstance(sample.get("reward"), dict)
        for key in reward_fields(sample["reward"], "")
    })  # fmt: skip
    if not keys:
        return []
    read = "'score' is read" if "score" in keys else "none is read"
    return [
        f"the reward is a dict ({', '.join(keys)}): {read} unless --reward-field KEY names one "
        "(slime's --reward-key)"
    ]


def sample_row(sample: Any, where: str) -> dict[str, Any]:
    if not isinstance(sample, dict):
        raise CollapsecheckError(f"{where}: a sample is not a record")
    require(sample, FIELDS, where)
    tokens, length = sample["tokens"], sample["response_length"]
    if not (isinstance(length, int) and 0 < length < len(tokens)):
        raise CollapsecheckError(
            f"{where}: response_length {length!r} does not split its {len(tokens)} tokens into "
            "a prompt and a response"
        )
    prompt_ids = list(tokens[: len(tokens) - length])
    group = sample.get("group_index")
    images = sample_images(sample.get("multimodal_inputs"), where)
    return {
        "prompt": sample["prompt"],
        "prompt_ids": prompt_ids,
        "response_ids": list(tokens[len(tokens) - length :]),
        "truncated": sample["status"] == "truncated",
        **({} if group is None else {"group": group}),  # else grouped by ids and images
        **({"prompt_images": images} if images else {}),
        **reward_fields(sample.get("reward"), where),
    }


def sample_images(inputs: Any, where: str) -> list[PromptImage]:
    """A vision run's images (`multimodal_inputs["images"]`, PIL images read as pixels)."""
    if not isinstance(inputs, dict):
        return []
    if inputs.get("videos"):
        raise CollapsecheckError(f"{where}: the sample holds videos, which are not read")
    images = inputs.get("images") or []
    if not all(isinstance(image, PickledImage) for image in images):
        raise CollapsecheckError(f"{where}: multimodal_inputs['images'] are not PIL images")
    return [PromptImage(f"{where} image {k}", image.png()) for k, image in enumerate(images, 1)]


def read(path: Path) -> TrainerRollouts:
    rows, kept, left_out = [], [], Counter()
    for index, sample in enumerate(samples_of(path), start=1):
        where = f"{path}, sample {index}"
        status = sample.get("status") if isinstance(sample, dict) else None
        if status not in KEPT and status is not None:
            left_out[str(status)] += 1
            continue
        rows.append((where, sample_row(sample, where), index))
        kept.append(sample)
    if not rows:
        raise CollapsecheckError(f"{path}: no completed or truncated samples")
    kind = "evaluation" if is_evaluation(path) else "rollout"
    sampled_by = policy_step(path)
    by = (
        f"iter_{sampled_by}"
        if sampled_by is not None
        else "the iteration before (no id in the name)"
    )
    notes = [
        f"slime {kind} {rollout_id(path) if rollout_id(path) is not None else path.name}: "
        f"{len(rows)} samples, scored as the token ids slime sampled (prompt and response), "
        f"sampled by the weights of {by}"
    ]
    if left_out:
        counted = ", ".join(f"{n} {status}" for status, n in sorted(left_out.items()))
        notes.append(f"left out {counted} sample(s): slime does not train on them")
    notes += reward_notes(kept)
    return TrainerRollouts(TRAINER, step_of(path), rows, notes)
