"""`--env trl:FILE.py:CLASS --prompts DATASET` (SPEC "Every framework's environment"): a tool
environment played as TRL 1.16's GRPOTrainer(environment_factory=CLASS) plays it, each turn's
context checked against the context TRL's own code builds (its parser, its tool-suffix tokens)
for the same replies."""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    qwen3_chat_template,
)

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from collapsecheck.settings import EnvSettings, PromptSettings
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

HERE = ROOT / "tests" / "fixtures" / "environments" / "trl"
COUNTER = HERE / "counter.py"
ROWS = HERE / "rows.jsonl"
SPEC = f"trl:{COUNTER}:Counter"
NO_THINKING = PromptSettings(chat_template_kwargs={"enable_thinking": False})


def qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with Qwen's special tokens and TRL's bundled Qwen3 template: the
    tool-calling demo agent's, as scripts/make_tool_agent.py builds it (a fresh copy each call)."""
    tokenizer = AutoTokenizer.from_pretrained(EXAMPLES / "agents" / "tool-caller")
    assert tokenizer.chat_template == qwen3_chat_template, "TRL's Qwen3 template, as bundled"
    return tokenizer


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def counter_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_counter_direct", COUNTER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines()]


def trl_rollout(tokenizer, seed: int, replies: list[str], kwargs: dict):
    """TRL's own rollout of the counter at row `seed` with `replies`, written out as
    GRPOTrainer's `_generate_and_score_completions` and `_tool_call_loop` run it, with TRL's
    parser and tool-suffix tokens: each turn's context ids, tool messages, final reward."""
    from trl import GRPOTrainer

    tokenizer = add_response_schema(tokenizer)
    template = None
    if not is_chat_template_prefix_preserving(tokenizer):
        template = get_training_chat_template(tokenizer)
    trainer = SimpleNamespace(processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False,
                              chat_template=template, chat_template_kwargs=kwargs)  # fmt: skip
    env, row = counter_module().Counter(), rows()[seed]
    random.seed(seed)
    observation = env.reset(**row)
    tools = [env.increment]
    last = row["prompt"][-1]
    prompt = [*row["prompt"][:-1], {**last, "content": last["content"] + observation}]
    context = tokenizer.apply_chat_template(
        conversation=[prompt], tools=tools, chat_template=template, add_generation_prompt=True,
        tokenize=True, return_dict=True, **kwargs,
    )["input_ids"][0]  # fmt: skip
    contexts, returned = [context], []
    for reply in replies:
        ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        calls = parse_response(tokenizer, ids, prefix=context, tools=tools).get("tool_calls")
        if not calls:
            break
        messages = []
        for function in (c["function"] for c in calls):
            try:
                if function["name"] != "increment":
                    raise ValueError(f"Tool {function['name']} not found.")
                result = env.increment(**function["arguments"])
            except Exception as err:
                result = {"error": str(err)}
            messages.append({"role": "tool", "name": function["name"], "content": str(result)})
        context = context + ids + GRPOTrainer._get_tool_suffix_ids(trainer, messages)
        contexts.append(context)
        returned.append(messages)
    return contexts, returned, env.get_reward()


def play(spec, seed: int, replies: list[str], tokenizer, settings=NO_THINKING, turns=None):
    """A game of the spec played with `replies` as the play loop plays it: each turn's context
    rendered, then the reply played."""
    game = spec.game(seed, EnvSettings(env=spec.spec, env_seed=seed, max_turns=turns), None)
    contexts, played = [], []
    for number, reply in enumerate(replies, start=1):
        contexts.append(game.context(tokenizer, settings, "test")[1])
        played.append(game.play(reply, "", number))
        if played[-1].done:
            break
    return game, contexts, played


@pytest.fixture(scope="module")
def spec():
    return load_environment(SPEC, dataset=ROWS, timeout=10)


def target_of(seed: int) -> int:
    env = counter_module().Counter()
    random.seed(seed)
    env.reset(**rows()[seed])
    return env.target


def test_each_turns_context_is_the_one_trls_trainer_builds(spec):
    """Every context the chat re-rendered (with TRL's training template, as TRL swaps Qwen3's)
    equals TRL's token-appended context for the same replies; tool results, errors included,
    are TRL's tool messages; the turns' rewards add up to TRL's get_reward()."""
    seed, target = 1, target_of(1)
    replies = [
        call("increment", step=2) + "<|im_end|>",
        "Two more.\n" + call("jump") + "\n" + call("increment", stride=1) + "\n"
        + call("increment", step=target - 2) + "<|im_end|>",
        call("increment", step=1) + "<|im_end|>",
        "Done.<|im_end|>",
    ]  # fmt: skip
    game, contexts, played = play(spec, seed, replies, qwen3_tokenizer())
    expected, returned, reward = trl_rollout(
        qwen3_tokenizer(), seed, replies, {"enable_thinking": False}
    )
    assert [list(c.ids) for c in contexts] == expected
    assert [[dict(m) for m in p.turn.returned] for p in played[:-1]] == returned
    assert returned[1][0]["content"] == "{'error': 'Tool jump not found.'}"
    assert "unexpected keyword argument 'stride'" in returned[1][1]["content"]
    assert returned[2] == [
        {"role": "tool", "name": "increment", "content": "{'error': 'Game over.'}"}
    ]
    assert sum(p.turn.reward for p in played) == pytest.approx(reward) == 1.0
    assert [p.done for p in played] == [False, False, False, True]
    assert played[1].turn.action == 'jump({}); increment({"stride": 1}); ' + (
        f'increment({{"step": {target - 2}}})'
    )
    assert json.loads(played[1].turn.given)[2] == {"name": "increment",
                                                   "arguments": {"step": target - 2}}  # fmt: skip
    assert played[1].observation == "\n".join(m["content"] for m in returned[1])
    assert played[-1].turn.action == "" and played[-1].turn.given == "Done.<|im_end|>"
    assert game.chat[0]["content"] == f"Count to the target. Reach {target}."


