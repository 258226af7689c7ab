"""The gridworld task's reward, with veRL's custom-reward signature (`custom_reward_function`
in a veRL config, or `collapsecheck scan --reward-fn examples/rewards/gridworld.py`).

The ground truth is the moves that bring the agent closer to the goal, comma-separated
("up,left"); a response earns 1 when its <answer> is one of them, 0 otherwise.
"""

import re

ANSWER = re.compile(r"<answer>\s*(\w+)\s*</answer>")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = ANSWER.search(solution_str)
    useful = {move.strip() for move in str(ground_truth).split(",") if move.strip()}
    return 1.0 if answer is not None and answer.group(1) in useful else 0.0
