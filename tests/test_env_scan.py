"""`scan --env` (SPEC "Agents across turns") for real: a demo checkpoint played in the demo
gridworld through RAGEN's protocol and through a real gymnasium.Env, its episodes replayed in
the environment, its contexts the chat so far, input dependence by turn against the pooled
matrix, the results cache, the errors; and the episodes of RAGEN's own export."""

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, HEALTHY, ROOT

GRIDWORLD = EXAMPLES / "environments" / "gridworld.py"
ENVS = ROOT / "tests" / "fixtures" / "environments"
FLOW = EXAMPLES / "checkpoints" / "flow" / "faithful"
SMALL = ("-n", "4", "-k", "2", "--max-turns", "3", "--max-new-tokens", "48", "--bootstrap", "100",
         "--fail-on", "none")  # fmt: skip


def collapsecheck(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env={"HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )  # fmt: skip


def episodes_of(dump):
    return [json.loads(line) for line in (dump / "episodes.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """The faithful flow checkpoint played in the demo gridworld (RAGEN's protocol)."""
    dump = tmp_path_factory.mktemp("played")
    result = collapsecheck("scan", FLOW, "--env", f"{GRIDWORLD}:make", *SMALL, "--dump", dump)
    assert result.returncode == 0, result.stderr
    return dump, result


def gridworld():
    spec = importlib.util.spec_from_file_location("gridworld_replay", GRIDWORLD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def action_of(response):
    """The action as SPEC "Information flow" locates it, written out for these tags: the
    <answer> segment after a whole <think> segment, "" where the response has none."""
    _, opened, rest = response.partition("<think>")
    _, closed, after = rest.partition("</think>")
    _, started, tail = after.partition("<answer>")
    answer, ended, _ = tail.partition("</answer>")
    return answer if opened and closed and started and ended else ""


def test_played_episodes_replay_in_their_environment(played):
    dump, _ = played
    episodes = episodes_of(dump)
    assert len(episodes) == 8 and {e["start"] for e in episodes} == {0, 1, 2, 3}
    module = gridworld()
    for episode in episodes:
        env = module.make()
        state = env.reset(seed=episode["seed"])
        assert episode["seed"] == episode["start"]  # --env-seed 0: seeds 0 .. N-1
        for turn in episode["turns"]:
            assert turn["state"] == state
            assert turn["action"] == action_of(turn["response"])
            state, reward, done, info = env.step(turn["action"])
            assert turn["reward"] == reward and turn["info"] == info
        assert episode["final_state"] == state
        assert episode["done"] == done and len(episode["turns"]) <= 3
        assert (len(episode["turns"]) == 3) or done


def test_the_report_holds_the_episodes_and_input_dependence_by_turn(played):
    dump, result = played
    report = json.loads((dump / "report.json").read_text())
    assert report["episodes"]["regime"] in ("looping", "stalling", "progressing", "inconclusive")
    assert report["episodes"]["episodes"] == 8 and report["episodes"]["starts"] == 4
    for key in ("stall_rate", "revisit_rate", "undo_rate", "success_rate", "turns_per_episode",
                "distinct_action_sequences"):  # fmt: skip
        metric = report["metrics"][key]
        assert metric["low"] <= metric["value"] <= metric["high"], key
    turns = [entry["turn"] for entry in report["by_turn"]]
    assert turns == sorted(turns) and turns[0] == 1
    first = report["by_turn"][0]
    assert first["contexts"] == 4 and first["pairs"] == 8  # 4 seeds, 2 episodes each
    for key in ("normalized_mi", "retrieval_skill", "conditional_entropy_est"):
        assert set(first[key]) == {"value", "low", "high"}
    said = " ".join(result.stdout.split())
    assert "episodes: " in said and "by turn: normalized MI turn 1" in said


def test_a_played_report_reads_back_whole_and_feeds_the_dashboards(played):
    from collapsecheck.reports.dashboard import dashboard_scalars
    from collapsecheck.reports.report import Report

    dump, _ = played
    saved = json.loads((dump / "report.json").read_text())
    report = Report.load(dump / "report.json")
    assert report.to_dict()["episodes"] == saved["episodes"]
    assert report.to_dict()["by_turn"] == saved["by_turn"]
    scalars = dashboard_scalars(report)
    assert scalars["collapse/revisit_rate"] == saved["metrics"]["revisit_rate"]["value"]
    first = saved["by_turn"][0]["normalized_mi"]["value"]
    assert scalars["collapse/by_turn/1/normalized_mi"] == first
    assert scalars["collapse/episodes_looping"] == float(saved["episodes"]["regime"] == "looping")


def test_a_turns_context_is_the_chat_so_far(played, tmp_path):
    dump, _ = played
    texts = [json.loads(line)["text"] for line in (dump / "prompts.jsonl").read_text().splitlines()]
    # -1 keeps every observation: a turn-3 context holds three, with two responses between
    assert max(text.count("<|user|>") for text in texts) == 3
    assert max(text.count("<|assistant|>") for text in texts) == 3  # two kept + the opened one
    result = collapsecheck("scan", FLOW, "--env", f"{GRIDWORLD}:make", *SMALL,
                           "--context-window", "1", "--dump", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    for line in (tmp_path / "prompts.jsonl").read_text().splitlines():
        text = json.loads(line)["text"]
        assert text.count("<|user|>") == 1 and text.count("<|assistant|>") == 1


def test_gymnasiums_protocol_plays_the_same_episodes(played, tmp_path):
    dump, _ = played
    result = collapsecheck("scan", FLOW, "--env", f"{ENVS / 'gym_gridworld.py'}:make", *SMALL,
                           "--dump", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # the same seeds, the same checkpoint and settings: the same episodes, turn for turn
    assert episodes_of(tmp_path) == episodes_of(dump)


def test_by_turn_of_one_turn_is_the_pooled_matrix(tmp_path):
    from collapsecheck.inputs.environments import load_environment
    from collapsecheck.runs.diagnose import play
    from collapsecheck.settings import EnvSettings

    env = EnvSettings(env=f"{GRIDWORLD}:make", max_turns=1)
    report = play(
        FLOW, load_environment(env.env, {}), env=env, num_prompts=6, k=2, max_new_tokens=48,
        bootstrap=100, device="cpu",
    )  # fmt: skip
    (entry,) = report.by_turn
    assert entry.turn == 1 and entry.contexts == 6 and entry.pairs == 12
    for key in ("normalized_mi", "retrieval_skill", "conditional_entropy_est"):
        # the same matrix, scored in other batches (the pooled call scores the flow too), so
        # within float32's rounding of the log-probabilities
        mine, pooled = entry.metrics[key], report.metrics[key]
        assert (mine.value, mine.low, mine.high) == pytest.approx(
            (pooled.value, pooled.low, pooled.high), rel=1e-5, abs=1e-9
        ), key


def test_a_cached_played_scan_is_read_back_and_read_again_with_other_lines(tmp_path):
    args = ("scan", HEALTHY, "--env", f"{GRIDWORLD}:make", *SMALL, "--out", tmp_path)
    first = collapsecheck(*args, "--json", tmp_path / "a.json")
    assert first.returncode == 0, first.stderr
    again = collapsecheck(*args, "--looping-line", "0", "--json", tmp_path / "b.json")
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert b["timing"].get("cached") is True
    assert a["metrics"]["revisit_rate"] == b["metrics"]["revisit_rate"]
    # a line of 0: every revisit interval's lower bound is at or above it
    assert b["episodes"]["regime"] == "looping"
    other = collapsecheck(*args, "--max-turns", "2", "--json", tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["timing"].get("cached") is not True, (
        other.stderr
    )


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (f"{ENVS / 'broken.py'}:raises",
         "the factory failed for seed 0 (ValueError: no such board)"),
        (f"{ENVS / 'broken.py'}:nothing", "has no factory 'nothing'"),
        (f"{ENVS / 'missing.py'}:make", "file not found"),
        ("no_such_package.envs:make", "no module named 'no_such_package'"),
        ("gridworld", "expected FILE.py:FACTORY, package.module:FACTORY or one of frozenlake"),
        (f"{ENVS / 'broken.py'}:not_text", "(seed 0, reset): the observation is a int, not text"),
        (f"{ENVS / 'broken.py'}:bad_step", "(seed 0, turn 1): step returned a tuple of 3"),
        (f"{ENVS / 'broken.py'}:step_raises",
         "(seed 0, turn 2): the environment raised RuntimeError: the board fell over"),
    ],
)  # fmt: skip
def test_an_environment_at_fault_is_one_line_naming_it(spec, said, tmp_path):
    result = collapsecheck("scan", HEALTHY, "--env", spec, *SMALL)
    assert result.returncode == 2
    line = " ".join(result.stderr.split())
    assert said in line, line
    assert "Traceback" not in result.stderr and line.count("error:") == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--env-arg", "size"), "--env-arg expects KEY=VALUE, got 'size'"),
        (("--prompts", EXAMPLES / "prompts" / "gridworld.jsonl"), "--prompts does not go with it"),
        (("--context-window", "0"), "--context-window must be -1 or at least 1"),
    ],
)
def test_options_at_fault_are_one_line(args, said):
    result = collapsecheck("scan", HEALTHY, "--env", f"{GRIDWORLD}:make", *SMALL, *args)
    assert result.returncode == 2 and said in " ".join(result.stderr.split()), result.stderr


def test_env_options_need_an_environment():
    result = collapsecheck("scan", HEALTHY, "-p", EXAMPLES / "prompts" / "gridworld.jsonl",
                           "--max-turns", "3")  # fmt: skip
    assert result.returncode == 2 and "--max-turns goes with --env SPEC" in result.stderr


def test_frozenlake_is_gymnasiums_lake_as_ragen_renders_it():
    from collapsecheck.inputs.environments import Environment, load_environment

    spec = load_environment("frozenlake", {"size": 4, "is_slippery": False})
    env = Environment(spec, 3)
    board = env.reset()
    rows = board.split("\n")
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert board.count("P") == 1 and board.count("G") == 1 and set(board) <= set("P_OG\n")
    assert "Left" in env.system_prompt
    again = Environment(spec, 3)
    assert again.reset() == board  # the map comes from the seed
    wrong = env.step("jump", 1)
    assert wrong.observation == board and wrong.info["action_is_valid"] is False
    # walk to the goal along a path of frozen cells (no slipping): success at the goal
    start = next((r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == "P")
    goal = next((r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == "G")
    step = None
    for action in shortest_path(rows, start, goal):
        step = env.step(action, 1)
    assert step is not None and step.done and step.info["success"] and step.reward == 1.0
    assert "√" in step.observation


def shortest_path(rows, start, goal):
    from collections import deque

    moves = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    frontier, seen = deque([(start, [])]), {start}
    while frontier:
        (r, c), path = frontier.popleft()
        if (r, c) == goal:
            return path
        for name, (dr, dc) in moves.items():
            nxt = (r + dr, c + dc)
            inside = 0 <= nxt[0] < 4 and 0 <= nxt[1] < 4
            if inside and nxt not in seen and rows[nxt[0]][nxt[1]] != "O":
                seen.add(nxt)
                frontier.append((nxt, [*path, name]))
    raise AssertionError("the seeded map has no path")


RAGEN = ROOT / "tests/fixtures/trainer-dumps/ragen/val_rollouts_20261125_101500.jsonl"


def test_ragens_export_gives_its_episodes(tmp_path):
    result = collapsecheck("score", RAGEN, "-c", HEALTHY, "--dump", tmp_path, "--bootstrap", "100",
                           "--fail-on", "none", "--markdown", tmp_path / "summary.md")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in RAGEN.open()]
    episodes = episodes_of(tmp_path)
    assert len(episodes) == len(rows)
    for row, episode in zip(rows, episodes, strict=True):
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        # each state the user message less RAGEN's " (reward: r)"; the export ends with the
        # observation after the last turn
        assert [t["state"] for t in episode["turns"]] == [
            u.split(" (reward:")[0] for u in users[:-1]
        ]
        assert episode["final_state"] == users[-1].split(" (reward:")[0]
        assert episode["success"] is row["metadata"]["success"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [e["turn"] for e in report["by_turn"]] == [1, 2]
    assert report["episodes"]["episodes"] == len(rows)
    assert not math.isnan(report["metrics"]["revisit_rate"]["value"])
    summary = (tmp_path / "summary.md").read_text()
    assert f"**Episodes: `{report['episodes']['regime']}`**" in summary
    assert "**Input dependence by turn** (normalized MI): turn 1 " in summary
    assert "| episodes | pass |" in summary  # the gate's episodes rule, outside --fail-on


def test_a_state_regex_picks_the_state_out_of_each_observation(tmp_path):
    rows = []
    for n in range(4):
        states = [f"agent {n},0 goal 5,5", f"agent {n},1 goal 5,5", f"agent {n},0 goal 5,5"]
        turns = [
            {"messages": [{"role": "user", "content": f"Turn {i + 1}: {s}"}],
             "response": "<think>me</think><answer>right</answer>"}
            for i, s in enumerate(states)
        ]  # fmt: skip
        rows.append({"turns": turns, "final_state": f"Turn 4: agent {n},1 goal 5,5"})
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = collapsecheck("score", path, "-c", HEALTHY, "--json", tmp_path / "plain.json",
                          "--bootstrap", "50", "--fail-on", "none")  # fmt: skip
    picked = collapsecheck("score", path, "-c", HEALTHY, "--json", tmp_path / "picked.json",
                           "--bootstrap", "50", "--fail-on", "none",
                           "--state-regex", r"Turn \d+: (.*)")  # fmt: skip
    assert plain.returncode == 0 and picked.returncode == 0, plain.stderr + picked.stderr
    plain_report = json.loads((tmp_path / "plain.json").read_text())
    picked_report = json.loads((tmp_path / "picked.json").read_text())
    # with the turn counter every state is new; without it the agent goes back and forth
    assert plain_report["metrics"]["revisit_rate"]["value"] == 0
    assert picked_report["metrics"]["revisit_rate"]["value"] == pytest.approx(2 / 3)
    assert picked_report["metrics"]["undo_rate"]["value"] == pytest.approx(2 / 3)


WALKER, UNDOER = EXAMPLES / "agents" / "walker", EXAMPLES / "agents" / "undoer"
AGENT_FLAGS = ("--context-window", "1", "--max-turns", "8", "-n", "8", "-k", "4",
               "--max-new-tokens", "48", "--bootstrap", "200")  # fmt: skip


def test_the_demo_agents_walk_and_loop(tmp_path):
    """The demo agents (scripts/make_agents.py): both read their state, the walker gets to
    its goal, the undoer goes back and forth, which the gate fails with --fail-on looping."""
    walker = collapsecheck("scan", WALKER, "--env", f"{GRIDWORLD}:make", *AGENT_FLAGS,
                           "--fail-on", "looping", "--json", tmp_path / "walker.json")  # fmt: skip
    assert walker.returncode == 0, walker.stderr
    undoer = collapsecheck("scan", UNDOER, "--env", f"{GRIDWORLD}:make", *AGENT_FLAGS,
                           "--fail-on", "looping", "--json", tmp_path / "undoer.json")  # fmt: skip
    assert undoer.returncode == 1
    assert "gate failed (rule: episodes): episodes verdict looping" in " ".join(
        undoer.stderr.split()
    )
    walked, looped = (
        json.loads((tmp_path / f"{n}.json").read_text()) for n in ("walker", "undoer")
    )
    assert walked["verdict"]["regime"] == looped["verdict"]["regime"] == "grounded"
    assert walked["episodes"]["regime"] == "progressing"
    assert looped["episodes"]["regime"] == "looping"
    assert looped["metrics"]["undo_rate"]["low"] > walked["metrics"]["undo_rate"]["high"]
    assert walked["metrics"]["success_rate"]["value"] > looped["metrics"]["success_rate"]["value"]


def test_a_run_is_played_step_by_step_and_watched(tmp_path):
    import shutil

    run = tmp_path / "run"
    for step, source in ((100, WALKER), (200, UNDOER)):
        shutil.copytree(source, run / f"checkpoint-{step}")
        state = {"global_step": step, "log_history": []}
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state))
    flags = ("--env", f"{GRIDWORLD}:make", *AGENT_FLAGS, "--fail-on", "none", "--out",
             tmp_path / "cache")  # fmt: skip
    scanned = collapsecheck("scan", run, *flags, "--json", tmp_path / "run.json")
    assert scanned.returncode == 0, scanned.stderr
    assert "episodes" in scanned.stdout and "played in --env" in scanned.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["traces"].startswith("played by collapsecheck in --env")
    readings = [s["report"]["episodes"]["regime"] for s in report["steps"]]
    assert readings == ["progressing", "looping"]
    (tmp_path / "done").write_text("")
    watched = collapsecheck("watch", run, *flags, "--until", tmp_path / "done", "--idle", "5",
                            "--poll", "0.2", "--json", tmp_path / "watched.json")  # fmt: skip
    assert watched.returncode == 0, watched.stderr
    again = json.loads((tmp_path / "watched.json").read_text())
    # the same units: the watch reads both steps from the results cache the scan filled
    assert [s["report"]["episodes"]["regime"] for s in again["steps"]] == readings
    assert all(s["report"]["timing"].get("cached") for s in again["steps"])


def test_roll_agentic_trajectories_give_episodes_without_a_final_state():
    """ROLL's agentic dump (written by ROLL's own code, scripts/make_roll_dumps.py): each
    turn's state its context's last user message; the dump does not say the observation after
    the last turn, so the last turn is not a step."""
    from collapsecheck.inputs.rollouts import RolloutOptions, parse_rollouts

    path = ROOT / "tests/fixtures/trainer-dumps/roll-agentic/rollout_dump_data.step_7.jsonl"
    parsed = parse_rollouts(path, RolloutOptions())
    assert parsed.episodes and all(e.final_state is None for e in parsed.episodes)
    for group in parsed.groups:
        (turn,) = group
        messages = turn.prompt.content
        last_user = [m["content"] for m in messages if m["role"] == "user"][-1]
        episode_states = {t.state for e in parsed.episodes for t in e.turns}
        assert last_user in episode_states


def test_an_environment_pickles_as_its_spec_and_loads_again_elsewhere(tmp_path, monkeypatch):
    import pickle

    from collapsecheck.inputs.environments import load_environment

    monkeypatch.chdir(ROOT)  # the SPEC as a user in the repository types it
    spec = load_environment(str(GRIDWORLD.relative_to(ROOT)) + ":make", {"size": 5})
    monkeypatch.chdir(tmp_path)  # a Ray worker's working directory is its own
    again = pickle.loads(pickle.dumps(spec))
    assert again.spec == spec.spec and again.kwargs == {"size": 5}
    assert again.origin == GRIDWORLD and again.make(0).reset(seed=3) == spec.make(0).reset(seed=3)


def test_a_cached_multi_turn_report_without_episodes_is_made_again(tmp_path):
    """A results-cache entry of a multi-turn file written before its episodes were read is
    scanned again, not read back without them; one written since is read."""
    from collapsecheck.runs.units import made_before_its_rules

    saved = {"counts": {"input_rows": 4}, "settings": {"multi_turn": {"pairs": 4}}}
    report = tmp_path / "report.json"
    report.write_text(json.dumps(saved))
    assert made_before_its_rules(report)
    report.write_text(json.dumps({**saved, "episodes": {"regime": "looping"}}))
    assert not made_before_its_rules(report)
    report.write_text(json.dumps({"counts": {"input_rows": 4}, "settings": {}}))
    assert not made_before_its_rules(report)  # single-turn prompts have no episodes


@pytest.mark.parametrize(("window", "kept"), [(-1, 3), (1, 0), (2, 1), (3, 2), (5, 3)])
def test_the_context_window_keeps_the_last_observations(window, kept):
    """--context-window W: the current observation and the W - 1 turns before it (-1: all)."""
    from collapsecheck.inputs.environments import Environment, load_environment
    from collapsecheck.inputs.environments.factories import FactoryGame
    from collapsecheck.inputs.episodes import EpisodeTurn
    from collapsecheck.settings import PromptSettings

    spec = load_environment(f"{EXAMPLES / 'environments' / 'gridworld.py'}:make", {})
    episode = FactoryGame(Environment(spec, 0), window, PromptSettings())
    episode.system, episode.observation = "be brief", "now"
    episode.turns = [EpisodeTurn(f"state {t}", f"response {t}", "up") for t in range(3)]
    chat = episode.messages()
    assert chat[0] == {"role": "system", "content": "be brief"}
    assert chat[-1] == {"role": "user", "content": "now"}
    earlier = [m["content"] for m in chat[1:-1] if m["role"] == "user"]
    assert earlier == [f"state {t}" for t in range(3 - kept, 3)]


# -- compare A B --env: two checkpoints on the same start states ---------------------------------

PAIRED_FLAGS = ("--context-window", "1", "--max-turns", "6", "-n", "6", "-k", "3",
                "--max-new-tokens", "48", "--bootstrap", "200")  # fmt: skip


def test_compare_plays_both_from_the_same_start_states_and_pairs_their_episodes(tmp_path):
    """SPEC "Comparing two checkpoints on the same start states": both played (through the
    results cache), the episode metrics' changes with paired intervals over start states, and
    B's worse episodes fail the gate's `episodes` rule."""
    flags = ("--env", f"{GRIDWORLD}:make", *PAIRED_FLAGS, "--out", tmp_path / "cache")
    result = collapsecheck("compare", WALKER, UNDOER, *flags, "--json", tmp_path / "c.json")
    assert result.returncode == 1, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "gate failed (rule: episodes): on the same start states, B's" in said
    assert "paired over start states (both played the same seeds)" in said
    compared = json.loads((tmp_path / "c.json").read_text())
    assert compared["episodes_paired"] and "revisit_rate" in compared["episodes_worse"]
    revisit = compared["metrics"]["revisit_rate"]
    assert revisit["delta"]["low"] > 0
    # the other way round nothing is worse, and both are read back from the cache
    again = collapsecheck("compare", UNDOER, WALKER, *flags, "--json", tmp_path / "r.json")
    assert again.returncode == 0, again.stderr
    assert "playing" not in again.stderr  # both read back from the results cache
    reverse = json.loads((tmp_path / "r.json").read_text())
    assert reverse["episodes_paired"] and reverse["episodes_worse"] == []
    assert reverse["metrics"]["revisit_rate"]["delta"]["high"] < 0


def test_episodes_from_other_start_states_are_not_paired_and_it_is_said(tmp_path):
    for name, agent, seed in (("a", WALKER, "0"), ("b", UNDOER, "100")):
        played = collapsecheck(
            "scan",
            agent,
            "--env",
            f"{GRIDWORLD}:make",
            *PAIRED_FLAGS,
            "--env-seed",
            seed,
            "--fail-on",
            "none",
            "--dump",
            tmp_path / name,
        )
        assert played.returncode == 0, played.stderr
    refused = collapsecheck("compare", tmp_path / "a", tmp_path / "b")
    assert refused.returncode == 2
    assert "environment's env_seed: A 0, B 100" in refused.stderr
    anyway = collapsecheck("compare", tmp_path / "a", tmp_path / "b", "--allow-mismatch",
                           "--json", tmp_path / "c.json")  # fmt: skip
    assert "episodes not paired: A and B played other start states" in " ".join(
        anyway.stdout.split()
    ) + " ".join(anyway.stderr.split())
    assert not json.loads((tmp_path / "c.json").read_text())["episodes_paired"]


def test_a_scan_that_stops_leaves_its_dump_and_json_as_they_were(tmp_path):
    """SPEC "Dump format": a played scan that stops at exit 2 (no reply has the reasoning
    segment asked for, found after playing) leaves no --dump and no --json behind; rerun into
    the dump of a scan that finished, it leaves that dump's bytes as they were."""
    dump, out = tmp_path / "dump", tmp_path / "report.json"
    walker, env = EXAMPLES / "agents" / "walker", f"{GRIDWORLD}:make"
    asked = ("--reasoning-tags", "<plan>,</plan>")
    stopped = collapsecheck("scan", walker, "--env", env, *SMALL, *asked, "--dump", dump,
                            "--json", out)  # fmt: skip
    assert stopped.returncode == 2 and "no response had a reasoning segment" in stopped.stderr
    assert not dump.exists() and not out.exists()
    done = collapsecheck("scan", walker, "--env", env, *SMALL, "--dump", dump)
    assert done.returncode == 0, done.stderr
    before = {path.name: path.read_bytes() for path in dump.iterdir()}
    assert "episodes.jsonl" in before and "report.json" in before
    again = collapsecheck("scan", walker, "--env", env, *SMALL, *asked, "--dump", dump)
    assert again.returncode == 2
    assert {path.name: path.read_bytes() for path in dump.iterdir()} == before
