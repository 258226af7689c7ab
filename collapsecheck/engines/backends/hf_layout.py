"""How the cached scorer lays out the requests of one context (SPEC "Information flow",
"Early answering"): each distinct stem (a trace's response prefix and reasoning) is one row,
carried on into its most common branch; every other branch (an action after the reasoning,
after another trace's reasoning, or after the reasoning cut short) is appended to the same row
and attends to the row up to where it leaves it. One forward pass then scores them all.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from collapsecheck.engines.backends.base import ScoreRequest


def common_branch(
    stem: tuple[int, ...], asked: dict[tuple[tuple[int, ...], int], list[int]]
) -> tuple[int, ...]:
    """Of the tokens after `stem` that requests continuing it ask for (keyed by continuation
    and where its scoring starts, with the requests that ask), those that most requests
    continue with (none if none does): the stem's own pass runs them, so those requests need
    no branch of their own."""
    counts: Counter[tuple[int, ...]] = Counter()
    for (continuation, _), indices in asked.items():
        if len(continuation) > len(stem) and continuation[: len(stem)] == stem:
            counts[continuation[len(stem) :]] += len(indices)
    return max(counts, key=counts.__getitem__) if counts else ()


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` begin with in common."""
    shared = 0
    for mine, theirs in zip(a, b, strict=False):
        if mine != theirs:
            break
        shared += 1
    return shared


def leaves_row_at(continuation: tuple[int, ...], row: tuple[int, ...], stem: int) -> int:
    """How many tokens `continuation` shares with `row` from the start (`row[:stem]`, the
    stem, compared at once: most continuations begin with it)."""
    if continuation[:stem] == row[:stem]:
        return stem + shared_length(continuation[stem:], row[stem:])
    return shared_length(continuation, row)


@dataclass(frozen=True)
class StemRow:
    """One stem row, its distinct other branches appended, as one sequence. A branch is any
    request of the row's context whose continuation leaves the row, wherever it leaves it.
    The sequence's tokens are its targets: for each, the token whose logits predict it
    (`predictor`, an index into the inputs; -1: the context's last). Its inputs are the
    tokens whose logits something reads (a branch's last token, and the row's when no branch
    leaves after it, are scored but never run): for each its id, branch (-1: the row),
    offset in that branch, position and how many row tokens it sees. For each request it
    answers, the span of its targets."""

    ids: list[int]
    branch: list[int]
    offset: list[int]
    position: list[int]
    row_seen: list[int]
    targets: list[int]
    predictor: list[int]
    requests: list[int]
    spans: list[tuple[int, int]]

    @property
    def branched(self) -> bool:
        """Whether a branch is appended to the row: its pass needs a mask of its own, where a
        plain row runs causal on the context."""
        return any(b >= 0 for b in self.branch)

    @classmethod
    def of(
        cls, stem: tuple[int, ...], requests: Sequence[ScoreRequest], members: Sequence[int]
    ) -> StemRow:
        asked: dict[tuple[tuple[int, ...], int], list[int]] = defaultdict(list)
        for index in members:  # requests asking for the same tokens are laid out once
            request = requests[index]
            asked[(request.continuation, request.scored_from)].append(index)
        row = stem + common_branch(stem, asked)
        width = len(row)
        ids, branch, offset = list(row), [-1] * width, list(range(width))
        position, row_seen = list(range(width)), list(range(1, width + 1))
        predictor = list(range(-1, width - 1))
        starts: dict[tuple[int, tuple[int, ...]], int] = {}
        order, spans = [], []
        for (continuation, scored_from), indices in asked.items():
            order += indices
            shared = leaves_row_at(continuation, row, len(stem))
            if shared == len(continuation):  # inside the row
                spans += [(scored_from, shared)] * len(indices)
                continue
            # the branch leaves the row after the tokens it shares with it (the mid before
            # an action, or the reasoning before its cut), but no later than where its
            # scored tokens begin
            at = min(shared, scored_from)
            own = continuation[at:]
            if (at, own) not in starts:
                start = starts[(at, own)] = len(ids)
                ids += own
                branch += [len(starts) - 1] * len(own)
                offset += range(len(own))
                position += range(at, at + len(own))
                row_seen += [at] * len(own)
                predictor += [at - 1, *range(start, start + len(own) - 1)]
            start = starts[(at, own)]
            spans += [(start + scored_from - at, start + len(own))] * len(indices)
        inputs = read_inputs(predictor)
        kept = {token: index for index, token in enumerate(inputs)}
        return cls(
            [ids[t] for t in inputs], [branch[t] for t in inputs], [offset[t] for t in inputs],
            [position[t] for t in inputs], [row_seen[t] for t in inputs], ids,
            [kept.get(t, -1) for t in predictor], order, spans,
        )  # fmt: skip


