"""`--env skyrl:ID --prompts data.parquet` (SPEC "Every framework's environment"): SkyRL-gym
0.4.0's own environments over a dataset in SkyRL's format, played as SkyRL's generator
(`SkyRLGymGenerator.agent_loop`) plays them; a BaseTextEnv of collapsecheck's own
(tests/fixtures/environments/skyrl/) for a factory's environment and the faults."""

from __future__ import annotations

import copy
import json
import pickle

import datasets
import pandas as pd
import pytest
import skyrl_gym
from skyrl_gym.envs.sql.env import Text2SQLEnvConfig
from transformers import AutoTokenizer

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from collapsecheck.inputs.environments.skyrl import env_config, special_texts
from collapsecheck.settings import EnvSettings, PromptSettings
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

AGENT = EXAMPLES / "agents" / "walker"
COUNTING = ROOT / "tests" / "fixtures" / "environments" / "skyrl" / "counting.py"
MULTI = "skyrl:gsm8k_multi_turn"
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many?", "7"), ("2 times 5?", "10"),
             ("9 minus 4?", "5")]  # fmt: skip


def gsm8k_rows(env_class: str | None = "gsm8k_multi_turn") -> list[dict]:
    """Rows as SkyRL's examples/train/gsm8k/gsm8k_dataset.py writes them (multi-turn)."""
    return [
        {"data_source": "openai/gsm8k", "env_class": env_class,
         "prompt": [{"role": "user", "content": f"{q} Let's think step by step and output the "
                     "final answer after \"####\"."}],
         "reward_spec": {"method": "rule", "ground_truth": a},
         "extra_info": {"split": "test", "index": i, "answer": f"#### {a}", "question": q,
                        "max_turns": 3}}
        for i, (q, a) in enumerate(QUESTIONS)
    ]  # fmt: skip


def parquet(path, rows):
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return parquet(tmp_path_factory.mktemp("skyrl") / "gsm8k.parquet", gsm8k_rows())


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(AGENT)


def settings(spec: str, turns: int) -> EnvSettings:
    return EnvSettings(env=spec, env_seed=0, max_turns=turns, env_timeout=10)


def skyrl_played(path, row: int, outputs: list[str], max_turns: int):
    """SkyRL's agent loop, its own steps: the row as PromptDataset gives it (read by the
    `datasets` loader SkyRL reads parquet with), extras' max_turns the generator's, the env
    made, init, each output stepped and the chat updated as `_update_chat_history` does."""
    extras = datasets.load_dataset("parquet", data_files=str(path))["train"][row]
    prompt, env_class = extras.pop("prompt"), extras.pop("env_class")
    extras["max_turns"] = max_turns
    env = skyrl_gym.make(env_class, env_config={}, extras=copy.deepcopy(extras))
    chat, _ = env.init(copy.deepcopy(prompt))
    chats, steps = [copy.deepcopy(chat)], []
    for output in outputs:
        step = env.step(output)
        steps.append(step)
        chat += [{"role": "assistant", "content": output}] + step["observations"]
        chats.append(copy.deepcopy(chat))
        if step["done"]:
            break
    return chats, steps


