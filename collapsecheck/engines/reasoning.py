"""Reasoning extraction (SPEC "The reasoning segment Z and its context X").

Z is located in the decoded response text (tags, a regex, or the whole response) and mapped
back to the *sampled token ids*: Z is the run of tokens that lie wholly inside the located
character span, so it is never re-tokenized text. The tokens before Z (a `<think>` tag, say)
belong to the conditioning context.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.samples import Sample

if TYPE_CHECKING:
    from collapsecheck.settings import ScoringSettings

Decode = Callable[[Sequence[int]], str]

TAGS, REGEX, WHOLE, AFTER = "tags", "regex", "whole", "after"


def _check_regex(regex: str | None, option: str) -> None:
    try:
        pattern = re.compile(regex or "")
    except re.error as err:
        raise CollapsecheckError(f"{option}: invalid pattern ({err})") from None
    if not regex or pattern.groups > 1:
        raise CollapsecheckError(f"{option} needs a pattern with at most one capture group")


def split_tags(tags: str, option: str) -> tuple[str, str]:
    """The CLI form `OPEN,CLOSE` of a tag pair."""
    parts = tags.split(",")
    if len(parts) != 2:
        raise CollapsecheckError(f"{option} expects OPEN,CLOSE, got {tags!r}")
    return parts[0], parts[1]


@dataclass(frozen=True)
class ReasoningSpec:
    """Which part of a response is the reasoning Z."""

    mode: str = TAGS
    open_tag: str = "<think>"
    close_tag: str = "</think>"
    regex: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in (TAGS, REGEX, WHOLE):
            raise CollapsecheckError(f"unknown reasoning mode {self.mode!r}")
        if self.mode == TAGS and not (self.open_tag and self.close_tag):
            raise CollapsecheckError("--reasoning-tags needs two non-empty tags: OPEN,CLOSE")
        if self.mode == REGEX:
            _check_regex(self.regex, "--reasoning-regex")

    @classmethod
    def from_tags(cls, tags: str) -> ReasoningSpec:
        """Parse the CLI form `OPEN,CLOSE`."""
        return cls(TAGS, *split_tags(tags, "--reasoning-tags"))

    def describe(self) -> str:
        if self.mode == TAGS:
            return f"between {self.open_tag!r} and {self.close_tag!r}"
        if self.mode == REGEX:
            return f"matched by the regex {self.regex!r}"
        return "the whole response"

    def to_dict(self) -> dict[str, str | None]:
        if self.mode == TAGS:
            return {"mode": TAGS, "open_tag": self.open_tag, "close_tag": self.close_tag}
        if self.mode == REGEX:
            return {"mode": REGEX, "regex": self.regex}
        return {"mode": WHOLE}


@dataclass(frozen=True)
class ReasoningSpan:
    """Z = response_ids[start:end]; the tokens before `start` are the response prefix."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def opens_reasoning(prompt_text: str, spec: ReasoningSpec) -> bool:
    """SPEC: a rendered prompt that ends with the open tag (trailing whitespace aside), as the
    chat templates of R1 distills and QwQ do, leaves the response inside the reasoning."""
    return spec.mode == TAGS and prompt_text.rstrip().endswith(spec.open_tag)


def closes_reasoning(prompt_text: str, spec: ReasoningSpec) -> bool:
    """A rendered prompt that already closes the reasoning (Qwen3 with thinking off ends with
    `<think>\n\n</think>\n\n`): the response has no reasoning to score."""
    return spec.mode == TAGS and prompt_text.rstrip().endswith(spec.close_tag)


def _character_span(
    text: str, spec: ReasoningSpec, truncated: bool, opened: bool
) -> tuple[int, int, int] | None:
    """Z's characters [start, end) in the response text, and where what follows Z begins
    (after its close tag)."""
    if spec.mode == WHOLE:
        return 0, len(text), len(text)
    if spec.mode == REGEX:
        match = re.search(spec.regex or "", text, flags=re.DOTALL)
        if match is None:
            return None
        group = 1 if match.re.groups else 0
        if match.start(group) < 0:
            return None
        return match.start(group), match.end(group), match.end()
    if opened:  # the prompt opened the reasoning: it starts with the response
        start = 0
    else:
        found = text.find(spec.open_tag)
        if found < 0:
            return None
        start = found + len(spec.open_tag)
    closed = text.find(spec.close_tag, start)
    if closed < 0:
        # SPEC: a trace cut by the length limit keeps what it produced up to the limit.
        return (start, len(text), len(text)) if truncated else None
    return start, closed, closed + len(spec.close_tag)


