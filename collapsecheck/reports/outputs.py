"""What a command writes beside what it prints (`OutputSettings`): the checks, all made before
any model loads so that work is never lost to a path that cannot be written at the end, and
the writers of the per-prompt table and the kept prompts."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import check_output_dir, check_output_file, write_atomic
from collapsecheck.settings import OutputSettings, RewardSettings, flag_name


def option_name(name: str) -> str:
    """The flag of an OutputSettings field, as the user typed it."""
    meta = next(f.metadata for f in fields(OutputSettings) if f.name == name)
    return meta["flags"][0] if meta["flags"] else flag_name(name)


def check_outputs(
    outputs: OutputSettings, rewards: RewardSettings | None = None, prompts: Path | None = None
) -> None:
    """Every output path writable (a file where a file is meant, a directory where one is),
    and (given the scan's `rewards`) --keep-prompts given what it needs."""
    for f in fields(outputs):
        path = getattr(outputs, f.name)
        check = check_output_dir if f.metadata["directory"] else check_output_file
        check(path, option_name(f.name))
    if outputs.keep_prompts is not None and rewards is not None:
        check_keep_prompts(outputs.keep_prompts, rewards, prompts)


def check_keep_prompts(path: Path, rewards: RewardSettings | None, prompts: Path | None) -> None:
    from collapsecheck.inputs.prompts import check_same_format

    if rewards is None or rewards.reward_fn is None:
        raise CollapsecheckError("--keep-prompts needs rewards: give --reward-fn FILE.py")
    if prompts is None:
        raise CollapsecheckError("--keep-prompts writes prompt rows: give --prompts FILE")
    check_same_format(prompts, path, "--keep-prompts")


def write_per_prompt_table(report: Any, path: Path | None) -> None:
    """--per-prompt: the table as CSV, or parquet by extension."""
    if path is None:
        return
    frame = report.per_prompt_frame()
    if path.suffix.lower() in (".parquet", ".pq"):
        write_atomic(path, "wb", lambda stream: frame.to_parquet(stream))
    else:
        write_atomic(path, "w", lambda stream: frame.to_csv(stream))


def write_kept_prompts(
    report: Any, prompt_file: Path, num_prompts: int | None, field: str | None, path: Path
) -> str:
    """--keep-prompts: the rows of the prompts RAGEN's SNR filter keeps; returns the line
    that says how many."""
    from collapsecheck.inputs.prompts import load_prompts, write_prompt_rows

    prompts = load_prompts(prompt_file, num_prompts=num_prompts, field=field)
    kept = [prompts[i] for i in report.snr["kept_prompts"]]
    write_prompt_rows(prompt_file, kept, path)
    return kept_line(report, len(kept), len(prompts), path)


def kept_line(report: Any, kept: int, total: int, path: Path) -> str:
    """The line that says how many prompts --keep-prompts wrote, and where."""
    top_p = report.snr["snr_top_p"]
    return f"kept {kept} of {total} prompts (SNR filter, top-p {top_p:g}) in {path}"


def check_keep_rollout_prompts(
    path: Path, rollouts: Path, parsed: Any, training: Path | None
) -> None:
    """score --keep-prompts: rollouts with rewards, and a target in the format written (the
    training file's, else JSONL)."""
    from collapsecheck.inputs.prompts import PARQUET_SUFFIXES, check_same_format

    if parsed is None or parsed.rewards is None:
        raise CollapsecheckError(
            f"--keep-prompts needs rewards: {rollouts} has no reward or score field "
            "(--reward-field NAME names another)"
        )
    if training is not None:
        check_same_format(training, path, "--keep-prompts")
    elif path.suffix.lower() in PARQUET_SUFFIXES:
        raise CollapsecheckError(
            f"--keep-prompts {path}: the rollouts' prompts are written as JSONL rows (--prompts "
            "TRAIN_FILE writes the training file's rows, in its format)"
        )


def write_kept_rollout_prompts(report: Any, path: Path, training: Path | None) -> str:
    """score --keep-prompts: the kept prompts as the training file's rows (those matched to
    one), else as JSONL rows {"prompt": text or chat messages}, the form TRL and veRL read;
    returns the line that says how many."""
    from collapsecheck.files import write_text_atomic
    from collapsecheck.inputs.prompts import write_prompt_rows

    kept = [report.prompts[i] for i in report.snr["kept_prompts"]]
    said = kept_line(report, len(kept), len(report.prompts), path)
    if training is None:
        rows = "".join(json.dumps({"prompt": p.content}) + "\n" for p in kept)
        write_text_atomic(path, rows)
        return said
    matched = [p for p in kept if p.number is not None]
    write_prompt_rows(training, matched, path)
    missing = len(kept) - len(matched)
    return said + (f"; {missing} matched no row of {training} and are left out" if missing else "")
