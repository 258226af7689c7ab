"""Write prime-rl's rollout traces for tests/fixtures/trainer-dumps/prime-rl/ with the trainer's
own record code: verifiers' v1 `Episode`, `Trace`, `MessageNode`, ... built for the batch of
tests/fixtures/trainer-dumps/batch.json, then written as prime-rl's
`FileMonitor.log_episodes` writes them (PrimeIntellect-ai/prime-rl 559b447,
src/prime_rl/monitors/file.py): `orjson.dumps(episode.to_record(), default=str,
option=OPT_APPEND_NEWLINE | OPT_SERIALIZE_NUMPY)`, appended (`"ab"`), one line per episode, to
`rollouts/step_5/train/{all,effective}/traces.jsonl`.

verifiers is the commit prime-rl pins (deps/verifiers at a60a606), installed from its source in
a venv of its own (verifiers does not install in collapsecheck's venv); its version is what
hatch-vcs derives there (v0.3.0 + 62 commits):

    git -C VERIFIERS_REPO archive a60a606 | tar -x -C /tmp/vf-src
    python3 -m venv /tmp/vf-venv
    SETUPTOOLS_SCM_PRETEND_VERSION=0.3.1.dev62 /tmp/vf-venv/bin/pip install /tmp/vf-src orjson \
        transformers==5.24.0 tokenizers
    /tmp/vf-venv/bin/python scripts/make_prime_rl_traces.py [OUT]   # OUT: the fixture folder

The batch: batch.json's ids (6 prompts x 4 responses, the stop token included when a response
stopped), the first 6 gridworld prompts, rewards from examples/rewards/gridworld.py. Each
episode has one trace: a node per prompt message (its own rendered tokens), then the assistant
node (the generation prompt's scaffold, then the sampled ids, masked trainable). Step 5's
samples started under policy v3; one spanned v3 to v4. `all/` holds the episodes in the order
they completed, groups interleaved, and one errored episode; `effective/` the 24 shipped, in
group order, with the GRPO advantages prime-rl stamps on them before it writes them.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import orjson
import verifiers
import verifiers.v1 as vf
from trainer_sources import BATCH, DUMPS, POLICY, PROMPTS, load_reward
from transformers import AutoTokenizer

compute_score = load_reward()
OUT = DUMPS / "prime-rl"
VERIFIERS_COMMIT = "a60a606ecc4d309247edf9ff92c3eabca362781f"  # prime-rl 559b447's deps/verifiers
STEP, ENV, T0 = 5, "gridworld", 1764064800.0
IDS = uuid.UUID("6a1c1c8e-5b0e-4f43-9d43-2b8f4b1c0f11")  # a namespace: ids fixed from run to run


class GridworldData(vf.TaskData):
    answer: str


class GridworldTask(vf.Task[GridworldData]):
    """The gridworld rows as a verifiers task: the record takes its class name, key and hash."""


def rendered(tokenizer, messages: list[dict], generation: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def message_nodes(tokenizer, messages: list[dict], prompt_ids: list[int], response_ids: list[int],
                  at: float) -> list[vf.MessageNode]:  # fmt: skip
    """The trace's graph, one branch, as verifiers' graph builder commits a turn: each prompt
    message's own tokens (the rendering of the messages so far, less the rendering before),
    then the assistant's node: the generation prompt's scaffold (mask False) and the sampled
    ids (mask True). The default (Jinja) renderer attributes no content: `is_content` empty."""
    nodes, before = [], []
    for i, message in enumerate(messages):
        ids = rendered(tokenizer, messages[: i + 1], False)
        own = ids[len(before) :]
        parent = i - 1 if i else None
        nodes.append(vf.MessageNode(parent=parent, message=message, timestamp=at, token_ids=own,
                                    mask=[False] * len(own)))  # fmt: skip
        before = ids
    scaffold = rendered(tokenizer, messages, True)[len(before) :]
    assert before + scaffold == prompt_ids, "the chat template does not give batch.json's ids"
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    nodes.append(vf.MessageNode(
        parent=len(nodes) - 1, message=vf.AssistantMessage(content=text), sampled=True,
        timestamp=at, token_ids=scaffold + response_ids,
        mask=[False] * len(scaffold) + [True] * len(response_ids),
        logprobs=[-0.5] * len(response_ids),
    ))  # fmt: skip
    return nodes


def episode(tokenizer, task: GridworldTask, g: int, r: int, response_ids: list[int],
            prompt_ids: list[int], stopped: bool, done: int) -> vf.Episode:  # fmt: skip
    """One rollout as prime-rl's orchestrator has it when it arrives: the env's episode and
    trace, then `Dispatcher.emit_episode`'s stamps (env name, group, run with its policy
    span). `done`: its place in the completion order, which sets its clock."""
    start = T0 + done
    traced = vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
    nodes = message_nodes(tokenizer, task.data.prompt, prompt_ids, response_ids, start + 1.0)
    text = tokenizer.decode(response_ids, skip_special_tokens=False)
    trace = vf.Trace(
        id=uuid.uuid5(IDS, f"trace {g} {r}").hex,
        verifiers=vf.VersionInfo(version=verifiers.__version__, commit=VERIFIERS_COMMIT),
        task=traced, agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes,
        calls=[vf.ModelCall(node=len(nodes) - 1, model="policy",
                            finish_reason="stop" if stopped else "length",
                            time=vf.TimeSpan(start=start + 0.125, end=start + 0.875))],
        timing=vf.Timing(start=start, setup=vf.TimeSpan(start=start, end=start + 0.125),
                         agent=vf.AgentSpan(start=start + 0.125, end=start + 1.0),
                         scoring=vf.TimeSpan(start=start + 1.0, end=start + 1.125)),
    )  # fmt: skip
    trace.split_agent_time()
    # scoring: both rewards seeded unscored (None), then `correct` recorded; `format` (weight
    # 0.2) left unscored, which a `Reward` (score: float) can only record as None
    trace.rewards = {"correct": None, "format": None}
    trace.record_reward("correct", compute_score("grid", text, task.data.answer), 1.0)
    trace.ok = True
    trace.stop("agent_completed")
    policy = vf.PolicySpan(start=3, end=4 if (g, r) == (2, 1) else 3)
    work = vf.TrainWorkInfo(step=STEP, policy=policy)
    return vf.Episode(
        id=uuid.uuid5(IDS, f"episode {g} {r}").hex, env=vf.EnvInfo(id=ENV, name=ENV),
        task=traced, group=vf.GroupInfo(id=f"group-{g:02d}"),
        run=vf.TrainRunInfo(id="run-1", name="grid", work=work), ok=True, traces=[trace],
    )  # fmt: skip


def shipped(group: list[vf.Episode]) -> list[vf.Episode]:
    """A group as the effective file has it: GRPO's credit (the reward less the group's mean)
    on each sampled token (`assign_advantages`), the trace's mean in `info["advantage"]`
    (`TrainEpisodes.vf_episodes`)."""
    rewards = [e.traces[0].reward for e in group]
    mean = sum(rewards) / len(rewards)
    out = []
    for e, reward in zip(group, rewards, strict=True):
        trace = e.traces[0].model_copy(deep=True)
        for node in trace.nodes:
            node.advantages = [reward - mean] * sum(node.mask) if any(node.mask) else None
        trace.info = {**trace.info, "advantage": reward - mean}
        out.append(e.model_copy(update={"traces": [trace]}))
    return out


def log_episodes(episodes: list[vf.Episode], path: Path) -> None:
    """prime-rl's FileMonitor.log_episodes, for one (step, kind, subset)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
    with open(path, "ab") as f:
        for e in episodes:
            f.write(orjson.dumps(e.to_record(), default=str, option=opts))


