"""The reasoning of replies with no reasoning tags whose action the framework parsed (SPEC
"Agents across turns", "The reasoning when a framework parses the action"): the text before
the tool calls, or before TextArena's last [move]; said once; never where a flag names the
segment or a reply has the tags."""

from __future__ import annotations

import re

from collapsecheck.engines.reasoning import action_spec, located_action, reasoning_spec
from collapsecheck.inputs.episodes import Episode, EpisodeTurn
from collapsecheck.runs.action_reasoning import reasoning_before_action
from collapsecheck.settings import ScoringSettings, Settings

CALL = '<tool_call>\n{"name": "add", "arguments": {"n": 2}}\n</tool_call>'


def episode(*replies: str, given: str | None = None) -> Episode:
    turns = tuple(EpisodeTurn("s", r, "", given=r if given is None else given) for r in replies)
    return Episode(0, 0, turns)


def test_tool_calls_without_tags_read_the_text_before_them():
    played = [episode(f"I add 2.\n{CALL}", given='[{"name": "add", "arguments": {"n": 2}}]')]
    settings, note = reasoning_before_action(Settings(), "command:agent", played)
    scoring = settings.scoring
    assert note is not None and "the reasoning is each reply's text before its action" in note
    text = f"I add 2.\n{CALL}"
    assert re.match(scoring.reasoning_regex, text).group(1) == "I add 2."
    located = located_action(text, reasoning_spec(scoring), action_spec(scoring), False)
    assert located == CALL
    assert re.match(scoring.reasoning_regex, CALL) is None  # a bare call has no reasoning


def test_textarenas_moves_read_the_text_before_the_last_one():
    played = [episode("I guess five [5]"), episode("no idea")]
    settings, note = reasoning_before_action(Settings(), "textarena:GuessTheNumber-v0", played)
    assert "TextArena's [move]" in note
    found = re.match(settings.scoring.reasoning_regex, "between [3] and [7], so [5] now")
    assert found.group(1) == "between [3] and [7], so"


def test_nothing_changes_where_the_tags_are_written_or_a_flag_names_the_segment():
    tagged = [episode(f"<think>add</think>{CALL}", given="[{}]")]
    assert reasoning_before_action(Settings(), "command:a", tagged) == (Settings(), None)
    named = Settings(scoring=ScoringSettings(whole_response=True))
    untagged = [episode(f"I add.{CALL}", given="[{}]")]
    assert reasoning_before_action(named, "command:a", untagged) == (named, None)
    plain = [episode("I move up", given="I move up")]
    assert reasoning_before_action(Settings(), "command:a", plain) == (Settings(), None)
