"""The demo policies' environment (`scan --env examples/environments/gridworld.py:make`): a
6 x 6 grid, the agent and the goal at cells drawn from the seed. The observation names both
cells as the demo checkpoints' prompts do ("agent 2,3 goal 5,0"); the action is a move (up,
down, left, right). A move into the edge changes nothing; the episode ends at the goal.
It follows RAGEN's protocol: reset(seed) -> text; step(text) -> (text, reward, done, info),
with RAGEN's info keys."""

from __future__ import annotations

import random

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridWalk:
    """One episode of the walk to the goal."""

    def __init__(self, size: int = 6) -> None:
        self.size = size
        self.agent = self.goal = (0, 0)

    def observation(self) -> str:
        return f"agent {self.agent[0]},{self.agent[1]} goal {self.goal[0]},{self.goal[1]}"

    def reset(self, seed: int | None = None) -> str:
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        self.agent, self.goal = rng.sample(cells, 2)
        return self.observation()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, bool]]:
        move = MOVES.get(action.strip().lower())
        if move is None:
            info = {"action_is_valid": False, "action_is_effective": False, "success": False}
            return self.observation(), 0.0, False, info
        row, column = self.agent[0] + move[0], self.agent[1] + move[1]
        before = self.agent
        if 0 <= row < self.size and 0 <= column < self.size:
            self.agent = (row, column)
        success = self.agent == self.goal
        info = {"action_is_valid": True, "action_is_effective": self.agent != before,
                "success": success}  # fmt: skip
        return self.observation(), float(success), success, info


def make(size: int = 6) -> GridWalk:
    """A fresh environment, one per episode."""
    return GridWalk(size)
