"""When a checkpoint that a trainer is still writing is complete, by the rule of the writer
that wrote it (docs/runs.md "Watching a run that is still going"). A folder is read only once
its writer is done with it, never while it is being written:

- TRL and the Hugging Face Trainer (`checkpoint-N`): `trainer_state.json` is the last file
  `Trainer._save_checkpoint` writes.
- veRL (`global_step_N`): its checkpoint manager updates the run's
  `latest_checkpointed_iteration.txt` after a save is whole: complete when it names N or a
  later step.
- Any other folder (a Hugging Face save directory, a veRL folder without the tracker file, a
  `checkpoint-N` without its trainer state): its weights present (every shard its index
  names, where sharded), and none of its files changed between two looks at least `settle`
  seconds apart.
- A rollout file (TRL's completions, veRL's rollout dump): once the next step's file
  appears, or once it has not changed for `settle` seconds.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TRAINER_STATE = "trainer_state.json"
VERL_TRACKER = "latest_checkpointed_iteration.txt"
TRL_FOLDER = re.compile(r"checkpoint-(\d+)")
VERL_FOLDER = re.compile(r"global_step_(\d+)")
WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model_world_size_*_rank_*.pt")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

Signature = tuple[tuple[str, int, int], ...]


def files_signature(folder: Path) -> Signature:
    """Every file under `folder` (or the file itself) with its size and modification time."""
    out = []
    for path in [folder] if folder.is_file() else sorted(folder.rglob("*")):
        try:
            if path.is_file():
                stat = path.stat()
                out.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        except OSError:  # removed while listed
            continue
    return tuple(out)


def weights_present(folder: Path) -> bool:
    """Weights in the folder (or one level down, as veRL's `actor/`), and every shard that a
    sharded save's index names."""
    for index_name in INDEXES:
        for index in [folder / index_name, *folder.glob(f"*/{index_name}")]:
            if index.is_file():
                try:
                    shards = set(
                        json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
                    )
                except (OSError, ValueError, KeyError, TypeError):
                    return False  # being written
                return all((index.parent / shard).is_file() for shard in shards)
    return any(any(folder.glob(p)) or any(folder.glob(f"*/{p}")) for p in WEIGHTS)


def verl_tracker_step(run_dir: Path) -> int | None:
    """The step veRL's tracker file names (None: no tracker, or one being written)."""
    try:
        return int((run_dir / VERL_TRACKER).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


@dataclass
class Completeness:
    """Decides, look after look, which checkpoint folders are complete. `settle`: seconds a
    folder without its writer's own mark must stay unchanged."""

    settle: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _seen: dict[Path, tuple[Signature, float]] = field(default_factory=dict)

    def rule(self, folder: Path, run_dir: Path) -> str:
        """Which rule decides this folder (docs/runs.md names them)."""
        if TRL_FOLDER.fullmatch(folder.name) and (folder / TRAINER_STATE).is_file():
            return "trainer_state"
        if VERL_FOLDER.fullmatch(folder.name) and verl_tracker_step(run_dir) is not None:
            return "verl_tracker"
        return "settled"

    def complete(self, folder: Path, run_dir: Path) -> bool:
        rule = self.rule(folder, run_dir)
        if rule == "trainer_state":
            return weights_present(folder)
        if rule == "verl_tracker":
            match = VERL_FOLDER.fullmatch(folder.name)
            tracked = verl_tracker_step(run_dir)
            return match is not None and tracked is not None and tracked >= int(match.group(1))
        return self._settled(folder) and weights_present(folder)

    def rollout_complete(self, path: Path, next_step_written: bool) -> bool:
        """A rollout file: the next step's file is there, or it has settled."""
        return next_step_written or self._settled(path)

    def _settled(self, path: Path) -> bool:
        """Nothing of `path` (a folder's files, or one file) changed for `settle` seconds."""
        signature, now = files_signature(path), self.clock()
        seen = self._seen.get(path)
        if seen is None or seen[0] != signature:
            self._seen[path] = (signature, now)
            return False
        return bool(signature) and now - seen[1] >= self.settle


def written_at(folder: Path) -> float:
    """When the folder's writer last wrote to it (the newest file's modification time)."""
    times = [path.stat().st_mtime for path in folder.rglob("*") if path.is_file()]
    return max(times, default=folder.stat().st_mtime)
