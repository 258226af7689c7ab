"""Rewards in (SPEC "Why: reward variance"): a reward function the user names, with veRL's
custom-reward signature, fed from the prompt rows; or the rewards rollouts already carry.

    def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

Only the file the user names is run. A reward that fails, is not a number (or a dict with a
numeric `score`) or is not finite is an error naming the prompt row and the response.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import Prompt
from collapsecheck.inputs.user_files import file_module, run_file_module

DEFAULT_FUNCTION = "compute_score"
RewardFn = Callable[..., Any]


def load_reward_fn(spec: str) -> RewardFn:
    """The function of `FILE.py[:NAME]` (NAME defaults to compute_score)."""
    path_text, _, name = spec.partition(":")
    path, name = Path(path_text), name or DEFAULT_FUNCTION
    module = file_module(path, f"collapsecheck_reward_{path.stem}", f"--reward-fn {spec}")
    try:
        run_file_module(module)
    except Exception as err:  # the user's file can fail in any way
        raise CollapsecheckError(
            f"--reward-fn {spec}: {path} failed to load ({type(err).__name__}: {err})"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise CollapsecheckError(f"--reward-fn {spec}: {path} has no function {name!r}")
    return function


def reward_inputs(row: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    """(data_source, ground_truth, extra_info) of a prompt row: veRL parquet's
    `reward_model.ground_truth`, else JSONL `ground_truth`, else `answer`."""
    row = row or {}
    model = row.get("reward_model")
    if isinstance(model, dict) and "ground_truth" in model:
        truth = model["ground_truth"]
    else:
        truth = row.get("ground_truth", row.get("answer"))
    return row.get("data_source"), truth, row.get("extra_info")


def as_reward(value: Any, where: str) -> float:
    """A reward as a finite float: a number, or a dict with a numeric `score`."""
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CollapsecheckError(f"{where}: the reward is not a number ({value!r})")
    if not math.isfinite(float(value)):
        raise CollapsecheckError(f"{where}: the reward is not finite ({value!r})")
    return float(value)


def score_responses(
    function: RewardFn, prompts: Sequence[Prompt], responses: Sequence[Sequence[str]]
) -> list[list[float]]:
    """Each response's reward, from the function and its prompt's row."""
    rewards = []
    for prompt, texts in zip(prompts, responses, strict=True):
        data_source, truth, extra = reward_inputs(prompt.row)
        row_rewards = []
        for index, text in enumerate(texts):
            where = f"{prompt.origin} (response {index})"
            try:
                value = function(data_source, text, truth, extra_info=extra)
            except Exception as err:  # the user's reward function can fail in any way
                raise CollapsecheckError(
                    f"{where}: the reward function raised {type(err).__name__}: {err}"
                ) from None
            row_rewards.append(as_reward(value, where))
        rewards.append(row_rewards)
    return rewards