def _first_token_reaching(ids: Sequence[int], decode: Decode, chars: int) -> int:
    """Smallest i such that the decoded text of ids[:i] is at least `chars` long."""
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        if len(decode(ids[:middle])) >= chars:
            high = middle
        else:
            low = middle + 1
    return low


def _token_span(
    ids: Sequence[int], decode: Decode, text: str, char_start: int, char_end: int
) -> ReasoningSpan | None:
    """The run of tokens lying wholly inside [char_start, char_end) of the decoded text."""
    start = _first_token_reaching(ids, decode, char_start)
    if char_end >= len(text):
        end = len(ids)
    else:
        end = _first_token_reaching(ids, decode, char_end + 1) - 1
    return ReasoningSpan(start, end) if end > start else None


def locate_reasoning(
    ids: Sequence[int],
    decode: Decode,
    spec: ReasoningSpec,
    *,
    truncated: bool,
    opened: bool = False,
) -> ReasoningSpan | None:
    """Token span of Z in a response, or None when it has no (or an empty) reasoning segment.
    `opened`: the prompt ended with the open tag, so Z starts at the response's first token."""
    return locate_segments(ids, decode, spec, None, truncated=truncated, opened=opened)[0]


@dataclass(frozen=True)
class ActionSpec:
    """Which part of a response after Z is the action A (SPEC "Information flow")."""

    mode: str = TAGS
    open_tag: str = "<answer>"
    close_tag: str = "</answer>"
    regex: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in (TAGS, REGEX, AFTER):
            raise CollapsecheckError(f"unknown action mode {self.mode!r}")
        if self.mode == TAGS and not (self.open_tag and self.close_tag):
            raise CollapsecheckError("--action-tags needs two non-empty tags: OPEN,CLOSE")
        if self.mode == REGEX:
            _check_regex(self.regex, "--action-regex")

    def to_dict(self) -> dict[str, str | None]:
        if self.mode == TAGS:
            return {"mode": TAGS, "open_tag": self.open_tag, "close_tag": self.close_tag}
        return {"mode": REGEX, "regex": self.regex} if self.mode == REGEX else {"mode": AFTER}

    def characters(self, text: str, after: int) -> tuple[int, int] | None:
        """A's characters in the response text, searched from `after` (the end of Z)."""
        if self.mode == AFTER:
            return after, len(text)
        if self.mode == REGEX:
            match = re.compile(self.regex or "", flags=re.DOTALL).search(text, after)
            if match is None:
                return None
            group = 1 if match.re.groups else 0
            return (match.start(group), match.end(group)) if match.start(group) >= 0 else None
        found = text.find(self.open_tag, after)
        if found < 0:
            return None
        start = found + len(self.open_tag)
        closed = text.find(self.close_tag, start)
        return (start, closed) if closed >= 0 else None


def reasoning_spec(scoring: ScoringSettings) -> ReasoningSpec:
    """The reasoning segment the --reasoning-* flags name (a bad tag pair or regex fails)."""
    if scoring.reasoning_tags:
        return ReasoningSpec.from_tags(scoring.reasoning_tags)
    if scoring.reasoning_regex:
        return ReasoningSpec(REGEX, regex=scoring.reasoning_regex)
    return ReasoningSpec(WHOLE) if scoring.whole_response else ReasoningSpec()


def action_spec(scoring: ScoringSettings) -> ActionSpec | None:
    """Where the action is (SPEC "Information flow"); None with --no-flow."""
    if scoring.no_flow:
        return None
    if scoring.action_tags:
        return ActionSpec(TAGS, *split_tags(scoring.action_tags, "--action-tags"))
    if scoring.action_regex:
        return ActionSpec(REGEX, regex=scoring.action_regex)
    return ActionSpec(AFTER) if scoring.action_after_reasoning else ActionSpec()


