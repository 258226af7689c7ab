"""Prompt sets in: JSONL and plain text, and their rendering with the checkpoint's tokenizer."""

import json

import pytest

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import Prompt, load_prompts, render_prompt


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_forms_and_blank_lines(tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    path = write(
        tmp_path / "p.jsonl",
        "\n".join(
            [
                json.dumps({"prompt": "plain"}),
                "",
                json.dumps({"prompt": messages}),
                json.dumps({"messages": messages, "extra": 1}),
            ]
        ),
    )
    prompts = load_prompts(path)
    assert [p.content for p in prompts] == ["plain", messages, messages]
    assert [p.origin for p in prompts] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    assert load_prompts(path, num_prompts=2)[1].is_chat


def test_plain_text_one_prompt_a_line(tmp_path):
    path = write(tmp_path / "p.txt", "first prompt\n\nsecond {not json}\n")
    assert [p.content for p in load_prompts(path)] == ["first prompt", "second {not json}"]


def test_prompt_field_option(tmp_path):
    path = write(tmp_path / "p.jsonl", json.dumps({"question": "q1"}) + "\n")
    assert load_prompts(path, field="question")[0].content == "q1"
    with pytest.raises(CollapsecheckError, match=r"p.jsonl:1: no 'prompt' or 'messages' field"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a"}\n{"prompt": \n', r"p.jsonl:2: malformed JSON"),
        ('["a"]\n', r"p.jsonl:1: expected a JSON object"),
        ('{"prompt": ""}\n', r"p.jsonl:1: the 'prompt' field is empty"),
        ('{"messages": [{"role": "user"}]}\n', r"p.jsonl:1 \('messages'\): each chat message"),
        ('{"messages": []}\n', r"non-empty list"),
        ("\n \n", r"no prompts found"),
    ],
)
def test_bad_prompt_files_name_file_and_line(tmp_path, text, message):
    path = write(tmp_path / "p.jsonl", text)
    with pytest.raises(CollapsecheckError, match=message):
        load_prompts(path)


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(CollapsecheckError, match=r"p.txt:2: not valid UTF-8"):
        load_prompts(path)


def test_missing_file(tmp_path):
    with pytest.raises(CollapsecheckError, match="prompt file not found"):
        load_prompts(tmp_path / "absent.jsonl")


def test_rendering_chat_and_verbatim(demo_tokenizer):
    chat = Prompt([{"role": "user", "content": "agent 1,1 goal 2,2"}], "f:1")
    rendered = render_prompt(chat, demo_tokenizer)
    assert rendered.text == "<|user|>agent 1,1 goal 2,2<|end|>\n<|assistant|>"
    assert demo_tokenizer.decode(list(rendered.ids)) == rendered.text
    verbatim = render_prompt(Prompt("agent 1,1", "f:2"), demo_tokenizer)
    assert verbatim.text == "agent 1,1"
    wrapped = render_prompt(Prompt("agent 1,1", "f:2"), demo_tokenizer, as_chat=True)
    assert wrapped.text.startswith("<|user|>agent 1,1")


def test_chat_prompt_without_chat_template_is_a_clear_error(demo_tokenizer):
    import copy

    tokenizer = copy.deepcopy(demo_tokenizer)
    tokenizer.chat_template = None
    with pytest.raises(CollapsecheckError, match=r"f:3: .* has no chat template"):
        render_prompt(Prompt([{"role": "user", "content": "x"}], "f:3"), tokenizer)


def test_verl_parquet_prompts(tmp_path):
    import pandas as pd

    rows = [
        {
            "data_source": "gridworld",
            "prompt": [{"role": "user", "content": f"agent {i},0 goal 0,{i}"}],
            "ability": "navigation",
            "reward_model": {"style": "rule", "ground_truth": "up"},
            "extra_info": {"index": i, "split": "test"},
        }
        for i in range(1, 4)
    ]
    path = tmp_path / "test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    prompts = load_prompts(path)
    assert [p.content for p in prompts] == [r["prompt"] for r in rows]
    assert prompts[0].origin == f"{path}: row 1"
    assert len(load_prompts(path, num_prompts=2)) == 2
    with pytest.raises(CollapsecheckError, match=r"row 1: no 'question' field"):
        load_prompts(path, field="question")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(CollapsecheckError, match="not a readable parquet file"):
        load_prompts(tmp_path / "bad.parquet")


def test_system_prompt_is_added_where_missing(demo_tokenizer):
    chat = Prompt([{"role": "user", "content": "agent 1,1 goal 2,2"}], "f:1")
    rendered = render_prompt(chat, demo_tokenizer, system_prompt="grid agent.")
    assert rendered.text.startswith("<|system|>grid agent.<|end|>\n<|user|>agent 1,1")
    own = Prompt([{"role": "system", "content": "mine"}, {"role": "user", "content": "x"}], "f:2")
    assert render_prompt(own, demo_tokenizer, system_prompt="other").text.startswith(
        "<|system|>mine<|end|>"
    )
    plain = render_prompt(Prompt("agent 1,1", "f:3"), demo_tokenizer, system_prompt="grid agent.")
    assert plain.text.startswith("<|system|>grid agent.<|end|>\n<|user|>agent 1,1")
