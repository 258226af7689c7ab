"""OpenEnv's environments (`--env openenv:FILE.py:CLASS`, SPEC "Every framework's environment")
for real: an OpenEnv `Environment` of collapsecheck's own (tests/fixtures/environments/openenv,
a seeded number-guessing game built on openenv.core's classes) played by the demo agent, its
contexts the chat the template renders, its dump replayed in fresh environments, the Action
read from the class, the observation's text, the seed's reach, and every fault one line."""

import importlib.util
import json
import pickle
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

GAME = ROOT / "tests" / "fixtures" / "environments" / "openenv" / "guess.py"
AGENT = EXAMPLES / "agents" / "walker"
SMALL = ("-n", "3", "-k", "2", "--max-turns", "3", "--max-new-tokens", "32", "--fail-on", "none")


def one_error(result: subprocess.CompletedProcess) -> str:
    """The one line an error is said in (progress lines may come before it)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return line


def game_module():
    spec = importlib.util.spec_from_file_location("openenv_guess_replay", GAME)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic models look their module up
    spec.loader.exec_module(module)
    return module


def load(name: str, **kwargs: Any):
    from collapsecheck.inputs.environments import load_environment

    return load_environment(name, kwargs, timeout=30)


def settings(spec):
    from collapsecheck.settings import EnvSettings

    return EnvSettings(env=spec.spec, env_timeout=30)


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """The demo agent played in the game (secrets from 1 to 3, so some guesses land)."""
    dump = tmp_path_factory.mktemp("played")
    result = collapsecheck("scan", AGENT, "--env", f"openenv:{GAME}:NumberGuess",
                           "--env-arg", "high=3", *SMALL, "--dump", dump)  # fmt: skip
    assert result.returncode == 0, result.stderr
    episodes = [json.loads(line) for line in (dump / "episodes.jsonl").open()]
    return dump, episodes


def test_a_played_scan_replays_from_its_dump(played):
    """Each episode replayed in a fresh environment at its seed, through the spec and through
    the class itself given each whole reply as its Action, returns what was recorded."""
    _, episodes = played
    assert [e["seed"] for e in episodes] == [0, 0, 1, 1, 2, 2]
    module, spec = game_module(), load(f"openenv:{GAME}:NumberGuess", high=3)
    for episode in episodes:
        game, own = spec.game(episode["seed"], settings(spec), None), module.NumberGuess(high=3)
        assert game.observation == episode["turns"][0]["state"]
        assert own.reset(seed=episode["seed"]).prompt == game.observation
        for number, turn in enumerate(episode["turns"], start=1):
            assert turn["given"] == turn["response"]
            played_turn = game.play(turn["response"], "", number)
            observation = own.step(module.GuessAction(guess=turn["response"]))
            assert turn["returned"] == [{"role": "user", "content": observation.prompt}]
            assert list(played_turn.turn.returned) == turn["returned"]
            assert played_turn.turn.reward == turn["reward"] == (observation.reward or 0.0)
            assert turn["info"] == observation.metadata
            assert played_turn.done is observation.done
        assert game.observation == episode["final_state"] == observation.prompt
        assert episode["done"] is observation.done
        assert episode["success"] is (True if observation.done else None)
    assert any(e["success"] for e in episodes) and any(not e["done"] for e in episodes)


def test_each_context_is_the_chat_so_far_as_the_template_renders_it(played):
    """Reset's observation the first user message, each reply an assistant message and each
    step's observation a new user message, rendered by the checkpoint's chat template."""
    from transformers import AutoTokenizer

    dump, episodes = played
    tokenizer = AutoTokenizer.from_pretrained(AGENT)
    expected = set()
    for episode in episodes:
        chat = [{"role": "user", "content": episode["turns"][0]["state"]}]
        for turn in episode["turns"]:
            expected.add(tokenizer.apply_chat_template(chat, tokenize=False,
                                                       add_generation_prompt=True))  # fmt: skip
            chat += [{"role": "assistant", "content": turn["response"]}, *turn["returned"]]
    texts = {json.loads(line)["text"] for line in (dump / "prompts.jsonl").open()}
    assert texts == expected


def test_the_action_class_is_read_from_step_or_the_environments_parameters():
    import openenv.core as core

    from collapsecheck.inputs.environments.openenv import action_class

    module = game_module()
    assert action_class(core, module.NumberGuess) is module.GuessAction  # Environment[A, O, S]
    assert action_class(core, module.AnnotatedGuess) is module.GuessAction  # step(action: A)
    assert action_class(core, module.Undeclared) is None  # step(action: Action)


def test_an_observation_is_its_newest_message_else_its_one_text_else_json():
    from openenv.core import Observation

    from collapsecheck.inputs.environments.openenv import observation_text

    class Chat(Observation):
        messages: list[dict[str, str]]

    class Board(Observation):
        board: str

    class Grid(Observation):
        rows: list[str]
        player: int

    chat = Chat(messages=[{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    assert observation_text(chat) == "b"
    assert observation_text(Board(board="#.#", reward=1.0, done=True)) == "#.#"
    grid = Grid(rows=["P_", "_G"], player=0, metadata={"x": 1})
    assert observation_text(grid) == '{"rows": ["P_", "_G"], "player": 0}'
    assert observation_text(Chat(messages=[])) == '{"messages": []}'


def test_a_bare_factory_of_an_openenv_environment_is_played_as_openenv():
    bare, named = load(f"{GAME}:make_guess"), load(f"openenv:{GAME}:NumberGuess")
    assert bare.framework == named.framework == "OpenEnv"
    one, other = bare.game(5, settings(bare), None), named.game(5, settings(named), None)
    assert [one.play(r, "", 1).turn.returned for r in ("3", "9", "x")] == [
        other.play(r, "", 1).turn.returned for r in ("3", "9", "x")
    ]


def test_the_global_generators_are_each_episodes_own_and_seeded():
    """A game that draws from Python's global generator at reset: one seed, one opening,
    however episodes interleave; an environment whose opening the seed cannot reach gets a
    note."""
    spec = load(f"openenv:{GAME}:GlobalDraws")
    alone = spec.game(3, settings(spec), None).observation
    openings = [spec.game(seed, settings(spec), None).observation for seed in (3, 4, 3)]
    assert openings[0] == openings[2] == alone != openings[1]
    assert spec.notes == ()
    (note,) = load(f"openenv:{GAME}:Unseeded").notes
    assert "two OpenEnv environments reset at seed 0 start differently" in note


def test_a_scan_says_once_and_reports_that_its_episodes_are_not_reproducible(tmp_path):
    result = collapsecheck("scan", AGENT, "--env", f"openenv:{GAME}:Unseeded", "-n", "2", "-k",
                           "1", "--max-turns", "2", "--max-new-tokens", "32", "--fail-on", "none",
                           "--whole-response", "--json", tmp_path / "report.json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split()) + " ".join(result.stderr.split())
    assert said.count("not reproducible by seed") == 1, said
    notes = json.loads((tmp_path / "report.json").read_text())["settings"]["env"]["env_notes"]
    assert len(notes) == 1 and "not reproducible by seed" in notes[0]


def test_a_loaded_spec_travels_to_another_process_as_its_spec():
    spec = load(f"openenv:{GAME}:NumberGuess", high=7)
    again = pickle.loads(pickle.dumps(spec))
    assert (again.spec, again.code_sha256) == (spec.spec, spec.code_sha256)
    replies = ("4", "2", "6")
    first, second = spec.game(2, settings(spec), None), again.game(2, settings(again), None)
    assert [first.play(r, "", 1).turn.returned for r in replies] == [
        second.play(r, "", 1).turn.returned for r in replies
    ]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("TwoFields", "TwoFields's action MoveAction (row: str, column: str) does not have "
         "exactly one required text field for the whole reply (wrap it as a TRL "
         "environment_factory class"),
        ("Undeclared", "Undeclared names no Action class of its own (annotate step's action"),
        ("Tools", "Tools is an MCP environment, its actions tool calls (wrap it as a TRL"),
        ("State", "makes a State, not an OpenEnv Environment"),
    ],
)  # fmt: skip
def test_an_environment_that_cannot_take_the_reply_is_refused_at_load(name, said):
    from collapsecheck.errors import CollapsecheckError

    with pytest.raises(CollapsecheckError) as refused:
        load(f"openenv:{GAME}:{name}")
    line = str(refused.value)
    assert line.startswith(f"--env openenv:{GAME}:{name}: ") and said in line, line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("Raising", "the environment raised RuntimeError: the board caught fire"),
        ("WrongShape", "step returned dict, not an OpenEnv Observation"),
        ("Sleeping", "the environment gave no answer within 1 s (--env-timeout)"),
    ],
)
def test_an_environment_at_fault_while_played_is_one_line_naming_it(name, said):
    result = collapsecheck("scan", AGENT, "--env", f"openenv:{GAME}:{name}", "-n", "2", "-k",
                           "1", "--max-new-tokens", "8", "--env-timeout", "1")  # fmt: skip
    line = one_error(result)
    assert f"--env openenv:{GAME}:{name} (OpenEnv" in line and "seed 0" in line, line
    assert "turn 1" in line and line.endswith(said), line


def test_a_missing_class_is_one_line_before_the_model_loads():
    line = one_error(collapsecheck("scan", AGENT, "--env", f"openenv:{GAME}:Nope"))
    assert line == f"error: --env openenv:{GAME}:Nope: {GAME} has no factory 'Nope'"


def test_a_missing_openenv_is_one_line_naming_the_extra():
    hidden = (
        "import sys; sys.modules['openenv'] = None; "
        f"sys.argv = ['collapsecheck', 'scan', {str(AGENT)!r}, '--env', "
        f"'openenv:{GAME}:NumberGuess']; from collapsecheck.cli import main; main()"
    )
    result = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True,
                            timeout=300, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    line = one_error(result)
    assert line.endswith("openenv.core is not installed (pip install 'collapsecheck[openenv]')")
