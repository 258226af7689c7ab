"""The reasoning of replies that write no reasoning tags but an action their framework parses out
(SPEC "Agents across turns", "The reasoning when a framework parses the action"): a
tool-calling agent's text before its tool calls, a TextArena player's text before its last
`[move]`. Used where a played scan's replies have no segment under the default tags and the
flags name no other segment: said once, instead of a stop asking for --whole-response."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from collapsecheck.engines.reasoning import reasoning_spec
from collapsecheck.inputs.episodes import Episode
from collapsecheck.settings import Settings


@dataclass(frozen=True)
class ParsedAction:
    """How a framework writes the action it parses out of a reply: what marks a reply holding
    one, the reasoning before it (a regex's first group) and the action itself."""

    name: str
    marks: re.Pattern[str]
    reasoning: str
    action: str


TOOL_CALLS = ParsedAction(
    "tool calls", re.compile(r"<tool_call>"), r"(?s)\A(.*?\S.*?)\s*(?=<tool_call>)",
    r"(?s)<tool_call>.*</tool_call>",
)  # fmt: skip
MOVES = ParsedAction(
    "TextArena's [move]", re.compile(r"\[[^\[\]\n]+\]"),
    r"(?s)\A(.*\S.*?)\s*(?=\[[^\[\]\n]+\][^\[\]]*\Z)", r"\[[^\[\]\n]+\]",
)  # fmt: skip


def parsed_action(spec: str, episodes: Sequence[Episode]) -> ParsedAction | None:
    """The way this scan's framework parsed actions out of its replies, where it did: tool calls
    (an endpoint's or TRL's: `given` holds them), TextArena's moves."""
    if any(t.given is not None and t.given.startswith("[{") for e in episodes for t in e.turns):
        return TOOL_CALLS
    if spec.startswith("textarena:"):
        return MOVES
    return None


def reasoning_before_action(
    settings: Settings, spec: str, episodes: Sequence[Episode]
) -> tuple[Settings, str | None]:
    """The settings to read these replies with, and the note that says so: unchanged where a
    flag names the segment, or a reply has the default tags, or no action was parsed."""
    scoring = settings.scoring
    named = (scoring.reasoning_tags, scoring.reasoning_regex, scoring.action_tags,
             scoring.action_regex)  # fmt: skip
    if any(named) or scoring.whole_response or scoring.action_after_reasoning:
        return settings, None
    tags = reasoning_spec(scoring)
    replies = [t.response for e in episodes for t in e.turns]
    if any(tags.open_tag in r or tags.close_tag in r for r in replies):
        return settings, None
    found = parsed_action(spec, episodes)
    if found is None or not any(found.marks.search(r) for r in replies):
        return settings, None
    scoring = dataclasses.replace(
        scoring, reasoning_regex=found.reasoning, action_regex=found.action
    )
    note = (
        f"--env {spec}: no reply has a reasoning segment {tags.describe()}, and the framework "
        f"parsed the action out of them ({found.name}): the reasoning is each reply's text "
        f"before its action (--reasoning-regex '{found.reasoning}' --action-regex "
        f"'{found.action}'; a reply without one has no reasoning segment)"
    )
    return dataclasses.replace(settings, scoring=scoring), note