def test_with_thinking_on_a_reply_without_a_think_block_is_rendered_with_an_empty_one(spec):
    """The documented difference: TRL keeps the reply's tokens, the re-rendered chat writes the
    reply as TRL's training template writes an assistant turn (an empty think block)."""
    replies = [call("increment", step=1) + "<|im_end|>", "Stop.<|im_end|>"]
    _, contexts, _ = play(spec, 0, replies, qwen3_tokenizer(), PromptSettings())
    expected, _, _ = trl_rollout(qwen3_tokenizer(), 0, replies, {})
    tokenizer = qwen3_tokenizer()
    assert list(contexts[0].ids) == expected[0]
    kept = tokenizer.decode(expected[1])
    header = "<|im_start|>assistant\n<tool_call>"
    assert kept.count(header) == 1
    assert contexts[1].text == kept.replace(
        header, "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>"
    )


def test_the_last_turns_tool_calls_are_not_run(spec):
    """--max-turns T plays as TRL's max_tool_calling_iterations T-1: the T-th reply's calls are
    parsed but not run."""
    replies = [call("increment", step=1) + "<|im_end|>"] * 2
    _, _, played = play(spec, 2, replies, qwen3_tokenizer(), turns=2)
    assert played[0].turn.returned and not played[1].turn.returned
    assert played[1].turn.reward == 0.0 and not played[1].done
    assert played[1].turn.action == 'increment({"step": 1})'


def test_a_coroutine_tools_result_comes_after_the_others_as_trl_gathers_it():
    source = load_environment(f"trl:{COUNTER}:WithCoroutine", dataset=ROWS, timeout=10)
    reply = call("double", times=2) + "\n" + call("increment", step=3) + "<|im_end|>"
    _, _, played = play(source, 0, [reply], qwen3_tokenizer())
    assert [m["content"] for m in played[0].turn.returned] == ["count=3", "doubled=12"]
    assert played[0].turn.action == 'double({"times": 2}); increment({"step": 3})'


def test_parquet_rows_play_as_jsonl_and_a_string_prompt_is_one_user_message(spec, tmp_path):
    data = tmp_path / "rows.parquet"
    pd.DataFrame(rows()[:2]).to_parquet(data)  # parquet: one type per column (messages here)
    parquet = load_environment(SPEC, dataset=data, timeout=10)
    for seed in (0, 1):
        one = parquet.game(seed, EnvSettings(env=SPEC, env_seed=seed), None)
        assert one.chat == spec.game(seed, EnvSettings(env=SPEC, env_seed=seed), None).chat
    last = spec.game(2, EnvSettings(env=SPEC, env_seed=2), None)
    assert last.chat == [{"role": "user", "content": f"Count, please. Reach {target_of(2)}."}]
    assert (parquet.starts, spec.starts, spec.notes) == (2, 3, ())


def test_an_environment_without_tools_ends_at_its_first_reply():
    """TRL's GuessTheWord shape: no tools, so no template checks and no tool block; the reply
    as TRL decodes it, reset's None leaving the prompt as it is."""
    source = load_environment(f"trl:{COUNTER}:NoTools", dataset=ROWS, timeout=10)
    tokenizer = AutoTokenizer.from_pretrained(EXAMPLES / "agents" / "walker")
    game, contexts, played = play(source, 0, ["<think>hm</think> 7<|end|>"], tokenizer)
    assert contexts[0].text == tokenizer.apply_chat_template(
        rows()[0]["prompt"], add_generation_prompt=True, tokenize=False
    )
    assert played[0].done and played[0].turn.returned == () and played[0].turn.action == ""
    assert game.chat[-1] == {"role": "assistant", "content": "<think>hm</think> 7"}
    assert played[0].observation == "Count with the tool."


