"""The commands' own options (the settings dataclasses bring the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapsecheck.errors import CollapsecheckError

Prompts = Annotated[
    Path | None,
    typer.Option("--prompts", "-p", help="Prompt set: JSONL, parquet (veRL) or plain text."),
]

ScanPrompts = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        "-p",
        help="Prompt set: JSONL, parquet (veRL) or plain text. With a run's veRL rollouts: the "
        "training prompt file their decoded inputs are matched to.",
    ),
]

Rescan = Annotated[
    bool,
    typer.Option("--rescan", help="Ignore cached results and kept traces: sample and score anew."),
]


def parse_train_keys(values: list[str]) -> dict[str, str]:
    """--train-key NAME=KEY, repeatable."""
    keys = {}
    for value in values:
        name, sep, key = value.partition("=")
        if not (sep and name and key):
            raise CollapsecheckError(f"--train-key expects NAME=KEY, got {value!r}")
        keys[name] = key
    return keys


# The commands' own options (the settings dataclasses bring the rest).
Checkpoint = Annotated[
    Path, typer.Argument(help="A checkpoint directory, or a run directory of checkpoints.")
]
# a string, not a Path: a Path folds a URL's "//"
ScanTarget = Annotated[
    str,
    typer.Argument(
        help="A checkpoint directory, a run directory of checkpoints, or the URL of a vLLM "
        "server serving the policy (http://HOST:PORT/v1)."
    ),
]

TrainLog = Annotated[
    Path | None,
    typer.Option(
        help="The run's training log: trainer_state.json, veRL file logger JSONL, "
        "JSONL/CSV with a step column, or TensorBoard events."
    ),
]

NoTrainLog = Annotated[
    bool, typer.Option("--no-train-log", help="Do not read the run's training log.")
]

TrainKey = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME=KEY: read series NAME from log key KEY (repeatable).", metavar="NAME=KEY"
    ),
]

Baseline = Annotated[
    Path | None,
    typer.Option(
        help="The policy the run started from: scanned as step 0 of a run (or beside one "
        "checkpoint), and each checkpoint's reasoning also scored under it (SPEC \"Scored "
        'under the start").'
    ),
]

Shard = Annotated[
    str | None,
    typer.Option(
        help="I/N: scan share I (0-based) of N of a run's checkpoints into the results "
        "cache; a plain scan of the run joins them. Read from a Slurm array's "
        "SLURM_ARRAY_TASK_ID when set.",
        rich_help_panel="Where the work runs",
    ),
]

DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan (checkpoints, cached ones, pairs, a token bound) and exit.",
        rich_help_panel="Where the work runs",
    ),
]

Rollouts = Annotated[
    Path | None,
    typer.Option(
        help="A run's rollouts, as its trainer wrote them (veRL's rollout_data_dir, ROLL's "
        "rollout_dump_dir, AReaL's rollout/, ...; TRL's completions/, slime's rollout_data/, "
        "SkyRL's dumped_evals/ and prime-rl's rollouts/ are found in the run directory): each "
        "step's scored under the checkpoint that sampled it, with no sampling. Used by default "
        "where a run holds them.",
        rich_help_panel="Where the traces come from",
    ),
]

Sample = Annotated[
    bool,
    typer.Option(
        "--sample",
        help="Sample afresh from --prompts, even where the run holds its trainer's rollouts.",
        rich_help_panel="Where the traces come from",
    ),
]

Ray = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help="Scan each uncached checkpoint of the run as one Ray task (one GPU each, or "
        "one CPU), then write the run report here. ADDRESS: host:port or ray://host:port, "
        "auto (the cluster running here, a veRL job's) or local (a new one); a bare --ray "
        "does as ray.init(): RAY_ADDRESS, else a cluster running here, else a new local one.",
        rich_help_panel="Where the work runs",
    ),
]

ScoreRollouts = Annotated[
    Path,
    typer.Argument(
        help="Rollouts (JSONL or parquet), a trainer's own dump file or step folder (TRL, "
        "veRL, slime, SkyRL, AReaL, ROLL, prime-rl, RAGEN), or a --dump directory."
    ),
]

ScoreCheckpoint = Annotated[
    Path | None,
    typer.Option("--checkpoint", "-c", help="The policy that produced the rollouts."),
]
ScoreServer = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="The policy as a vLLM server serves it (http://HOST:PORT/v1), instead of "
        "--checkpoint: the rollouts scored through its HTTP API.",
    ),
]

ScorePrompts = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        "-p",
        help="veRL rollout dumps: the training prompt file (parquet or JSONL); each decoded "
        "input is matched to its row and scored in the context the trainer rendered.",
    ),
]

ResponseField = Annotated[
    str | None, typer.Option(help="Field of the response text [response/output/completion].")
]

ResponseIdsField = Annotated[
    str | None, typer.Option(help="Field of the response's sampled token ids, if any.")
]

GroupField = Annotated[
    str | None, typer.Option(help="Field grouping rows by prompt [uid/group_id/prompt_id].")
]

TurnSampling = Annotated[str, typer.Option(help="Multi-turn rollouts: turn, trajectory or first.")]

Pairs = Annotated[
    int | None, typer.Option(help="Multi-turn rollouts: (trajectory, turn) pairs to sample.")
]

TensorBoard = Annotated[
    str | None,
    typer.Option(
        "--tensorboard", metavar="DIR|auto",
        help="Write each checkpoint's diagnosis as TensorBoard scalars (collapse/...) at its "
        "global step, as a run of its own in DIR/collapsecheck (point DIR into the trainer's "
        "log folder); auto: the folder of the trainer's own event files under the run "
        "directory. Needs the tensorboard package (the logs extra).",
        rich_help_panel="Dashboards",
    ),
]  # fmt: skip

WandbRun = Annotated[
    str | None,
    typer.Option(
        "--wandb", metavar="ENTITY/PROJECT/RUN_ID",
        help="Log each checkpoint's diagnosis into the trainer's W&B run (shared mode while "
        "the trainer holds it, resumed by id once it ended; WANDB_MODE=offline: an offline "
        "run of that id), at collapse/global_step. Needs the wandb package (the wandb extra).",
        rich_help_panel="Dashboards",
    ),
]  # fmt: skip

Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v",
        help="Also print where the time went: loading, sampling (new tokens per second) and "
        "scoring (tokens per second), per checkpoint.",
    ),
]  # fmt: skip

A = Annotated[
    str,
    typer.Argument(
        help="Checkpoint A (the baseline; a checkpoint B is also scored under it), its "
        "report.json, or a vLLM server's URL serving it (http://HOST:PORT/v1)."
    ),
]
B = Annotated[
    str,
    typer.Argument(
        help="Checkpoint B (the candidate), its report.json, or a vLLM server's URL serving it."
    ),
]

MaxDrop = Annotated[
    float | None,
    typer.Option(help="Tolerated drop of normalized MI and retrieval skill (default 0)."),
]

GateExit = Annotated[
    bool,
    typer.Option("--gate/--no-gate", help="Exit 1 when B lost input dependence."),
]

AllowMismatch = Annotated[
    bool,
    typer.Option(
        "--allow-mismatch",
        help="Compare reports of other prompts or settings anyway (with a warning).",
    ),
]

Config = Annotated[
    Path | None,
    typer.Option(help="Gate settings file (default: ./collapsecheck.toml or ./pyproject.toml)."),
]

WatchRun = Annotated[
    str,
    typer.Argument(
        help="The run directory a trainer is writing (it may not exist yet), or the URL of "
        "the vLLM server serving its policy (http://HOST:PORT/v1; with --every)."
    ),
]
Every = Annotated[
    str | None,
    typer.Option(
        help="With a served policy's URL: diagnose it each DURATION (30s, 10m, 1h; seconds "
        "where no unit), from one diagnosis's start to the next's."
    ),
]
