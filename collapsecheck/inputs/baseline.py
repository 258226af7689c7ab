"""The baseline a policy's reasoning is scored under (SPEC "Scored under the start"), checked
before anything is sampled: a checkpoint there, its weights' headers readable, and its
tokenizer the policy's own (the same ids for the same tokens), or one line saying which."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import (
    Checkpoint,
    checkpoint_files,
    load_tokenizer,
    require_checkpoint,
)
from collapsecheck.inputs.formats.base import first_line


def require_baseline(
    path: str | Path | Checkpoint, policies: Sequence[Checkpoint], base_model: Path | None = None,
    trust_remote_code: bool = False,
) -> Checkpoint:  # fmt: skip
    """The baseline checkpoint, refused in one line naming it where it is missing, its
    weights unreadable, or its tokenizer not that of every policy in `policies`."""
    if isinstance(path, Checkpoint):
        baseline = path
    else:
        try:
            baseline = require_checkpoint(path, base_model)
        except CollapsecheckError as err:
            raise CollapsecheckError(f"--baseline: {err}") from None
    check_weights_readable(baseline)
    check_tokenizers(baseline, policies, trust_remote_code)
    return baseline


def check_tokenizers(
    baseline: Checkpoint, policies: Sequence[Checkpoint], trust_remote_code: bool = False
) -> None:
    """Each policy's tokenizer is the baseline's (`check_same_tokenizer`), each pair compared
    once per process (a watch plans its rows again at every look)."""
    for policy in policies:
        if policy.path != baseline.path:
            _check_pair(baseline, policy, trust_remote_code)


@functools.lru_cache(maxsize=256)
def _check_pair(baseline: Checkpoint, policy: Checkpoint, trust_remote_code: bool) -> None:
    theirs, ours = (_vocabulary(c, trust_remote_code) for c in (baseline, policy))
    check_same_tokenizer(baseline, theirs, policy, ours)


def check_weights_readable(checkpoint: Checkpoint) -> None:
    """Each safetensors file's header parses (the tensors are not read)."""
    from safetensors import safe_open

    for path in checkpoint_files(checkpoint):
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="np") as weights:
                weights.keys()
        except Exception as err:  # safetensors raises its own error types
            raise CollapsecheckError(
                f"--baseline {checkpoint.path}: {path.name} is not readable ({first_line(err)})"
            ) from None


def check_same_tokenizer(
    baseline: Checkpoint, theirs: dict[str, int], policy: Checkpoint, ours: dict[str, int]
) -> None:
    """The same token for the same id in both, or one line naming both checkpoints."""
    if theirs == ours:
        return
    differing = sorted(t for t in set(theirs) | set(ours) if theirs.get(t) != ours.get(t))
    raise CollapsecheckError(
        f"--baseline {baseline.path}: its tokenizer is not that of {policy.path} "
        f"({len(theirs)} vs {len(ours)} tokens, {len(differing)} with other ids, e.g. "
        f"{differing[0]!r}): its log-probabilities of the policy's token ids would mean "
        "nothing; use the checkpoint the run started from"
    )


@functools.lru_cache(maxsize=64)
def _vocabulary(checkpoint: Checkpoint, trust_remote_code: bool) -> dict[str, int]:
    """Token to id (read once per checkpoint: a run checks each of its rows)."""
    return dict(load_tokenizer(checkpoint, trust_remote_code).get_vocab())
