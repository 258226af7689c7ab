"""`--env ragen:TAG` (SPEC "RAGEN's own environments"): RAGEN's environments played as RAGEN's
managers play them.

RAGEN is on no package registry, so CI cannot run it. tests/fixtures/ragen/ holds what RAGEN's own
`EnvStateManager`, `ContextManager` and environment classes did for scripted replies (made by
scripts/make_ragen_record.py from RAGEN 20daedc, with each case's config saved by Hydra): every
prompt text, the parsed actions, the ids executed, the render after each, the rewards, the penalty
and the success. The adapter is played against those records (`Replay`: each recorded episode's
renders, rewards and infos, its executed ids checked as they come), and against RAGEN's live
classes where RAGEN's source is present (`RAGEN_SRC`, or the snapshot the record was made from).
A played scan runs end to end on a RAGEN-shaped package of collapsecheck's own
(tests/fixtures/ragen-shaped)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from collapsecheck.inputs.environments.ragen import RagenGame, rules_for
from collapsecheck.inputs.environments.ragen_classes import RagenClasses
from collapsecheck.inputs.environments.ragen_config import compose, setup_for
from collapsecheck.settings import PromptSettings
from tests.conftest import EXAMPLES, HEALTHY, ROOT

RECORDS = ROOT / "tests" / "fixtures" / "ragen"
CASES = sorted(p.name for p in RECORDS.iterdir() if (p / "record.json").is_file())
SHAPED = ROOT / "tests" / "fixtures" / "ragen-shaped"
RAGEN_SNAPSHOT = Path("/work/.mirror/mll-lab-nu+RAGEN/repo")
RAGEN_COMMIT = "20daedc47558e000f7de912b060646bf2e8026bd"


def record(case: str) -> dict[str, Any]:
    return json.loads((RECORDS / case / "record.json").read_text())


def config_of(case: str):
    return compose(RECORDS / case / ".hydra" / "config.yaml")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(HEALTHY)


def replay_classes(case: str, tag: str) -> RagenClasses:
    """RAGEN's classes as the record saw them: a config class with the defaults RAGEN's system
    message read, and an environment that gives each recorded episode's renders, rewards and
    infos, in the order RAGEN's manager reset them at each seed, and refuses an action id other
    than the one RAGEN executed."""
    saved = record(case)
    defaults = saved["config_class_defaults"][tag]
    episodes = [e for e in saved["episodes"] if e["tag"] == tag]

    def config_class(**options):
        values = {**defaults, **{k: v for k, v in options.items() if k not in defaults}}
        fields = [(k, Any, dataclasses.field(default_factory=lambda v=v: copy.deepcopy(v)))
                  for k, v in values.items()]  # fmt: skip
        return dataclasses.make_dataclass("RecordedConfig", fields)()

    claimed: set[int] = set()

    class Replay:
        def __init__(self, config):
            self.config = config

        def reset(self, seed=None, mode=None):
            episode = next(e for e in episodes if e["seed"] == seed
                           and e["env_id"] not in claimed)  # fmt: skip
            claimed.add(episode["env_id"])
            lookup = episode["action_lookup"]
            self.config.action_lookup = None if lookup is None else {
                int(k) if k.lstrip("-").isdigit() else k: v for k, v in lookup.items()
            }  # fmt: skip
            self.steps = iter(s for t in episode["turns"] for s in t["steps"])
            self.shown = episode["reset_render"]

        def render(self):
            return self.shown

        def step(self, action):
            step = next(self.steps)
            assert action == step["action"], f"executed {action!r}, RAGEN {step['action']!r}"
            self.shown = step["render"]
            reward = int(step["reward"]) if step["reward_type"] == "int" else step["reward"]
            return None, reward, step["done"], step["info"]

    return RagenClasses(tag, Replay, config_class, RECORDS / case)


@pytest.mark.parametrize("case", CASES)
def test_every_turn_is_what_ragens_managers_did(case, tokenizer):
    """Prompts equal to RAGEN's rendering (system and turn texts, the chat template and
    `<think>`), the replies parsed, looked up, capped and penalised as RAGEN did, the same ids
    executed, renders, rewards and success."""
    saved = record(case)
    config = config_of(case)
    for tag in saved["tags"]:
        rules = rules_for(setup_for(config, tag), replay_classes(case, tag))
        for episode in (e for e in saved["episodes"] if e["tag"] == tag):
            play_recorded(rules, episode, tokenizer)


def play_recorded(rules, episode: dict[str, Any], tokenizer) -> None:
    game = RagenGame(rules, episode["seed"], "--env ragen")
    assert game.observation == episode["reset_render"]
    played = None
    for number, turn in enumerate(episode["turns"], start=1):
        assert played is None or not played.done
        _, rendered = game.context(tokenizer, PromptSettings(), f"turn {number}")
        assert rendered.text == turn["prompt_text"], (episode["env_id"], number)
        assert list(rendered.ids) == tokenizer(turn["prompt_text"])["input_ids"]
        played = game.play(turn["reply"], "", number)
        assert list(played.turn.parsed_actions) == turn["actions"]
        assert list(played.turn.action_ids) == [s["action"] for s in turn["steps"]]
        assert list(played.turn.renders) == [s["render"] for s in turn["steps"]]
        assert played.turn.reward == turn["reward"]
        assert played.turn.penalty == turn["penalty"]
        assert played.observation == turn["state_after"]
    assert played is not None and played.success is episode["success"]
    max_turn = rules.setup.max_turn.value
    assert played.done or len(episode["turns"]) == max_turn  # RAGEN went on while it was not


@pytest.mark.parametrize("case", CASES)
def test_seeds_and_temperature_are_read_from_the_saved_config(case):
    """The seeds RAGEN's es_manager handed each validation group (`seed.val` + the group's
    index over every validation tag), `group_size` episodes each, and the validation
    temperature, each named with the key it came from."""
    saved = record(case)
    config = config_of(case)
    for tag in saved["tags"]:
        setup = setup_for(config, tag)
        size = setup.group_size.value
        expected = [e["seed"] for e in saved["episodes"] if e["tag"] == tag]
        seeds = [setup.first_seed.value + g for g in range(setup.groups.value) for _ in range(size)]
        assert seeds == expected, tag
        assert setup.temperature.value == saved["val_temperature"]
        assert setup.temperature.source.endswith(
            "(actor_rollout_ref.rollout.val_kwargs.temperature)"
        )
        assert "seed.val" in setup.first_seed.source


def test_bandits_lookup_is_read_after_each_reset(tokenizer):
    """Bandit draws its arms' names at reset: the reply names an arm of its own episode, and
    the manager maps it through that episode's lookup, whatever case it is written in."""
    saved = record("bandit")
    lookups = {json.dumps(e["action_lookup"]) for e in saved["episodes"]}
    assert len(lookups) > 2  # the names differ from episode to episode
    upper = [t for e in saved["episodes"] for t in e["turns"] if t["actions"]
             and t["actions"][0].isupper() and t["steps"]]  # fmt: skip
    assert upper, "a reply naming its arm in capitals, executed"