def main(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    stops = {tokenizer.eos_token_id}
    batch = json.loads(BATCH.read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines()]
    # completed: each group's r-th response, one group after another, in turn
    pairs = [(g, r) for g, group in enumerate(batch) for r in range(len(group["responses"]))]
    order = sorted(pairs, key=lambda gr: (gr[1], gr[0]))
    groups = []
    for g, (group, row) in enumerate(zip(batch, rows[: len(batch)], strict=True)):
        data = GridworldData(idx=g, prompt=row["messages"], answer=row["ground_truth"])
        task = GridworldTask(data)
        groups.append([
            episode(tokenizer, task, g, r, ids, group["ids"], ids[-1] in stops, order.index((g, r)))
            for r, ids in enumerate(group["responses"])
        ])  # fmt: skip
    first = groups[0][0]
    errored = vf.Episode(
        id=uuid.uuid5(IDS, "episode errored").hex, env=first.env, task=first.task,
        group=first.group, run=first.run, ok=False,
        errors=[vf.Error(type="TimeoutError", message="sandbox timed out")],
    )  # fmt: skip
    if out.exists():
        shutil.rmtree(out)
    folder = out / "rollouts" / f"step_{STEP}" / "train"
    for g, r in order:  # the orchestrator logs each to `all` as it arrives
        log_episodes([groups[g][r]], folder / "all" / "traces.jsonl")
    log_episodes([errored], folder / "all" / "traces.jsonl")
    # finalize_train_batch: the shipped batch at once
    log_episodes([e for group in groups for e in shipped(group)],
                 folder / "effective" / "traces.jsonl")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
