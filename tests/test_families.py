"""Checkpoints whose chat templates and tokenizers behave as the families RL teams train do:
reasoning opened by the template (DeepSeek-R1 distills, QwQ), a template taking
`enable_thinking` (Qwen3), several end-of-turn ids (Llama-3). The demo checkpoints under
examples/checkpoints/families/ are trained by `make fixtures` (scripts/make_fixtures.py)."""

import json

import pytest
from typer.testing import CliRunner

from collapsecheck import scan, score
from collapsecheck.cli import app
from collapsecheck.engines.reasoning import (
    ReasoningSpec,
    closes_reasoning,
    locate_reasoning,
    opens_reasoning,
)
from collapsecheck.errors import CollapsecheckError
from tests.conftest import EXAMPLES, PROMPTS

FAMILIES = EXAMPLES / "checkpoints" / "families"
R1, QWEN3, LLAMA3 = (
    FAMILIES / "r1-distill-style",
    FAMILIES / "qwen3-style",
    FAMILIES / "llama3-style",
)
FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 64, "device": "cpu", "bootstrap": 200}
# QwQ's generation prompt ends like R1's: "<|im_start|>assistant\n<think>\n"
QWQ_PROMPT = "<|im_start|>user\nagent 1,2 goal 3,4<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_the_open_tag_at_the_end_of_the_prompt_opens_the_reasoning():
    spec = ReasoningSpec()
    assert opens_reasoning("<|assistant|><think>\n", spec)
    assert opens_reasoning(QWQ_PROMPT, spec)
    assert not opens_reasoning("<|assistant|>", spec)
    assert closes_reasoning("<|assistant|><think>\n\n</think>\n\n", spec)
    assert not opens_reasoning("<|assistant|><think>\n", ReasoningSpec("whole"))


def test_an_opened_response_is_reasoning_from_its_first_token(demo_tokenizer):
    ids = demo_tokenizer("me 1,2 goal 3,4: up</think><answer>up</answer>", add_special_tokens=False)
    ids = ids["input_ids"]
    decode = demo_tokenizer.decode
    span = locate_reasoning(ids, decode, ReasoningSpec(), truncated=False, opened=True)
    assert span.start == 0
    assert decode(ids[span.start : span.end]) == "me 1,2 goal 3,4: up"
    assert locate_reasoning(ids, decode, ReasoningSpec(), truncated=False) is None
    # ended without closing: not scoreable; cut by the length limit: what was produced
    open_ids = ids[:5]
    assert locate_reasoning(open_ids, decode, ReasoningSpec(), truncated=False, opened=True) is None
    cut = locate_reasoning(open_ids, decode, ReasoningSpec(), truncated=True, opened=True)
    assert (cut.start, cut.end) == (0, 5)


def test_the_think_tags_are_single_tokens_that_survive_skipping_special_ones():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(R1, local_files_only=True)
    for tag in ("<think>", "</think>"):
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag


@pytest.fixture(scope="module")
def r1_scan(tmp_path_factory):
    dump = tmp_path_factory.mktemp("r1")
    return scan(R1, PROMPTS, dump=dump, **FAST), dump


def closed_share(traces):
    """The share of responses whose reasoning, opened by the template, is whole: closed by
    </think>, or cut by the length limit (SPEC "The reasoning segment Z")."""
    return sum("</think>" in t["response"] or t["truncated"] for t in traces) / len(traces)


def test_r1_style_reasoning_opened_by_the_template_needs_no_flag(r1_scan):
    report, dump = r1_scan
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    assert all(t["prefix_ids"] == [] for t in traces)
    assert all("<think>" not in t["response"] for t in traces)  # the template wrote it
    # the policy closes its reasoning in all but a few responses (23 of 24 at seed 0)
    assert closed_share(traces) >= 0.9
    assert report.value("valid_reasoning_rate") == closed_share(traces)
    assert report.counts["prompts_opening_reasoning"] == 6
    assert report.verdict.regime == "grounded", report.verdict.reason


