"""`--env textarena:ID` (SPEC "Every framework's environment"): TextArena's games played with
TextArena 0.7.4's own classes, as verifiers' TextArena task set plays them."""

from __future__ import annotations

import json
import pickle

import pytest
import textarena as ta
from transformers import AutoTokenizer

from collapsecheck.inputs.environments import load_environment
from collapsecheck.inputs.environments.textarena import newest_message
from collapsecheck.settings import EnvSettings, PromptSettings
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

AGENT = EXAMPLES / "agents" / "walker"
GUESS = "textarena:GuessTheNumber-v0"
REPLIES = ["I think it is [10]", "no idea", "[5]", "[15]"]


def played(spec: str, seed: int, replies: list[str]):
    """A game of the adapter played with `replies` (to its end or theirs)."""
    game = load_environment(spec).game(seed, EnvSettings(env=spec, env_seed=seed), None)
    turns = []
    for number, reply in enumerate(replies, start=1):
        turns.append(game.play(reply, "", number))
        if turns[-1].done:
            break
    return game, turns


def test_the_chat_is_textarenas_log_as_verifiers_plays_it():
    """The first user message is the game's whole first observation, each later one the newest
    message of its log after the same replies played in TextArena directly; each turn's context
    is that chat rendered by the checkpoint's own template."""
    game, turns = played(GUESS, 3, REPLIES)
    direct = ta.make("GuessTheNumber-v0")
    direct.reset(num_players=1, seed=3)
    expected = [{"role": "user", "content": direct.get_observation()[1]}]
    for reply in REPLIES:
        direct.step(reply.strip())
        log = direct.get_observation()[1]
        expected += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": log.rpartition("[GAME]")[2].strip()}]  # fmt: skip
    assert game.chat == expected
    assert "invalid move" in game.chat[4]["content"]  # "no idea" is not a move
    assert [t.turn.given for t in turns] == [r.strip() for r in REPLIES]
    assert [t.turn.state for t in turns[1:]] == [m["content"] for m in expected[2:-2:2]]
    tokenizer = AutoTokenizer.from_pretrained(AGENT)
    _, rendered = game.context(tokenizer, PromptSettings(), "test")
    assert rendered.text == tokenizer.apply_chat_template(
        expected, add_generation_prompt=True, tokenize=False
    )


def test_the_end_is_the_games_with_its_reward_for_player_zero():
    seed = 5
    secret = ta.make("GuessTheNumber-v0")
    secret.reset(num_players=1, seed=seed)
    number = secret.env.env.state.game_state["game_number"]
    _, turns = played(GUESS, seed, ["[1]", f"so [{number}]"])
    last = turns[-1]
    assert last.done and last.success is True and last.turn.reward == 1.0
    assert last.turn.returned == () and "guessed the correct number" in last.observation
    assert turns[0].turn.reward == 0.0 and not turns[0].done


def test_episodes_played_side_by_side_draw_as_each_alone():
    """Minesweeper places its mines from the global generator at the first reveal: two games
    played interleaved must see the boards each sees alone (each episode's draws its own)."""
    spec = "textarena:Minesweeper-v0-small"
    moves = ["[2 2]", "[0 0]", "[4 1]"]
    alone = [[t.turn.returned for t in played(spec, seed, moves)[1]] for seed in (1, 2)]
    games = [load_environment(spec).game(s, EnvSettings(env=spec, env_seed=s), None)
             for s in (1, 2)]  # fmt: skip
    together: list[list] = [[], []]
    for number, move in enumerate(moves, start=1):
        for index, game in enumerate(games):
            if not (together[index] and together[index][-1][1]):
                turn = game.play(move, "", number)
                together[index].append((turn.turn.returned, turn.done))
    assert [[r for r, _ in t] for t in together] == alone
    assert alone[0] != alone[1]


