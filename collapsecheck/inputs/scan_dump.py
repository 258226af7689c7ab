"""A scan's dump read back (SPEC "Dump format"): its prompts as rendered and its sampled
response ids, exactly, to score the traces again; the files `reports.dump` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.images import PromptImage
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt, file_sha256
from collapsecheck.inputs.samples import Sample, SampledPrompts

PROMPTS_FILE = "prompts.jsonl"
TRACES_FILE = "traces.jsonl"
IMAGES_DIR = "images"  # each distinct image of the prompts, its bytes as read, by sha256


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


def read_images(directory: Path, row: dict[str, Any], where: str) -> tuple[tuple[int, Any], ...]:
    """A prompt row's images from the dump's IMAGES_DIR, each checked against its hash."""
    images = []
    for entry in row.get("images", []):
        path = directory / IMAGES_DIR / entry["sha256"]
        try:
            image = PromptImage(entry["source"], path.read_bytes())
        except OSError as err:
            raise CollapsecheckError(f"{where}: image {path}: {err.strerror}") from None
        if image.sha256 != entry["sha256"]:
            raise CollapsecheckError(f"{where}: image {path} changed since the scan wrote it")
        images.append((int(entry["slot"]), image))
    return tuple(images)


def read_dump_samples(directory: str | Path) -> SampledPrompts:
    """A scan's dump: rendered prompts and sampled ids as they were, not re-tokenized."""
    directory = Path(directory)
    prompt_rows = read_jsonl(directory / PROMPTS_FILE)
    trace_rows = read_jsonl(directory / TRACES_FILE)
    try:
        rendered = [
            RenderedPrompt(
                row["text"],
                tuple(row["ids"]),
                read_images(directory, row, f"{directory / PROMPTS_FILE}:{line}"),
            )
            for line, row in enumerate(prompt_rows, 1)
        ]
        samples: list[list[Sample]] = [[] for _ in rendered]
        for row in trace_rows:
            samples[row["prompt_index"]].append(
                Sample(tuple(row["response_ids"]), bool(row["truncated"]))
            )
    except (KeyError, IndexError, TypeError) as err:
        raise CollapsecheckError(
            f"{directory}: not a complete collapsecheck dump ({err})"
        ) from None
    prompts = [
        Prompt(r.text, f"{directory / PROMPTS_FILE}:{i + 1}") for i, r in enumerate(rendered)
    ]
    settings = {"rollouts": str(directory), "rollouts_sha256": file_sha256(directory / TRACES_FILE)}
    settings.update(dump_temperature(directory))
    return SampledPrompts(prompts, rendered, samples, settings)


def dump_temperature(directory: Path) -> dict[str, Any]:
    """`{"sampled_temperature": T}` from the dump's report.json, where the scan that wrote it
    finished: the temperature it sampled at, or the one its rollouts were sampled at (with
    `sampled_temperature_source`, where the report says how that was known); else nothing."""
    try:
        settings = json.loads((directory / "report.json").read_text(encoding="utf-8"))["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    sampling = settings.get("sampling") or {}
    named = sampling.get("temperature", settings.get("sampled_temperature"))
    if named is None:
        return {}
    source = settings.get("sampled_temperature_source")
    return {"sampled_temperature": float(named)} | (
        {"sampled_temperature_source": source} if source else {}
    )
