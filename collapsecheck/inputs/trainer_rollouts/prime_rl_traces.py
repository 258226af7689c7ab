"""prime-rl's rollout traces, on by default (the orchestrator's `monitors.file`):
`{output_dir}/rollouts/step_{N}/{train,eval}/{all,effective}/traces.jsonl`, one verifiers
Episode record per line (`FileMonitor.log_episodes`, src/prime_rl/monitors/file.py; the record
is `Episode.to_record()` of verifiers' v1 episode, None fields left out; read at
PrimeIntellect-ai/prime-rl 559b447 with verifiers a60a606).

`all` holds every episode as it arrived (errored and rejected ones too); `effective` the ones
trained on (train) or kept (eval). A step's folder is read from `train/effective/` (else
`train/all/`, else `eval/effective/`); `score` also takes one `traces.jsonl`.

Each episode has `group.id` (the group of one task's rollouts), `run.work.policy`
(`{start, end}`: the policy versions it was sampled under) and `traces`; each trace a graph of
`nodes` (`message`, `sampled`, `token_ids`: the node's tokens with its template scaffold,
`mask`: the trainable, sampled ones, `parent`) and `rewards` (`{name: {score, weight}}`: the
reward is their weighted sum, as verifiers' `Trace.reward`). Read exactly as ids: a sampled
node's context is every token before its first trainable one, its response the tokens up to
its last; a trace with several sampled nodes is a multi-turn rollout, scored turn by turn.
Errored episodes and traces of agents that are not trainable are left out, counted.

Which weights: version v is the policy after v optimizer steps (the checkpoint `step_v`); a
step's batch is shipped once the policy is at most two versions behind it, so step N's
rollouts come from about v(N-2) to v(N-1), and an evaluation at step N from older ones. Each
episode records the versions it was sampled under (`run.work.policy`): a step pairs with the
version most of its episodes started under (N - 1 where none is recorded), and the note gives
the versions and how many episodes spanned more than one (weights updated while sampling)."""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_configs import SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    Row,
    TrainerRollouts,
    folder_holding,
    number,
    require,
)

TRAINER = "prime-rl"
STEP = re.compile(r"step_(\d+)")
FILE = "traces.jsonl"
FOLDER = "rollouts"
PREFERRED = ("train/effective", "train/all", "eval/effective", "eval/all")


def step_folder(path: Path) -> Path | None:
    """The `step_N` folder a path is, or whose `{kind}/{subset}/traces.jsonl` it is (a
    scan's dump inside a folder named step_N is not one)."""
    folder = path
    if path.is_file():
        if path.name != FILE or f"{path.parent.parent.name}/{path.parent.name}" not in PREFERRED:
            return None
        folder = path.parent.parent.parent
    return folder if STEP.fullmatch(folder.name) else None


def traces_file(path: Path) -> Path | None:
    if path.is_file():
        return path
    return next((path / p / FILE for p in PREFERRED if (path / p / FILE).is_file()), None)


def matches(path: Path) -> bool:
    return step_folder(path) is not None and traces_file(path) is not None


def is_evaluation(path: Path) -> bool:
    """Traces of the step's evaluation (`eval/`), not of its training batch."""
    file = traces_file(path)
    return file is not None and file.parent.parent.name == "eval"


# the `rl` launcher writes each part's resolved config to `{run}/configs/` (JSON; TOML before
# prime-rl e26b505); a standalone orchestrator writes none
SAVED_CONFIG = SavedConfig(
    TRAINER,
    training=TemperatureKeys(
        ("train.sampling.temperature", "sampling.temperature"),
        "prime-rl samples at the orchestrator's sampling.temperature, 1.0 by default", 1.0,
    ),
    evaluation=TemperatureKeys(
        ("eval.sampling.temperature",),
        "prime-rl evaluates at the orchestrator's eval.sampling.temperature, else at the "
        "inference server's default",
    ),
    files=("configs/orchestrator.json", "configs/orchestrator.toml"),
    evaluates=is_evaluation,
)  # fmt: skip


def step_of(path: Path) -> int:
    return int(STEP.fullmatch(step_folder(path).name).group(1))


def policy_step(path: Path) -> int:
    """The policy version most of the step's samples started under (version v: the weights
    after v steps, saved as `step_v`); N - 1 where they record none."""
    file = traces_file(path)
    stat = file.stat()
    recorded = start_versions(file, stat.st_size, stat.st_mtime_ns)
    return recorded.most_common(1)[0][0] if recorded else step_of(path) - 1