def test_a_played_scan_replays_from_its_dump(tmp_path):
    dump = tmp_path / "dump"
    flags = ["-n", "2", "-k", "2", "--max-turns", "3", "--max-new-tokens", "24", "--fail-on"]
    result = collapsecheck("scan", AGENT, "--env", GUESS, *flags, "none", "--dump", dump)
    assert result.returncode == 0, result.stderr
    episodes = [json.loads(line) for line in (dump / "episodes.jsonl").open()]
    assert [e["seed"] for e in episodes] == [0, 0, 1, 1]
    for episode in episodes:
        replies = [t["response"] for t in episode["turns"]]
        game, turns = played(GUESS, episode["seed"], replies)
        assert game.chat[0]["content"].endswith(episode["turns"][0]["state"])
        for turn, recorded in zip(turns, episode["turns"], strict=True):
            assert turn.turn.given == recorded["given"]
            assert [dict(m) for m in turn.turn.returned] == recorded["returned"]
            assert turn.turn.reward == recorded["reward"]
        assert game.observation == episode["final_state"]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("textarena:TicTacToe-v0", "TicTacToe-v0 is not a single-player game"),
        ("textarena:NoSuchGame-v0", "TextArena has no game 'NoSuchGame-v0'"),
    ],
)
def test_a_game_that_cannot_be_played_is_one_line_before_the_model(spec, said):
    result = collapsecheck("scan", AGENT, "--env", spec, "--fail-on", "none")
    line = " ".join(result.stderr.split())
    assert result.returncode == 2 and said in line, result.stderr
    assert "Traceback" not in result.stderr and "loading" not in result.stdout.lower()


def test_a_missing_textarena_names_the_extra():
    hide = "import sys; sys.modules['textarena'] = None; "
    result = collapsecheck("scan", AGENT, "--env", GUESS, code=hide)
    assert result.returncode == 2, result.stderr
    assert (
        "--env textarena:GuessTheNumber-v0: textarena is not installed (pip install "
        "'collapsecheck[textarena]')" in " ".join(result.stderr.split())
    )


def test_newest_message_is_the_text_after_the_last_game_mark():
    assert newest_message("\n[GAME] rules\n[Player] [3]\n[GAME] higher.") == "higher."
    assert newest_message("  no marks ") == "no marks"


GAMES = ROOT / "tests" / "fixtures" / "environments" / "textarena" / "games.py"


@pytest.mark.parametrize("spec", [f"{GAMES}:guess", f"textarena:{GAMES}:guess"])
def test_a_factorys_textarena_game_is_played_as_textarena_id_is(spec):
    """A factory of the user's own that makes a TextArena game, bare or named: the same chat,
    given and returned as `textarena:ID` plays that game."""
    factory = load_environment(spec, {"high": 20})
    assert factory.framework == "TextArena" and factory.spec == spec
    ours, turns = played(spec, 3, REPLIES)
    theirs, expected = played(GUESS, 3, REPLIES)
    assert ours.chat == theirs.chat
    assert [t.turn.returned for t in turns] == [t.turn.returned for t in expected]
    again = pickle.loads(pickle.dumps(factory))
    assert (again.spec, again.code_sha256) == (factory.spec, factory.code_sha256)


def test_a_factory_two_frameworks_claim_is_refused_naming_their_prefixes():
    from collapsecheck.errors import CollapsecheckError

    with pytest.raises(CollapsecheckError) as refused:
        load_environment(f"{GAMES}:both")
    said = str(refused.value)
    assert "has what gem and textarena environments have" in said
    assert f"--env gem:{GAMES}:both or textarena:{GAMES}:both" in said


def test_one_scored_trace_of_a_played_scan_carries_no_verdict(tmp_path):
    """SPEC "Enough to carry a verdict" on `scan --env`: the walker, not trained in
    TextArena's format, writes its reasoning tags in one of its 16 replies. The verdict is
    inconclusive and says what was scored of what; the matrix's metrics have no interval."""
    out = tmp_path / "report.json"
    flags = ["-n", "4", "-k", "2", "--max-turns", "3", "--max-new-tokens", "48"]
    result = collapsecheck("scan", AGENT, "--env", GUESS, *flags, "--json", out)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["counts"]["scored_traces"] == 1 and report["counts"]["scored_prompts"] == 1
    verdict = report["verdict"]
    assert verdict["regime"] == "inconclusive"
    assert verdict["reason"].startswith("1 trace scored of 16: 15 have no reasoning segment")
    assert "verdict: inconclusive" in result.stdout
    for key in ("normalized_mi", "retrieval_skill", "conditional_entropy_est"):
        assert report["metrics"][key]["low"] is None and report["metrics"][key]["high"] is None