def located_action(
    text: str, spec: ReasoningSpec, action: ActionSpec, truncated: bool, prompt_text: str = ""
) -> str:
    """A response's action as text, located as the flow locates it (after the reasoning);
    "" where the response has none (SPEC "Agents across turns")."""
    chars = _character_span(text, spec, truncated, opens_reasoning(prompt_text, spec))
    if chars is None:
        return ""
    found = action.characters(text, chars[2])
    return text[found[0] : found[1]] if found else ""


def locate_segments(
    ids: Sequence[int],
    decode: Decode,
    spec: ReasoningSpec,
    action: ActionSpec | None,
    *,
    truncated: bool,
    opened: bool = False,
) -> tuple[ReasoningSpan | None, ReasoningSpan | None]:
    """Token spans of Z and of the action after it (None where there is none, or it is
    empty)."""
    text = decode(ids)
    chars = _character_span(text, spec, truncated, opened)
    if chars is None:
        return None, None
    reasoning = _token_span(ids, decode, text, chars[0], chars[1])
    action_chars = action.characters(text, chars[2]) if action and reasoning else None
    if action_chars is None:
        return reasoning, None
    acted = _token_span(ids, decode, text, *action_chars)
    return reasoning, acted if acted and acted.start >= reasoning.end else None


@dataclass(frozen=True)
class Trace:
    """One sampled response with its reasoning segment located (span None: not scoreable)."""

    prompt_index: int
    sample_index: int
    response_ids: tuple[int, ...]
    response: str
    truncated: bool
    span: ReasoningSpan | None
    reasoning: str
    action_span: ReasoningSpan | None = None
    action: str = ""

    @property
    def valid(self) -> bool:
        return self.span is not None

    @property
    def flow_valid(self) -> bool:
        """A scoreable Z followed by a non-empty action (SPEC "Information flow")."""
        return self.span is not None and self.action_span is not None

    @property
    def mid_ids(self) -> tuple[int, ...]:
        """The tokens between the end of Z and the start of A (`</think><answer>`, say)."""
        if not self.flow_valid:
            return ()
        return self.response_ids[self.span.end : self.action_span.start]

    @property
    def action_ids(self) -> tuple[int, ...]:
        if not self.flow_valid:
            return ()
        return self.response_ids[self.action_span.start : self.action_span.end]

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        return self.response_ids[: self.span.start] if self.span else ()

    @property
    def reasoning_ids(self) -> tuple[int, ...]:
        return self.response_ids[self.span.start : self.span.end] if self.span else ()


def extract_traces(
    samples: Sequence[Sequence[Sample]],
    decode: Decode,
    spec: ReasoningSpec,
    opened: Sequence[bool] | None = None,
    action: ActionSpec | None = None,
) -> list[Trace]:
    """Traces in prompt-major order from the backend's samples, K per prompt. `opened[i]`:
    prompt i's rendering opened the reasoning (`opens_reasoning`); `action`: where the
    action is, when the flow is measured."""
    traces = []
    for prompt_index, prompt_samples in enumerate(samples):
        inside = bool(opened[prompt_index]) if opened is not None else False
        for sample_index, sample in enumerate(prompt_samples):
            ids = sample.ids
            span, acted = locate_segments(
                ids, decode, spec, action, truncated=sample.truncated, opened=inside
            )
            traces.append(
                Trace(
                    prompt_index,
                    sample_index,
                    ids,
                    decode(ids),
                    sample.truncated,
                    span,
                    decode(ids[span.start : span.end]) if span else "",
                    acted,
                    decode(ids[acted.start : acted.end]) if acted else "",
                )
            )
    return traces


def token_pieces(rows: Sequence[Sequence[int]], decode: Decode) -> list[str]:
    """Every token of `rows`, one after another, as its own text (what a page shades token
    by token): each distinct id decoded once, alone."""
    text = {token: decode([token]) for token in {t for row in rows for t in row}}
    return [text[token] for row in rows for token in row]