def where(name: str, at: str | None) -> str:
    """How a fault names its place, as a pattern: the spec, then TRL with the seed and the
    reset or turn where the environment's code was running."""
    named = re.escape(f"--env trl:{COUNTER}:{name}")
    return named + (rf" \(TRL, seed 0, {at}\)" if at else "") + ": "


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("SleepingTool", "the environment gave no answer within 1 s (--env-timeout)"),
        ("TextReward", "get_reward returned str, not a number"),
    ],
)
def test_a_fault_in_a_turn_is_one_line_naming_the_turn(name, said):
    source = load_environment(f"trl:{COUNTER}:{name}", dataset=ROWS, timeout=1)
    game = source.game(0, EnvSettings(env=source.spec, env_seed=0, env_timeout=1), None)
    game.context(qwen3_tokenizer(), NO_THINKING, "test")
    with pytest.raises(CollapsecheckError) as raised:
        game.play(call("increment", step=1) + "<|im_end|>", "", 1)
    assert re.fullmatch(where(name, "turn 1") + re.escape(said), str(raised.value))


def test_a_template_trl_does_not_parse_is_one_line(spec):
    tokenizer = qwen3_tokenizer()
    tokenizer.chat_template = qwen3_chat_template + " "
    game = spec.game(0, EnvSettings(env=SPEC, env_seed=0), None)
    with pytest.raises(CollapsecheckError, match="is not one TRL parses tool calls from"):
        game.context(tokenizer, NO_THINKING, "test")


def test_a_loaded_spec_travels_to_another_process_as_its_class_and_dataset(spec):
    again = pickle.loads(pickle.dumps(spec))
    assert again.spec == SPEC and again.code_sha256 == spec.code_sha256
    assert (
        again.game(1, EnvSettings(env=SPEC, env_seed=1), None).chat
        == spec.game(1, EnvSettings(env=SPEC, env_seed=1), None).chat
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The walker demo agent with TRL's bundled Qwen3 template."""
    folder = tmp_path_factory.mktemp("qwen3-walker") / "walker"
    shutil.copytree(EXAMPLES / "agents" / "walker", folder)
    (folder / "chat_template.jinja").write_text(qwen3_chat_template)
    return folder


def test_a_played_scan_replays_from_its_dump(checkpoint, spec, tmp_path):
    dump = tmp_path / "dump"
    result = collapsecheck("scan", checkpoint, "--env", SPEC, "--prompts", ROWS, "-n", "2", "-k",
                           "2", "--max-turns", "2", "--max-new-tokens", "24", "--whole-response",
                           "--fail-on", "none", "--dump", dump)  # fmt: skip
    assert result.returncode == 0, result.stderr
    episodes = [json.loads(line) for line in (dump / "episodes.jsonl").open()]
    assert [e["seed"] for e in episodes] == [0, 0, 1, 1]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for episode in episodes:
        replies = [t["response"] for t in episode["turns"]]
        game, _, played = play(spec, episode["seed"], replies, tokenizer, PromptSettings(), 2)
        assert episode["turns"][0]["state"] == f" Reach {target_of(episode['seed'])}."
        for turn, recorded in zip(played, episode["turns"], strict=True):
            assert turn.turn.given == recorded["given"]
            assert [dict(m) for m in turn.turn.returned] == recorded["returned"]
            assert turn.turn.reward == recorded["reward"]
        assert played[-1].done == episode["done"]
        assert game.observation == episode["final_state"]


HIDE_TRL = "import sys; sys.modules['trl'] = None; "


@pytest.mark.parametrize(
    ("name", "extra", "at", "said"),
    [
        ("RaisingReset", (), "reset", "the environment raised RuntimeError: no board today"),
        ("HangingReset", ("--env-timeout", "1"), "reset",
         "the environment gave no answer within 1 s (--env-timeout)"),
        ("NumberReset", (), "reset", "reset returned int, not a string or None"),
        ("Undocumented", (), None,
         "TRL cannot give the tool Undocumented.decrement to the chat template"),
        ("NoSuch", (), None, f"{COUNTER} has no factory 'NoSuch'"),
        ("Counter", ("--env-arg", "x=1"), None,
         "--env-arg does not go with it (TRL makes the class with no arguments)"),
    ],
)  # fmt: skip
def test_a_fault_is_one_line_before_the_model(checkpoint, name, extra, at, said):
    result = collapsecheck("scan", checkpoint, "--env", f"trl:{COUNTER}:{name}", "--prompts", ROWS,
                           *extra, "--fail-on", "none")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert re.match("error: " + where(name, at) + re.escape(said), result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "loading" not in result.stdout.lower()


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        ((), "", "give the TRL dataset whose rows are the start states: --prompts"),
        (("--prompts", ROWS), HIDE_TRL, "trl is not installed (pip install 'collapsecheck[trl]')"),
    ],
)
def test_no_dataset_or_no_trl_is_one_line(checkpoint, args, code, said):
    result = collapsecheck("scan", checkpoint, "--env", SPEC, *args, "--fail-on", "none", code=code)
    assert result.returncode == 2 and said in " ".join(result.stderr.split()), result.stderr


def test_a_template_without_tool_calls_is_one_line_after_the_model_loads():
    """The walker's own template drops tool calls: TRL refuses it for tool environments."""
    result = collapsecheck("scan", EXAMPLES / "agents" / "walker", "--env", SPEC, "--prompts",
                           ROWS, "-n", "2", "-k", "1", "--fail-on", "none")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "cannot render tool calls and tool results" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