def test_r1_style_rollouts_score_as_the_scan(r1_scan, tmp_path):
    report, dump = r1_scan
    prompts = [json.loads(line)["messages"] for line in PROMPTS.open()][:6]
    traces = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    rows = [{"uid": t["prompt_index"], "messages": prompts[t["prompt_index"]],
             "response_ids": t["response_ids"]} for t in traces]  # fmt: skip
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from collapsecheck.inputs.rollouts import RolloutOptions

    again = score(R1, path, rollout_options=RolloutOptions(response_ids_field="response_ids"),
                  device="cpu", bootstrap=200)  # fmt: skip
    assert again.metrics == report.metrics
    # as text, re-tokenized: still every response that closed its reasoning has it
    text_rows = [{**r, "response": t["response"]} for r, t in zip(rows, traces, strict=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in text_rows))
    as_text = score(R1, path, device="cpu", bootstrap=200)
    assert as_text.value("valid_reasoning_rate") == report.value("valid_reasoning_rate")


def test_r1_style_multi_turn_contexts_open_the_reasoning_too(r1_scan, tmp_path):
    _, dump = r1_scan
    prompts = [json.loads(line)["messages"] for line in PROMPTS.open()][:6]
    traces = [
        json.loads(line) for line in (dump / "traces.jsonl").open() if '"sample_index": 0' in line
    ]
    rows = [{"turns": [{"messages": prompts[t["prompt_index"]], "response": t["response"]}]}
            for t in traces]  # fmt: skip
    path = tmp_path / "multi.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = score(R1, path, device="cpu", bootstrap=200)
    assert report.value("valid_reasoning_rate") == closed_share(traces)
    assert report.counts["prompts_opening_reasoning"] == 6


def test_qwen3_style_thinking_on_by_default_and_by_argument():
    default = scan(QWEN3, PROMPTS, **FAST)
    assert default.value("valid_reasoning_rate") == 1.0
    assert default.settings["chat_template_kwargs"] is None
    thinking = scan(QWEN3, PROMPTS, chat_template_kwargs={"enable_thinking": True}, **FAST)
    assert thinking.value("valid_reasoning_rate") == 1.0
    assert thinking.settings["chat_template_kwargs"] == {"enable_thinking": True}
    assert thinking.counts["prompts_opening_reasoning"] == 0


def test_qwen3_style_thinking_off_is_a_clear_error_not_a_silent_zero():
    result = CliRunner().invoke(
        app,
        ["scan", str(QWEN3), "-p", str(PROMPTS), "-n", "4", "-k", "2", "--device", "cpu",
         "--chat-template-kwargs", '{"enable_thinking": false}'],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    words = " ".join(result.output.split())
    assert "qwen3-style ends the prompt with '</think>'" in words
    assert "--chat-template-kwargs '{\"enable_thinking\": true}'" in words
    assert "sampling" not in result.output  # refused before any work


@pytest.mark.parametrize(
    ("value", "message"),
    [("enable_thinking", "not valid JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_chat_template_kwargs_must_be_a_json_object(value, message):
    result = CliRunner().invoke(
        app, ["scan", str(QWEN3), "-p", str(PROMPTS), "--chat-template-kwargs", value]
    )
    assert result.exit_code == 2
    assert f"--chat-template-kwargs: {message}" in result.output or message in result.output


def test_chat_template_kwargs_key_the_cache():
    from collapsecheck.settings import Settings

    plain = Settings.build().numbers()
    assert Settings.build(chat_template_kwargs='{"enable_thinking": true}').numbers() != plain
    with pytest.raises(CollapsecheckError, match="must be a JSON object"):
        Settings.build(chat_template_kwargs="3")


def test_llama3_style_several_end_of_turn_ids_stop_sampling(tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(LLAMA3, local_files_only=True)
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    eos = GenerationConfig.from_pretrained(LLAMA3).eos_token_id
    assert isinstance(eos, list) and eot in eos and tokenizer.eos_token_id in eos
    assert tokenizer.eos_token != "<|eot_id|>"
    report = scan(LLAMA3, PROMPTS, dump=tmp_path, **FAST)
    assert report.value("valid_reasoning_rate") == 1.0
    assert report.value("truncated_rate") == 0.0
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").open()]
    assert all(eot not in t["response_ids"] for t in traces)
    assert all(t["response"].endswith("</answer>") for t in traces)


def test_device_map_auto_places_the_model_and_keeps_the_numbers():
    """accelerate's placement (the whole model on the CPU here; over the GPUs on a GPU machine)
    gives the numbers of a plain load."""
    from tests.conftest import HEALTHY

    plain = scan(HEALTHY, PROMPTS, **FAST)
    placed = scan(HEALTHY, PROMPTS, device_map="auto", **FAST)
    assert placed.metrics == plain.metrics
    with pytest.raises(CollapsecheckError, match="--device-map must be one of"):
        scan(HEALTHY, PROMPTS, device_map="everywhere", **FAST)