def test_the_chat_and_contexts_are_skyrls_own(data, tokenizer):
    """Each turn's context is the checkpoint's template over the chat SkyRL's loop keeps
    (the prompt, each reply, each observation as new messages); rewards and done SkyRL's.
    A reply is given as SkyRL's engines decode it: without special tokens."""
    replies = ["I think it is 10.", "2*5=11<|end|>\n#### 11", "#### 10"]
    outputs = ["I think it is 10.", "2*5=11\n#### 11", "#### 10"]
    chats, steps = skyrl_played(data, 1, outputs, 3)
    game = load_environment(MULTI, dataset=data).game(1, settings(MULTI, 3), None)
    for turn, reply in enumerate(replies, start=1):
        _, rendered = game.context(tokenizer, PromptSettings(), "test")
        wanted = chats[turn - 1]
        assert rendered.text == tokenizer.apply_chat_template(
            wanted, add_generation_prompt=True, tokenize=False
        )
        assert list(rendered.ids) == tokenizer.apply_chat_template(
            wanted, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        played = game.play(reply, "", turn)
        step = steps[turn - 1]
        assert played.turn.given == outputs[turn - 1]
        assert (played.turn.reward, played.done) == (step["reward"], step["done"])
        assert list(played.turn.returned) == step["observations"]
    assert game.chat == chats[-1] and [s["reward"] for s in steps] == [0.0, 0.2 / 3, 1.0]
    assert played.done and game.observation == ""  # nothing observed after the end


def test_a_reply_loses_the_special_tokens_skyrls_decoding_skips(tokenizer):
    ids = tokenizer.encode("go left<|user|> now<unk>", add_special_tokens=False)
    kept = tokenizer.decode(ids, skip_special_tokens=False)  # what collapsecheck decodes
    for text in special_texts(tokenizer):
        kept = kept.replace(text, "")
    assert kept == tokenizer.decode(ids, skip_special_tokens=True) == "go left now"


def test_a_played_scan_replays_from_its_dump(data, tokenizer, tmp_path):
    """End to end: the demo agent played on every row; each episode replays turn for turn in
    a fresh environment at its seed, and every context is SkyRL's chat of the dump's turns."""
    dump = tmp_path / "dump"
    result = collapsecheck("scan", AGENT, "--env", MULTI, "--prompts", data, "-k", "2",
                           "--max-turns", "2", "--max-new-tokens", "24", "--whole-response",
                           "--bootstrap", "100", "--fail-on", "none", "--dump", dump)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "num_prompts 3 (the dataset's rows)" in " ".join(result.stderr.split())
    episodes = [json.loads(line) for line in (dump / "episodes.jsonl").open()]
    assert [e["seed"] for e in episodes] == [0, 0, 1, 1, 2, 2]
    spec, contexts = load_environment(MULTI, dataset=data), set()
    for episode in episodes:
        game = spec.game(episode["seed"], settings(MULTI, 2), None)
        chat = list(game.chat)
        for number, turn in enumerate(episode["turns"], start=1):
            contexts.add(tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                       tokenize=False))  # fmt: skip
            game.context(tokenizer, PromptSettings(), "replay")
            played = game.play(turn["response"], "", number)
            assert (played.turn.given, list(played.turn.returned), played.turn.reward) == (
                turn["given"], turn["returned"], turn["reward"])  # fmt: skip
            chat += [{"role": "assistant", "content": turn["given"]}, *turn["returned"]]
        assert (game.observation, played.done) == (episode["final_state"], episode["done"])
        assert episode["done"] and episode["success"] is None  # SkyRL's max_turns: 2
    texts = {json.loads(line)["text"] for line in (dump / "prompts.jsonl").open()}
    assert texts == contexts


def test_skyrl_colon_plays_each_rows_env_class(tmp_path):
    rows = gsm8k_rows()
    rows[0]["env_class"], rows[2]["env_class"] = "gsm8k", None
    spec = load_environment("skyrl:", dataset=parquet(tmp_path / "mixed.parquet", rows))
    assert spec.starts == 3 and len(spec.files) == 3  # two environments' modules, the data
    assert "rows without an env_class are played in gsm8k" in spec.notes[0]
    ends = [spec.game(s, settings("skyrl:", 3), None).play("#### 1", "", 1).done for s in range(3)]
    assert ends == [True, False, True]  # gsm8k ends after one step
    bare = load_environment("skyrl", dataset=tmp_path / "mixed.parquet")  # the same as skyrl:
    assert (bare.spec, bare.files, bare.notes) == (spec.spec, spec.files, spec.notes)


