"""Reasoning extraction maps a character span back to the sampled token ids."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from collapsecheck.engines.reasoning import ReasoningSpec, extract_traces, locate_reasoning
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.samples import Sample

CORPUS = [
    "<think>the agent is at 3,1 and the goal at 0,4</think><answer>up</answer>",
    "Let me think. <think>plan: go right then up</think> answer: right",
    "thinking about the answer: the board has walls",
] * 20


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained here, so tags split into several tokens and merge with text."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    return tokenizer


def tokenizers_under_test(bpe, demo_tokenizer):
    def demo_decode(ids):
        return demo_tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def demo_encode(text):
        return demo_tokenizer(text, add_special_tokens=False)["input_ids"]

    return [
        (lambda text: bpe.encode(text).ids, lambda ids: bpe.decode(list(ids))),
        (demo_encode, demo_decode),
    ]


@pytest.mark.parametrize("which", [0, 1])
def test_tags_span_excludes_both_tags(bpe, demo_tokenizer, which):
    encode, decode = tokenizers_under_test(bpe, demo_tokenizer)[which]
    ids = encode("<think>the agent is at 3,1</think><answer>up</answer>")
    span = locate_reasoning(ids, decode, ReasoningSpec(), truncated=False)
    assert decode(ids[span.start : span.end]) == "the agent is at 3,1"
    assert decode(ids[: span.start]) == "<think>"


def test_text_before_the_tag_belongs_to_the_prefix(demo_tokenizer):
    encode, decode = tokenizers_under_test(None, demo_tokenizer)[1]
    ids = encode("ok. <think>go up</think> done")
    span = locate_reasoning(ids, decode, ReasoningSpec(), truncated=False)
    assert decode(ids[: span.start]) == "ok. <think>"
    assert decode(ids[span.start : span.end]) == "go up"


def test_tokens_straddling_a_tag_are_left_out(bpe):
    decode = lambda ids: bpe.decode(list(ids))  # noqa: E731
    ids = bpe.encode("Let me think. <think>plan: go right then up</think> answer: right").ids
    span = locate_reasoning(ids, decode, ReasoningSpec("tags", "think. ", "then"), truncated=False)
    reasoning = decode(ids[span.start : span.end])
    # only tokens wholly inside the span: part of the text between the tags, never a tag
    assert reasoning.strip()
    assert reasoning in "<think>plan: go right "


def test_missing_empty_and_truncated_segments(demo_tokenizer):
    encode, decode = tokenizers_under_test(None, demo_tokenizer)[1]
    spec = ReasoningSpec()
    assert locate_reasoning(encode("<answer>up</answer>"), decode, spec, truncated=False) is None
    assert locate_reasoning(encode("<think></think>up"), decode, spec, truncated=False) is None
    cut = encode("<think>still going")
    assert locate_reasoning(cut, decode, spec, truncated=False) is None
    span = locate_reasoning(cut, decode, spec, truncated=True)
    assert decode(cut[span.start : span.end]) == "still going"


def test_regex_and_whole_response(demo_tokenizer):
    encode, decode = tokenizers_under_test(None, demo_tokenizer)[1]
    ids = encode("plan: go left. move: left")
    regex = ReasoningSpec("regex", regex=r"plan: (.*?)\. move")
    span = locate_reasoning(ids, decode, regex, truncated=False)
    assert decode(ids[span.start : span.end]) == "go left"
    whole = locate_reasoning(ids, decode, ReasoningSpec("whole"), truncated=False)
    assert (whole.start, whole.end) == (0, len(ids))


def test_bad_specs_are_clear_errors():
    with pytest.raises(CollapsecheckError, match="OPEN,CLOSE"):
        ReasoningSpec.from_tags("<think>")
    with pytest.raises(CollapsecheckError, match="invalid pattern"):
        ReasoningSpec("regex", regex="(")
    with pytest.raises(CollapsecheckError, match="at most one capture group"):
        ReasoningSpec("regex", regex="(a)(b)")


def test_extract_traces_keeps_sampled_ids(demo_tokenizer):
    encode, decode = tokenizers_under_test(None, demo_tokenizer)[1]
    samples = [
        [Sample(tuple(encode("<think>a b</think>x")), False), Sample(tuple(encode("no")), False)],
        [Sample(tuple(encode("<think>c")), True)],
    ]
    traces = extract_traces(samples, decode, ReasoningSpec())
    assert [(t.prompt_index, t.sample_index, t.valid) for t in traces] == [
        (0, 0, True),
        (0, 1, False),
        (1, 0, True),
    ]
    assert traces[0].prefix_ids + traces[0].reasoning_ids == traces[0].response_ids[:4]
    assert traces[0].reasoning == "a b"
    assert traces[2].truncated and traces[2].reasoning == "c"
