"""The `--dump DIR` files of SPEC "Dump format": enough to redo the analysis elsewhere.

Every file is written to a temporary name and renamed into place, so a killed run never
leaves a half-written file.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from collapsecheck.cross_scoring import CrossScores, column_groups
from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import CrossLogProbs, PromptCounts, count_per_prompt
from collapsecheck.prompts import RenderedPrompt
from collapsecheck.reasoning import Trace

PROMPTS_FILE = "prompts.jsonl"
TRACES_FILE = "traces.jsonl"
MATRIX_FILE = "cross_logprobs.npz"
REPORT_FILE = "report.json"


LOCK_FILE = ".collapsecheck.lock"


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the directory for one writer: a second scan writing there gets a clear error."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CollapsecheckError(
                f"{directory}: another collapsecheck scan is writing here; wait for it to end "
                "or give another output directory"
            ) from None
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomic(path: Path, mode: str, write: Callable[[IO[Any]], None]) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(handle, mode) as stream:
                write(stream)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise CollapsecheckError(f"{path}: cannot write ({err.strerror or err})") from None
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    return _write_atomic(path, "w", lambda stream: stream.write(text))


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return write_text_atomic(path, text)


def prompt_rows(rendered: Sequence[RenderedPrompt]) -> list[dict[str, Any]]:
    return [{"index": i, "text": p.text, "ids": list(p.ids)} for i, p in enumerate(rendered)]


def trace_rows(traces: Sequence[Trace]) -> list[dict[str, Any]]:
    return [
        {
            "prompt_index": t.prompt_index,
            "sample_index": t.sample_index,
            "response": t.response,
            "response_ids": list(t.response_ids),
            "prefix_ids": list(t.prefix_ids),
            "reasoning_ids": list(t.reasoning_ids),
            "reasoning": t.reasoning,
            "valid": t.valid,
            "truncated": t.truncated,
        }
        for t in traces
    ]


def write_samples(
    directory: Path, rendered: Sequence[RenderedPrompt], traces: Sequence[Trace]
) -> None:
    """prompts.jsonl and traces.jsonl: written as soon as sampling ends."""
    write_jsonl_atomic(directory / PROMPTS_FILE, prompt_rows(rendered))
    write_jsonl_atomic(directory / TRACES_FILE, trace_rows(traces))


def write_matrix(directory: Path, scores: CrossScores) -> None:
    def save(stream: IO[bytes]) -> None:
        np.savez(
            stream,
            sum=scores.matrix.sum,
            mean=scores.matrix.mean,
            row_prompt_index=scores.matrix.row_prompt,
            row_trace_index=scores.row_trace_index,
            reasoning_tokens=scores.reasoning_tokens,
            **({} if scores.matrix.is_full else {"scored": scores.matrix.scored}),
        )

    _write_atomic(directory / MATRIX_FILE, "wb", save)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CollapsecheckError(f"{path}: missing from the dump directory") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise CollapsecheckError(f"{path}:{number}: malformed JSON ({err.msg})") from None
    return rows


def read_dump(directory: str | Path) -> tuple[CrossLogProbs, PromptCounts]:
    """The matrix and per-prompt counts of a dump: what `compute_metrics` needs to redo the
    analysis."""
    directory = Path(directory)
    prompts = read_jsonl(directory / PROMPTS_FILE)
    traces = read_jsonl(directory / TRACES_FILE)
    try:
        with np.load(directory / MATRIX_FILE) as npz:
            arrays = {key: npz[key] for key in npz.files}
        matrix = CrossLogProbs(
            sum=arrays["sum"],
            mean=arrays["mean"],
            row_prompt=arrays["row_prompt_index"],
            column_group=column_groups([row["ids"] for row in prompts]),
            scored=arrays.get("scored"),
        )
        counts = count_per_prompt(
            len(prompts),
            [row["prompt_index"] for row in traces],
            [row["valid"] for row in traces],
            [row["truncated"] for row in traces],
            [row["reasoning"] for row in traces],
        )
    except FileNotFoundError:
        raise CollapsecheckError(f"{directory / MATRIX_FILE}: missing from the dump") from None
    except (KeyError, ValueError, OSError) as err:
        raise CollapsecheckError(
            f"{directory}: not a complete collapsecheck dump ({err})"
        ) from None
    return matrix, counts