def test_a_factorys_base_text_env_is_played_as_skyrl_plays_it(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "count"}, {"role": "user", "content": "go"}],
             "env_class": "counting", "fault": None}]  # fmt: skip
    data = parquet(tmp_path / "counting.parquet", rows)
    spec = load_environment(f"{COUNTING}:CountingEnv", dataset=data)
    assert spec.framework == "SkyRL" and spec.files == (COUNTING, data)
    game = spec.game(0, settings(spec.spec, 2), None)
    assert game.observation == "go"
    first = game.play("four\nand more", "", 1)
    assert first.turn.action == "four" and first.turn.info == {"characters": 13}
    assert game.chat[-2:] == [{"role": "assistant", "content": "four"},
                              {"role": "user", "content": "turn 1: 13 characters"}]  # fmt: skip
    assert (first.turn.reward, first.done, first.observation) == (
        1.0,
        False,
        game.chat[-1]["content"],
    )
    assert game.play("x", "", 2).done  # the extras' max_turns: the generator's, 2
    again = pickle.loads(pickle.dumps(spec))
    assert again.spec == spec.spec and again.starts == 1


def test_env_arg_is_skyrls_config_of_the_environment():
    assert env_config("s", "text2sql", {"db_path": "/data"}) == Text2SQLEnvConfig("/data")
    assert env_config("s", "gsm8k", {}) == {}
    with pytest.raises(CollapsecheckError, match="Text2SQLEnvConfig has db_path"):
        env_config("s", "text2sql", {"path": "/data"})
    with pytest.raises(CollapsecheckError, match=r"no environment\.skyrl_gym\.gsm8k section"):
        env_config("s", "gsm8k", {"db_path": "/data"})


def faulty(tmp_path, fault: str, turn: int = 1):
    rows = [{"prompt": [{"role": "user", "content": f"go {n}"}], "env_class": "counting",
             "fault": fault, "fault_turn": turn} for n in range(2)]  # fmt: skip
    return parquet(tmp_path / f"{fault}.parquet", rows)


@pytest.mark.parametrize(
    ("fault", "turn", "said"),
    [
        ("raise", 2, "the environment raised RuntimeError: the counter fell over"),
        ("shape", 1, "step returned a tuple; expected SkyRL's BaseTextEnvStepOutput "
         "(observations, reward, done, metadata)"),
        ("sleep", 1, "the environment gave no answer within 1 s (--env-timeout)"),
    ],
)  # fmt: skip
def test_an_environment_at_fault_is_one_line_naming_skyrl_the_seed_and_the_turn(
    tmp_path, fault, turn, said
):
    data = faulty(tmp_path, fault, turn)
    result = collapsecheck("scan", AGENT, "--env", f"{COUNTING}:CountingEnv", "--prompts", data,
                           "-k", "1", "--max-turns", "3", "--max-new-tokens", "8",
                           "--env-timeout", "1", "--fail-on", "none")  # fmt: skip
    line = result.stderr.strip().splitlines()[-1]
    where = f"error: --env {COUNTING}:CountingEnv (SkyRL, seed 0, turn {turn}): "
    assert result.returncode == 2 and line == where + said, line
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1


@pytest.mark.parametrize(
    ("spec", "prompts", "said"),
    [
        ("skyrl:no_such_env", True, "SkyRL-gym has no environment 'no_such_env'; it has aime, "),
        ("skyrl:gsm8k", True, "gsm8k.parquet, row 0 names env_class 'gsm8k_multi_turn', not "
         "'gsm8k'"),
        (MULTI, False, "SkyRL's environments take their start state from a dataset row: give "
         "SkyRL's dataset with --prompts"),
    ],
)  # fmt: skip
def test_what_cannot_be_played_is_one_line_before_the_model(data, spec, prompts, said):
    given = ("--prompts", data) if prompts else ()
    result = collapsecheck("scan", AGENT, "--env", spec, *given, "--fail-on", "none")
    line = " ".join(result.stderr.split())
    assert result.returncode == 2 and said in line, result.stderr
    assert "Traceback" not in result.stderr and "loading" not in result.stdout.lower()


def test_a_missing_skyrl_gym_names_the_extra(data):
    hide = "import sys; sys.modules['skyrl_gym'] = None; "
    result = collapsecheck("scan", AGENT, "--env", MULTI, "--prompts", data, code=hide)
    assert result.returncode == 2, result.stderr
    assert f"--env {MULTI}: skyrl_gym is not installed (pip install 'collapsecheck[skyrl]')" in (
        " ".join(result.stderr.split())
    )
