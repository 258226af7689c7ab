"""The `--dump DIR` files of SPEC "Dump format": enough to redo the analysis elsewhere.

Every file is written to a temporary name and renamed into place, so a killed run never
leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from collapsecheck.cross_scoring import CrossScores
from collapsecheck.errors import CollapsecheckError
from collapsecheck.prompts import RenderedPrompt
from collapsecheck.reasoning import Trace

PROMPTS_FILE = "prompts.jsonl"
TRACES_FILE = "traces.jsonl"
MATRIX_FILE = "cross_logprobs.npz"
REPORT_FILE = "report.json"


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


def write_samples(directory: Path, rendered: Sequence[RenderedPrompt], traces: Sequence[Trace]) -> None:
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
        )

    _write_atomic(directory / MATRIX_FILE, "wb", save)
