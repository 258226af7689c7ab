"""What a command writes beside what it prints (`OutputSettings`): the checks, all made before
any model loads so that work is never lost to a path that cannot be written at the end, and
the writers of the per-prompt table and the kept prompts."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import check_output_dir, check_output_file, write_atomic
from collapsecheck.settings import OutputSettings, RewardSettings, Settings, flag_name


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


def prompt_rows(
    report: Any, prompt_file: Path | None, settings: Settings
) -> tuple[Path, list[int | None]]:
    """The file the report's prompts came from, and each one's row in it: a trace source's
    own record (`prompt_rows`: rollouts), else the prompt set as the scan read it."""
    from collapsecheck.inputs.prompts import load_prompts

    recorded = report.settings.get("prompt_rows")
    if recorded is not None:
        return Path(recorded["file"]), list(recorded["rows"])
    if prompt_file is None:
        raise CollapsecheckError(
            "--keep-prompts: this report does not record where its prompts came from (cached "
            "before this version?): pass --rescan"
        )
    sampling, rendering = settings.sampling, settings.prompts
    prompts = load_prompts(
        prompt_file, num_prompts=sampling.num_prompts, field=rendering.prompt_field
    )
    return prompt_file, [p.number for p in prompts]


def write_kept_prompts(
    report: Any, path: Path, prompt_file: Path | None, settings: Settings
) -> str:
    """--keep-prompts: the rows of the prompts RAGEN's SNR filter keeps, exactly as the file
    they came from holds them (every column; the training file's rows for veRL inputs matched
    to one; every row of a prompt whose rows were one context); returns the line that says
    how many, and how many had no row to write."""
    from collapsecheck.inputs.prompts import write_prompt_rows

    source, rows = prompt_rows(report, prompt_file, settings)
    sources = report.settings.get("prompt_sources") or [[i] for i in range(len(rows))]
    chosen = report.snr["kept_prompts"]
    kept = [rows[row] for i in chosen for row in sources[i]]
    written = [n for n in kept if n is not None]
    write_prompt_rows(source, written, path)
    top_p = report.snr["snr_top_p"]
    said = f"kept {len(chosen)} of {len(sources)} prompts (SNR filter, top-p {top_p:g}) in {path}"
    said += f", {len(written)} rows of {source}"
    missing = len(kept) - len(written)
    return said + (f"; {missing} matched no row of {source} and are left out" if missing else "")


def check_keep_rollout_prompts(
    path: Path, rollouts: Path, parsed: Any, training: Path | None
) -> None:
    """--keep-prompts from rollouts: rewards to keep by, and a target in the format of the
    file whose rows are written (the training file's, else the rollout file's)."""
    from collapsecheck.inputs.prompts import check_same_format

    if parsed is None or parsed.rewards is None:
        raise CollapsecheckError(
            f"--keep-prompts needs rewards: {rollouts} has no reward or score field "
            "(--reward-field NAME names another)"
        )
    check_same_format(training if training is not None else rollouts, path, "--keep-prompts")


def write_prompt_outputs(
    report: Any, outputs: OutputSettings, prompt_file: Path | None, settings: Settings
) -> str | None:
    """--per-prompt and --keep-prompts (when the report has the SNR section to keep from);
    the line that says what was kept, if anything was."""
    write_per_prompt_table(report, outputs.per_prompt)
    if outputs.keep_prompts is None or report.snr is None:
        return None
    return write_kept_prompts(report, outputs.keep_prompts, prompt_file, settings)