@functools.lru_cache(maxsize=64)
def start_versions(file: Path, size: int, modified: int) -> Counter:
    """How many episodes started under each policy version (read once per file state: a
    watch lists the steps at every look)."""
    starts: Counter = Counter()
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            episode = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written; read() names a malformed one
        policy = ((episode.get("run") or {}).get("work") or {}).get("policy")
        if isinstance(policy, dict) and isinstance(policy.get("start"), int):
            starts[policy["start"]] += 1
    return starts


def beside(run_dir: Path) -> Path | None:
    return folder_holding(run_dir, FOLDER, matches)


def branch(nodes: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The nodes from the root to the last leaf (a trace's main branch)."""
    parents = {n.get("parent") for n in nodes}
    leaf = max(i for i in range(len(nodes)) if i not in parents)
    path, at = [], leaf
    while at is not None:
        if not 0 <= at < len(nodes) or len(path) > len(nodes):
            raise CollapsecheckError(f"{where}: the trace's nodes do not form a tree")
        path.append(nodes[at])
        at = nodes[at].get("parent")
    return path[::-1]


def sampled_turns(nodes: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Each sampled node as (prompt_ids: every token before its first trainable one,
    response_ids: its tokens from there to its last trainable one)."""
    turns, before = [], []
    for node in branch(nodes, where):
        ids, mask = node.get("token_ids") or [], node.get("mask") or []
        trained = [i for i, m in enumerate(mask) if m]
        if node.get("sampled") and trained:
            first, last = trained[0], trained[-1]
            turns.append(
                {"prompt_ids": before + ids[:first], "response_ids": ids[first : last + 1]}
            )
        before = before + list(ids)
    return turns


def trace_reward(trace: dict[str, Any], where: str) -> float | None:
    """verifiers' `Trace.reward`: the weighted sum of the scores that are set."""
    rewards = trace.get("rewards") or {}
    scored = [r for r in rewards.values() if isinstance(r, dict) and r.get("score") is not None]
    if not scored:
        return None
    return sum(number(r["score"], where, "score") * number(r.get("weight", 1), where, "weight")
               for r in scored)  # fmt: skip


def episode_rows(episode: dict[str, Any], where: str, line: int, left_out: Counter) -> list[Row]:
    require(episode, ("group", "traces"), where)
    if episode.get("ok") is False or episode.get("errors"):
        left_out["errored episode"] += 1
        return []
    rows = []
    for t, trace in enumerate(episode["traces"], start=1):
        at = f"{where} trace {t}"
        if not (trace.get("agent") or {}).get("trainable", True):
            left_out["trace of an agent that is not trainable"] += 1
            continue
        turns = sampled_turns(trace.get("nodes") or [], at)
        if not turns:
            raise CollapsecheckError(f"{at}: no sampled, trainable tokens")
        reward = trace_reward(trace, at)
        row = {"turns": turns, "group": episode["group"].get("id")}
        rows.append((at, row | ({} if reward is None else {"reward": reward}), line))
    return rows


def single_turns(rows: list[Row]) -> list[Row]:
    """Rows whose traces all have one turn, as single-turn rows (grouped by their group)."""
    if any(len(row["turns"]) > 1 for _, row, _ in rows):
        return rows
    return [(w, {k: v for k, v in row.items() if k != "turns"} | row["turns"][0], n)
            for w, row, n in rows]  # fmt: skip


def versions_note(episodes: list[dict[str, Any]]) -> str:
    spans = [((e.get("run") or {}).get("work") or {}).get("policy") for e in episodes]
    starts = Counter(s["start"] for s in spans if s)
    spanning = sum(1 for s in spans if s and s["start"] != s["end"])
    if not starts:
        return "the samples record no policy version (a frozen generation source)"
    listed = ", ".join(f"v{v} ({n})" for v, n in sorted(starts.items()))
    return (
        f"policy versions at the start of sampling: {listed}; {spanning} of {len(spans)} "
        "episodes spanned more than one version (the weights were updated while sampling)"
    )


def read(path: Path) -> TrainerRollouts:
    file = traces_file(path)
    lines = file.read_text(encoding="utf-8").splitlines()
    rows, episodes, left_out = [], [], Counter()
    for where, episode, line in jsonl_rows(file, lines):
        kept = episode_rows(episode, where, line, left_out)
        episodes += [episode] if kept else []
        rows += kept
    if not rows:
        raise CollapsecheckError(f"{file}: no trainable traces")
    rows = single_turns(rows)
    step = step_of(path)
    notes = [
        f"prime-rl traces of step {step} ({file.relative_to(step_folder(path))}): {len(rows)} "
        "traces, scored as the token ids prime-rl recorded",
        versions_note(episodes),
    ]
    if left_out:
        notes.append("left out " + ", ".join(f"{n} {k}(s)" for k, n in sorted(left_out.items())))
    return TrainerRollouts(TRAINER, step, rows, notes)