# -- where RAGEN's source is present: its live classes ------------------------------------------


def ragen_source(tmp_path_factory) -> Path:
    """RAGEN's source: `RAGEN_SRC` (a checkout), else the snapshot the records were made from,
    extracted at their commit; skipped where neither is here (CI)."""
    if os.environ.get("RAGEN_SRC"):
        return Path(os.environ["RAGEN_SRC"])
    if not RAGEN_SNAPSHOT.is_dir():
        pytest.skip("RAGEN's source is not here (set RAGEN_SRC to a RAGEN checkout)")
    into = tmp_path_factory.mktemp("ragen-src")
    archive = subprocess.run(["git", "-C", str(RAGEN_SNAPSHOT), "archive", RAGEN_COMMIT, "ragen"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


@contextlib.contextmanager
def ragen_importable(source: Path):
    """`ragen` imported from `source` while inside, as it was outside after."""
    sys.path.insert(0, str(source))
    saved = {k: v for k, v in sys.modules.items() if k == "ragen" or k.startswith("ragen.")}
    for name in saved:
        del sys.modules[name]
    try:
        yield source
    finally:
        sys.path.remove(str(source))
        for name in [k for k in sys.modules if k == "ragen" or k.startswith("ragen.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def live_ragen(tmp_path_factory):
    with ragen_importable(ragen_source(tmp_path_factory)) as source:
        yield source


@pytest.mark.parametrize("case", CASES)
def test_ragens_live_classes_play_as_recorded(case, live_ragen, tokenizer):
    """RAGEN's own classes, loaded as `--env ragen:TAG` loads them (its package's __init__
    unrun), played with the recorded replies: the record, turn for turn. Bandit, whose arms
    depend on the instances built before it, is not reproducible by seed, and the scan says
    so."""
    from collapsecheck.errors import CollapsecheckError
    from collapsecheck.inputs.environments.ragen import CHECKED_SEEDS, load_ragen, reproducible
    from collapsecheck.inputs.environments.ragen_classes import ragen_classes

    saved = record(case)
    config = config_of(case)
    for tag in saved["tags"]:
        setup = setup_for(config, tag)
        try:
            classes = ragen_classes(setup.env_type, f"--env ragen:{tag}")
        except CollapsecheckError as err:  # its environment's own needs (gym_sokoban, ...)
            pytest.skip(str(err))
        rules = rules_for(setup, classes)
        if setup.env_type == "bandit":  # its seeds add a count of the instances built before
            first = setup.first_seed.value
            spec = f"ragen:{tag}"
            seeds = range(first, first + CHECKED_SEEDS)
            assert not all(reproducible(rules, seed, spec) for seed in seeds)
            (note,) = [n for n in load_ragen(tag, None, config.path).notes if "render" in n]
            assert "RAGEN's own run may differ" in note
            continue
        for episode in (e for e in saved["episodes"] if e["tag"] == tag):
            play_recorded(rules, episode, tokenizer)


# -- the command: a RAGEN-shaped package of collapsecheck's own ------------------------------------

AGENT = EXAMPLES / "agents" / "walker"


def collapsecheck(*args: Any, pythonpath: Path | None = SHAPED) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath) if pythonpath else ""}
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


def test_a_missing_ragen_is_one_line_before_the_model_loads():
    result = collapsecheck("scan", AGENT, "--env", "ragen:GridWorld",
                           "--env-config", SHAPED / "config.yaml", pythonpath=None)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "RAGEN is not installed" in lines[0], result.stderr
    assert "pip install -e RAGEN" in lines[0]


def test_a_missing_tag_is_one_line_naming_the_config():
    result = collapsecheck("scan", AGENT, "--env", "ragen:Sokoban",
                           "--env-config", SHAPED / "config.yaml")  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "no custom_envs entry 'Sokoban'" in line and "GridWorld, Other" in line
    assert str(SHAPED / "config.yaml") in line


def test_a_played_scan_says_where_each_value_came_from_and_replays_from_its_dump(tmp_path):
    """A RAGEN-shaped package's environment played by a checkpoint: the report names each
    value's source (the flags over the config), and each episode of the dump replayed in a
    fresh environment at its seed gives the same renders, rewards, penalties and success."""
    from collapsecheck.inputs.environments.ragen import load_ragen

    dump = tmp_path / "dump"
    flags = ["-n", "3", "--max-turns", "2", "--max-new-tokens", "48", "--fail-on", "none"]
    result = collapsecheck("scan", AGENT, "--env", "ragen:GridWorld", "--env-config",
                           SHAPED / "config.yaml", *flags, "--dump", dump)  # fmt: skip
    assert result.returncode == 0, result.stderr
    settings = json.loads((dump / "report.json").read_text())["settings"]
    sources = settings["env"]["env_sources"]
    config = str(SHAPED / "config.yaml")
    assert sources["env_seed"] == f"42 ({config} (seed.val) + 2 groups of earlier tags)"
    assert sources["k"] == f"2 ({config} (es_manager.val.group_size))"
    assert sources["num_prompts"] == "3 (-n)" and sources["max_turns"] == "2 (--max-turns)"
    assert sources["temperature"].startswith(f"0.7 ({config} (actor_rollout_ref.rollout.val_")
    assert settings["sampling"]["temperature"] == 0.7
    episodes = [json.loads(line) for line in (dump / "episodes.jsonl").open()]
    assert [e["seed"] for e in episodes] == [42, 42, 43, 43, 44, 44]
    assert any(t["penalty"] for e in episodes for t in e["turns"])  # the demo agent's replies
    with ragen_importable(SHAPED):
        spec = load_ragen("GridWorld", None, SHAPED / "config.yaml")
        for episode in episodes:
            game = spec.game(episode["seed"], None, None)
            assert game.observation == episode["turns"][0]["state"]
            for number, turn in enumerate(episode["turns"], start=1):
                played = game.play(turn["response"], "", number)
                assert list(played.turn.action_ids) == turn["action_ids"]
                assert list(played.turn.renders) == turn["renders"]
                assert (played.turn.reward, played.turn.penalty) == (
                    turn["reward"],
                    turn["penalty"],
                )
            assert game.observation == episode["final_state"]
            assert played.success is episode["success"] and played.done is episode["done"]


def test_no_config_beside_the_checkpoint_is_one_line_naming_the_flag():
    result = collapsecheck("scan", AGENT, "--env", "ragen:GridWorld")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "no RAGEN config found (no .hydra/config.yaml beside or up to 3 folders above" in line
    assert "--env-config FILE" in line


def test_a_loaded_tag_travels_to_another_process_as_its_tag_and_config():
    """A Ray task gets the spec pickled: it is loaded again there from its tag and its
    config's absolute path, never as code."""
    import pickle

    from collapsecheck.inputs.environments import load_environment

    with ragen_importable(SHAPED):
        spec = load_environment("ragen:GridWorld", {}, config=SHAPED / "config.yaml")
        again = pickle.loads(pickle.dumps(spec))
        assert again.spec == "ragen:GridWorld" and again.origin == spec.origin
        assert again.rules.setup.first_seed == spec.rules.setup.first_seed
        assert again.code_sha256 == spec.code_sha256
        assert again.game(42, None, None).observation == spec.game(42, None, None).observation


def test_the_python_api_resolves_the_config_as_the_command_does(tmp_path):
    """`collapsecheck.play` with a loaded `ragen:TAG` and no flags: RAGEN's groups, group size,
    seeds, turns and temperature."""
    from collapsecheck import load_environment, play
    from collapsecheck.settings import EnvSettings

    with ragen_importable(SHAPED):
        spec = load_environment("ragen:GridWorld", {}, config=SHAPED / "config.yaml")
        env = EnvSettings(env="ragen:GridWorld", env_config=SHAPED / "config.yaml", max_turns=2)
        report = play(AGENT, spec, env=env, max_new_tokens=48, device="cpu", bootstrap=50,
                      dump=tmp_path / "d")  # fmt: skip
    episodes = [json.loads(line) for line in (tmp_path / "d" / "episodes.jsonl").open()]
    assert sorted({e["seed"] for e in episodes}) == [42, 43, 44, 45]  # 4 groups from seed 42
    assert len(episodes) == 8  # group size 2
    assert report.settings["sampling"]["temperature"] == 0.7
    assert report.settings["env"]["env_sources"]["max_turns"] == "2 (--max-turns)"
