"""The template made visible: which parts of the reasoning sampled for different prompts are
the same. Traces of two or three prompts are laid side by side; a phrase (PHRASE_WORDS words
or more in a row) that the traces of another of those prompts also hold is marked, and so is
a word that the traces of every one of them hold. Grounded reasoning shares its scaffolding
("goal", "so") and differs where it reads the input; a template shares nearly everything."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

PHRASE_WORDS = 3
PHRASE, WORD, PLAIN = "phrase", "word", ""


@dataclass(frozen=True)
class Segment:
    """A run of a trace's text, and how it is shared (PHRASE, WORD, or PLAIN: not shared)."""

    text: str
    shared: str


def _key(word: str) -> str:
    return word.strip(".,;:!?()[]{}\"'").lower()


def _words(text: str) -> list[str]:
    return [_key(w) for w in text.split()]


def _phrases(words: Sequence[str]) -> set[tuple[str, ...]]:
    n = PHRASE_WORDS
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _marks(words: list[str], own: int, phrase_owners: dict, common: set[str]) -> list[str]:
    """Each word's mark: in a phrase another prompt's traces hold, else a word all hold."""
    marks = [WORD if w in common else PLAIN for w in words]
    n = PHRASE_WORDS
    for i in range(len(words) - n + 1):
        if phrase_owners.get(tuple(words[i : i + n]), {own}) - {own}:
            marks[i : i + n] = [PHRASE] * n
    return marks


def _segments(text: str, marks: list[str]) -> list[Segment]:
    """The text cut where the mark changes; the space between two words of one mark is
    marked with them."""
    pieces = [piece for piece in re.split(r"(\s+)", text) if piece]
    word_marks = iter(marks)
    kinds = [PLAIN if piece.isspace() else next(word_marks) for piece in pieces]
    for i, piece in enumerate(pieces):
        inside = 0 < i < len(pieces) - 1 and kinds[i - 1] == kinds[i + 1]
        if piece.isspace() and inside:
            kinds[i] = kinds[i - 1]
    segments: list[Segment] = []
    for piece, kind in zip(pieces, kinds, strict=True):
        if segments and segments[-1].shared == kind:
            segments[-1] = Segment(segments[-1].text + piece, kind)
        else:
            segments.append(Segment(piece, kind))
    return segments


def shared_spans(groups: Sequence[Sequence[str]]) -> list[list[list[Segment]]]:
    """For traces grouped by prompt (`groups[g]`: the reasoning texts of prompt g), each
    trace cut into segments marked by what it shares with the other prompts' traces."""
    words = [[_words(text) for text in group] for group in groups]
    owners: dict[tuple[str, ...], set[int]] = {}
    for g, group in enumerate(words):
        for trace in group:
            for phrase in _phrases(trace):
                owners.setdefault(phrase, set()).add(g)
    vocabularies = [{w for trace in group for w in trace if w} for group in words]
    common = set.intersection(*vocabularies) if len(vocabularies) > 1 else set()
    return [
        [
            _segments(text, _marks(trace, g, owners, common))
            for text, trace in zip(group, words[g], strict=True)
        ]
        for g, group in enumerate(groups)
    ]
