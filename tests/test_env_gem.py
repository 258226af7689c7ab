"""`--env gem:ID` (SPEC "Every framework's environment"): GEM's environments played with GEM
0.1.0's own classes and observation wrappers, as GEM's trainers (examples/train_oat) play them;
a GEM environment of collapsecheck's own (tests/fixtures/environments/gem) for the faults."""

from __future__ import annotations

import json
import pickle
import random

import gem
import pytest
from gem.utils.parsing import extract_last_boxed_answer
from gem.wrappers.wrapper_factory import get_wrapper_fns
from transformers import AutoTokenizer

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from collapsecheck.settings import EnvSettings, PromptSettings
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

AGENT = EXAMPLES / "agents" / "walker"
GUESS = "game:GuessTheNumber-v0-easy"
HANOI = "game:TowerofHanoi-v0-easy"
TALLY = ROOT / "tests" / "fixtures" / "environments" / "gem" / "tally.py"
HANOI_SOLVED = ["\\boxed{A C}", "then \\boxed{A B}", "\\boxed{C B}", "\\boxed{A C}",
                "\\boxed{B A}", "so \\boxed{B C}", "finally \\boxed{A C}"]  # fmt: skip
QUIET = ("Wrappers requested", " - INFO - ")  # what GEM prints and logs on its own


def scan(*args):
    return collapsecheck("scan", AGENT, "--env", *args, "-n", "2", "-k", "2", "--max-new-tokens",
                         "24", "--fail-on", "none", "--whole-response")  # fmt: skip


def episode(spec: str, seed: int, **kwargs):
    return load_environment(spec, kwargs).game(seed, EnvSettings(env=spec, env_seed=seed), None)


def gems_own(game: str, wrappers: str, seed: int):
    """GEM's environment under GEM's wrappers, as its trainers build it, reset at `seed`."""
    env = gem.make(game)
    for wrap in get_wrapper_fns(wrappers):
        env = wrap(env)
    observation, _ = env.reset(seed=seed)
    return env, observation


def replies_for(game: str, env) -> list[str]:
    """Replies that win: a wrong guess then the number, or Hanoi solved."""
    if game == HANOI:
        return HANOI_SOLVED
    number = env.unwrapped.game_number
    return [f"I think \\boxed{{{number % 10 + 1}}}", f"\\boxed{{{number}}}"]


@pytest.mark.parametrize("wrappers", ["concat", "concat_with_action"])
@pytest.mark.parametrize("game", [GUESS, HANOI])
def test_each_turns_context_is_gems_own_wrapped_observation(game, wrappers):
    """Each turn's prompt is one user message, the observation GEM's own wrapped environment
    gives after the same replies, rendered by the checkpoint's template; the rewards, the end,
    the action (the last \\boxed{}) and the state (what is new) as GEM's step says."""
    tokenizer = AutoTokenizer.from_pretrained(AGENT)
    ours = episode(f"gem:{game}", 4, wrappers=wrappers)
    theirs, observation = gems_own(game, wrappers, 4)
    for number, reply in enumerate(replies_for(game, theirs), start=1):
        prompt, rendered = ours.context(tokenizer, PromptSettings(), "test")
        assert prompt.content == [{"role": "user", "content": observation}]
        assert rendered.text == tokenizer.apply_chat_template(
            prompt.content, add_generation_prompt=True, tokenize=False
        )
        turn = ours.play(reply, "located", number)
        observation, reward, terminated, truncated, info = theirs.step(reply)
        assert turn.turn.returned == ({"role": "user", "content": observation},)
        assert (turn.turn.reward, turn.done) == (reward, terminated or truncated)
        assert turn.turn.action == (extract_last_boxed_answer(reply) or "")
        assert turn.turn.given == reply and observation.endswith(turn.observation)
        assert turn.observation.endswith(info["suffix"])
    assert turn.done and turn.success is True and turn.turn.reward == 1.0


def test_a_format_error_ends_the_episode_as_no_success():
    number = gems_own(GUESS, "concat", 2)[0].unwrapped.game_number
    ours = episode(f"gem:{GUESS}", 2)
    first = ours.play(f"\\boxed{{{number % 10 + 1}}}", "", 1)
    assert not first.done and first.success is None and first.turn.reward == 0.0
    last = ours.play(f"the number is {number}", "", 2)
    assert last.done and last.success is False and last.turn.reward == -0.1
    assert last.turn.action == ""


def test_episodes_played_side_by_side_draw_as_each_alone():
    """Minesweeper places its mines from the global generator at the first reveal: two games
    played interleaved, the global generator drawn from between, see the boards each sees
    alone (each episode's draws its own)."""
    spec, moves = "gem:game:Minesweeper-v0-easy", ["\\boxed{reveal 2 2}", "\\boxed{reveal 0 0}"]

    def alone(seed):
        game = episode(spec, seed)
        return [game.play(move, "", n).turn.returned for n, move in enumerate(moves, start=1)]

    games = {seed: episode(spec, seed) for seed in (1, 2)}
    together: dict[int, list] = {1: [], 2: []}
    for number, move in enumerate(moves, start=1):
        for seed, game in games.items():
            random.random()
            together[seed].append(game.play(move, "", number).turn.returned)
    assert together == {1: alone(1), 2: alone(2)} and together[1] != together[2]


