"""Where a run's own rollouts are and which checkpoint scores each step (docs/runs.md).

The rollouts of step s were sampled by the policy before update s (TRL writes them after
update s from what it generated before it; veRL dumps them at the end of step s from the
batch it generated at its start), so by the checkpoint saved at step s - 1, else the nearest
earlier one (the baseline, with --baseline, is step 0). The gap is the number of updates
between that checkpoint and the sampling weights: 0 is an exact pairing. Steps with no
checkpoint at or before s - 1 are skipped, and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.trainer_rollouts import RolloutFile, rollout_files, rollouts_beside
from collapsecheck.reports.run_report import Pairing

TRAINERS = {"trl": "TRL", "verl": "veRL", "slime": "slime", "skyrl": "SkyRL", "areal": "AReaL",
            "roll": "ROLL", "prime-rl": "prime-rl"}  # fmt: skip


@dataclass(frozen=True)
class RunRollouts:
    """The rollout files of a run, and where they were found."""

    folder: Path
    files: list[RolloutFile]
    others: tuple[Path, ...] = ()  # other trainer rollout folders in the run, not read

    @property
    def trainers(self) -> set[str]:
        return {f.trainer for f in self.files}

    def describe(self) -> str:
        names = ", ".join(sorted(TRAINERS.get(t, t) for t in self.trainers))
        said = f"the trainer's own rollouts ({names}, {self.folder}), not sampled again"
        if self.others:
            listed = ", ".join(str(o) for o in self.others)
            said += f"; also in the run, not read: {listed} (--rollouts DIR reads one)"
        return said


def find_run_rollouts(run_dir: Path, rollouts: Path | None) -> RunRollouts | None:
    """The rollouts of a run: those in `rollouts` (--rollouts DIR, which must hold some),
    else those its trainer keeps beside its checkpoints, else None."""
    if rollouts is None:
        found = rollouts_beside(run_dir)
        if not found:
            return None
        return RunRollouts(found[0], rollout_files(found[0]), tuple(found[1:]))
    if not rollouts.is_dir():
        raise CollapsecheckError(f"--rollouts {rollouts}: not a folder")
    files = rollout_files(rollouts)
    if not files:
        raise CollapsecheckError(
            f"--rollouts {rollouts}: no trainer rollout files in it (TRL's "
            "completions_NNNNN.parquet, veRL's STEP.jsonl with input, output and score, slime's "
            "N.pt, SkyRL's global_step_N_evals/ or global_step_N_training_input.pkl, AReaL's "
            "VERSION/, ROLL's rollout_dump_data.step_N.jsonl, prime-rl's step_N/; docs/formats.md)"
        )
    return RunRollouts(rollouts, files)


def run_rollouts(run_dir: Path, rollouts: str | Path | RunRollouts | None) -> RunRollouts:
    """The rollouts given, or found in their folder or beside the run; an error when none."""
    if isinstance(rollouts, RunRollouts):
        return rollouts
    found = find_run_rollouts(run_dir, Path(rollouts) if rollouts is not None else None)
    if found is None:
        raise CollapsecheckError(f"{run_dir}: no rollouts beside the run (give --rollouts)")
    return found


def pair_rollouts(
    files: Sequence[RolloutFile], checkpoints: Sequence[RunCheckpoint]
) -> tuple[list[Pairing], list[RolloutFile]]:
    """Each step's rollouts with the checkpoint whose weights sampled them (`policy_step`:
    s - 1 for TRL and veRL), else the nearest earlier one; and the steps that have none."""
    numbered = sorted((c for c in checkpoints if c.step is not None), key=lambda c: c.step)
    pairings, skipped = [], []
    for rollouts in files:
        earlier = [c for c in numbered if c.step <= rollouts.policy_step]
        if earlier:
            pairings.append(Pairing(rollouts, earlier[-1]))
        else:
            skipped.append(rollouts)
    return pairings, skipped


def skipped_note(skipped: Sequence[RolloutFile], folder: Path) -> str:
    steps = ", ".join(str(f.step) for f in skipped)
    return (
        f"skipped {len(skipped)} rollout step(s) of {folder} ({steps}): no checkpoint at or "
        "before the step before them sampled them (--baseline names the starting model, step 0)"
    )