def read_inputs(predictor: Sequence[int]) -> list[int]:
    """The tokens whose logits predict another (and the first, so that no sequence is
    empty), in order. The others are a branch's last token, or the row's when nothing leaves
    after it: no token sees them (a branch token sees its own branch's earlier tokens and
    the row before its attach point), so leaving them out of the pass is exact."""
    read = set(predictor)
    return [t for t in range(len(predictor)) if t in read or t == 0]


@dataclass
class RowLayout:
    """Sequences right-padded into model inputs (padding sees only the context). Everything
    the scorer decides on (whether a row is branched, which targets a position in the rows
    predicts) is read off the sequences on the host, so the device is never asked."""

    ids: torch.Tensor
    branch: torch.Tensor
    offset: torch.Tensor
    positions: torch.Tensor
    row_seen: torch.Tensor
    targets: torch.Tensor
    predictor: torch.Tensor
    predicted: tuple[torch.Tensor, torch.Tensor]  # (row, target) of targets with a predictor
    branched: bool  # some row has a branch appended
    requests: list[int]
    spans: list[tuple[int, int, int]]  # (row in the batch, start, end) of targets per request

    @classmethod
    def of(cls, sequences: Sequence[StemRow], device: str) -> RowLayout:
        def real(lengths: Sequence[int]) -> np.ndarray:
            """Which cells of the padded (rows, longest) array hold a token, row-major."""
            lengths = np.array(lengths)
            return np.arange(lengths.max())[None, :] < lengths[:, None]

        inputs = real([len(s.ids) for s in sequences])
        targets = real([len(s.targets) for s in sequences])

        def padded_array(field: str, fill: int, cells: np.ndarray) -> np.ndarray:
            out = np.full(cells.shape, fill, dtype=np.int64)
            out[cells] = np.fromiter(chain.from_iterable(getattr(s, field) for s in sequences),
                                     dtype=np.int64, count=int(cells.sum()))  # fmt: skip
            return out

        def padded(field: str, fill: int, cells: np.ndarray) -> torch.Tensor:
            return on_device(padded_array(field, fill, cells), device)

        predictor = padded_array("predictor", -1, targets)
        requests = [index for s in sequences for index in s.requests]
        spans = [(b, *span) for b, s in enumerate(sequences) for span in s.spans]
        return cls(
            padded("ids", 0, inputs), padded("branch", -2, inputs), padded("offset", 0, inputs),
            padded("position", 0, inputs), padded("row_seen", 0, inputs),
            padded("targets", 0, targets), on_device(predictor, device),
            cells_on_device(predictor >= 0, device),
            any(s.branched for s in sequences), requests, spans,
        )  # fmt: skip

    def allowed(self, context_length: int) -> torch.Tensor:
        """(rows, 1, width, context + width): every token sees the context; a row token the
        row up to itself; a branch token the row before its attach point and its own branch
        up to itself."""
        query, key = (slice(None), slice(None), None), (slice(None), None, slice(None))
        sees_row = (self.branch[key] == -1) & (self.offset[key] < self.row_seen[query])
        own_branch = (self.branch[key] == self.branch[query]) & (self.branch[query] >= 0)
        sees_branch = own_branch & (self.offset[key] <= self.offset[query])
        context = torch.ones(
            (*self.ids.shape, context_length), dtype=torch.bool, device=self.ids.device
        )
        return torch.cat([context, sees_row | sees_branch], dim=-1)[:, None]


def on_device(array: np.ndarray, device: str) -> torch.Tensor:
    """A host array as a tensor on `device`, copied without waiting for the device."""
    return torch.from_numpy(array).to(device, non_blocking=True)


def cells_on_device(marked: np.ndarray, device: str) -> tuple[torch.Tensor, ...]:
    """The indices of the cells `marked` (a host array) marks, on `device`: indexing with
    them asks the device nothing, where a boolean mask there would wait for it to count."""
    return tuple(on_device(index, device) for index in np.nonzero(marked))