def replays(spec: str, episodes: list[dict], **kwargs) -> None:
    """Each recorded episode played again at its seed in a fresh environment gives what it
    gave: the returned messages, the rewards, the end, the state."""
    for recorded in episodes:
        game = episode(spec, recorded["seed"], **kwargs)
        assert game.observation == recorded["turns"][0]["state"]
        for number, turn in enumerate(recorded["turns"], start=1):
            played = game.play(turn["response"], "", number)
            assert played.turn.given == turn["given"] == turn["response"]
            assert [dict(m) for m in played.turn.returned] == turn["returned"]
            assert played.turn.reward == turn["reward"]
            assert turn["action"] == (extract_last_boxed_answer(turn["response"]) or "")
        assert (game.observation, played.done) == (recorded["final_state"], recorded["done"])


def test_a_played_game_replays_from_its_dump_with_a_clean_console(tmp_path):
    result = scan(f"gem:{GUESS}", "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"note: --env gem:{GUESS}: played with GEM's concat wrapper" in result.stderr
    assert not any(said in result.stdout + result.stderr for said in QUIET)
    assert "up to 4 turns each" in result.stderr  # the game's own max_turns
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").open()]
    assert [e["seed"] for e in episodes] == [0, 0, 1, 1]
    replays(f"gem:{GUESS}", episodes)


def test_a_factorys_gem_environment_is_played_as_gem_plays_it(tmp_path):
    """A bare FILE.py:FACTORY making a gem.core.Env is recognised as GEM's and played so: the
    concat wrapper, the environment's own draws, several turns replayed from the dump."""
    spec = f"{TALLY}:make"
    result = scan(spec, "--env-arg", "turns=3", "--max-turns", "3", "--dump", tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"note: --env {spec}: played with GEM's concat wrapper" in result.stderr
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").open()]
    assert [len(e["turns"]) for e in episodes] == [3] * 4 and all(e["done"] for e in episodes)
    assert episodes[0]["turns"][1]["returned"][0]["content"].startswith("Tally from")
    replays(spec, episodes, turns=3)


def test_gem_prefix_takes_a_factory_and_the_wrappers():
    source = load_environment(f"gem:{TALLY}:make", {"wrappers": "concat_with_action"})
    game = source.game(0, EnvSettings(env=source.spec, env_seed=0), None)
    turn = game.play("say \\boxed{go}", "", 1)
    assert "say \\boxed{go}\n" in turn.turn.returned[0]["content"]  # the reply in the history
    assert source.turns == 5 and "concat_with_action wrapper" in source.notes[0]


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [(f"gem:{HANOI}", {"wrappers": "concat_with_action"}), (f"{TALLY}:make", {"turns": 2}),
     (f"gem:{TALLY}:make", {"turns": 2})],
)  # fmt: skip
def test_a_loaded_spec_pickles_as_how_it_was_loaded(spec, kwargs):
    """A Ray task's process loads the spec again from what it was loaded with."""
    source = load_environment(spec, kwargs)
    again = pickle.loads(pickle.dumps(source))
    assert (again.spec, again.key(), again.turns, again.notes) == (
        source.spec, source.key(), source.turns, source.notes
    )  # fmt: skip
    settings = EnvSettings(env=spec, env_seed=3)
    assert again.game(3, settings, None).chat == source.game(3, settings, None).chat


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((f"{TALLY}:raises", "--max-turns", "3"),
         "seed 0, turn 2): the environment raised RuntimeError: the tally fell over"),
        ((f"{TALLY}:bad_step",), "seed 0, turn 1): step returned a tuple of 3, not "
                                 "(observation, reward, terminated, truncated, info)"),
        ((f"{TALLY}:not_text",), "seed 0, reset): reset: the observation is a int, not text"),
        ((f"{TALLY}:hangs", "--env-timeout", "1"),
         "seed 0, turn 1): the environment gave no answer within 1 s (--env-timeout)"),
    ],
)  # fmt: skip
def test_an_environment_at_fault_is_one_line_naming_gem_the_seed_and_the_turn(args, said):
    result = scan(*args)
    line = " ".join(result.stderr.split())
    assert result.returncode == 2 and said in line and f"{args[0]} (GEM" in line, result.stderr
    assert "Traceback" not in result.stderr and line.count("error:") == 1


@pytest.mark.parametrize(
    ("name", "kwargs", "said"),
    [
        ("game:GuessTheNumber-v0", {},
         "GEM has no environment 'game:GuessTheNumber-v0' (did you mean game:GuessTheNumber"),
        (GUESS, {"wrappers": "concat_chat"},
         "GEM's concat_chat wrapper renders the chat template inside the observation"),
        (GUESS, {"wrappers": "nope"}, "GEM has no wrapper 'nope' (it has python_tool, "),
        (f"{TALLY}:plain", {}, "the factory makes a Plain, not a GEM environment (a gem.core.Env)"),
    ],
)  # fmt: skip
def test_what_cannot_be_played_is_one_line_when_loaded(name, kwargs, said):
    with pytest.raises(CollapsecheckError) as refused:
        load_environment(f"gem:{name}", kwargs)
    assert str(refused.value).startswith(f"--env gem:{name}: {said}")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("hidden", "said"),
    [
        ("gem", "gem is not installed (pip install 'collapsecheck[gem]')"),
        ("requests", "gem.wrappers.wrapper_factory needs 'requests', which is not installed "
                     "(pip install 'collapsecheck[gem]')"),
    ],
)  # fmt: skip
def test_a_missing_package_names_the_extra(hidden, said):
    hide = f"import sys; sys.modules[{hidden!r}] = None; "
    result = collapsecheck("scan", AGENT, "--env", f"gem:{GUESS}", code=hide)
    line = " ".join(result.stderr.split())
    assert result.returncode == 2 and f"error: --env gem:{GUESS}: {said}" in line, result.stderr
