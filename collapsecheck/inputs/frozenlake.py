"""The built-in environment `frozenlake` (`scan --env frozenlake`): gymnasium's FrozenLake,
rendered and acted as RAGEN's FrozenLakeEnv is (`ragen/env/frozen_lake`):

- the map comes from the seed: a size x size board of frozen cells with holes (each cell
  frozen with probability p), the start and the goal at random distinct cells, redrawn until
  the goal is reachable;
- the observation is the grid as text, one row per line: `P` the player, `_` frozen, `O` a
  hole, `G` the goal, `X` the player in a hole, `√` the player on the goal;
- the action is one of `Left`, `Down`, `Right`, `Up` (any case); any other text changes
  nothing (`action_is_valid` false);
- `info` holds RAGEN's `action_is_valid`, `action_is_effective`, `success`.

`--env-arg size=4 --env-arg p=0.8 --env-arg is_slippery=true` (RAGEN's defaults). Needs
gymnasium (`pip install 'collapsecheck[env]'`), imported only when this is played.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action numbers 0..3, in this order
CELLS = {b"F": "_", b"S": "_", b"H": "O", b"G": "G"}
PLAYER, IN_HOLE, ON_GOAL = "P", "X", "√"
SYSTEM_PROMPT = (
    "You are solving the FrozenLake puzzle. Reach the goal G without falling into a hole O. "
    "P is you, _ is frozen ice, X is you in a hole, √ is you on the goal. The ice may be "
    "slippery: you may not always move the way you chose. Answer with one action: "
    "<answer>Left</answer>, <answer>Down</answer>, <answer>Right</answer> or "
    "<answer>Up</answer>."
)


def reachable(board: np.ndarray, start: tuple[int, int]) -> bool:
    """Whether a path of non-hole cells leads from the start to the goal."""
    size = board.shape[0]
    seen, frontier = {start}, deque([start])
    while frontier:
        r, c = frontier.popleft()
        if board[r, c] == "G":
            return True
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            cell = (r + dr, c + dc)
            inside = 0 <= cell[0] < size and 0 <= cell[1] < size
            if inside and cell not in seen and board[cell] != "H":
                seen.add(cell)
                frontier.append(cell)
    return False


def seeded_map(size: int, p: float, seed: int) -> list[str]:
    """The board of a seed: rows of S (start), F (frozen), H (hole), G (goal)."""
    rng = np.random.default_rng(seed)
    while True:
        board = rng.choice(np.array(["F", "H"]), size=(size, size), p=[p, 1 - p])
        start = tuple(int(x) for x in rng.integers(size, size=2))
        goal = tuple(int(x) for x in rng.integers(size, size=2))
        if start == goal:
            continue
        board[start], board[goal] = "S", "G"
        if reachable(board, start):
            return ["".join(row) for row in board]


class FrozenLake:
    """One episode of FrozenLake in RAGEN's protocol: reset(seed) -> text, step(text) ->
    (text, reward, done, info)."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True) -> None:
        if not (isinstance(size, int) and size >= 2):
            raise ValueError(f"size must be a whole number of at least 2, got {size!r}")
        if not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        self.size, self.p, self.is_slippery = size, float(p), bool(is_slippery)
        self.game: FrozenLakeEnv | None = None

    def reset(self, seed: int | None = None) -> str:
        seed = 0 if seed is None else int(seed)
        self.game = FrozenLakeEnv(
            desc=seeded_map(self.size, self.p, seed), is_slippery=self.is_slippery
        )
        self.game.reset(seed=seed)
        return self.render()

    @property
    def position(self) -> tuple[int, int]:
        return divmod(int(self.game.s), self.size)

    def render(self) -> str:
        rows = [[CELLS[cell] for cell in row] for row in self.game.desc]
        r, c = self.position
        tile = self.game.desc[r, c]
        rows[r][c] = IN_HOLE if tile == b"H" else ON_GOAL if tile == b"G" else PLAYER
        return "\n".join("".join(row) for row in rows)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, bool]]:
        names = [name.lower() for name in ACTIONS]
        chosen = action.strip().lower()
        if chosen not in names:
            info = {"action_is_valid": False, "action_is_effective": False, "success": False}
            return self.render(), 0.0, False, info
        before = int(self.game.s)
        _, reward, terminated, truncated, _ = self.game.step(names.index(chosen))
        r, c = self.position
        info = {
            "action_is_valid": True,
            "action_is_effective": int(self.game.s) != before,
            "success": self.game.desc[r, c] == b"G",
        }
        return self.render(), float(reward), bool(terminated or truncated), info
