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
    if same_tokenizer_files(Path(baseline.config_dir), Path(policy.config_dir)):
        return
    theirs, ours = (_vocabulary(c, trust_remote_code) for c in (baseline, policy))
    check_same_tokenizer(baseline, theirs, policy, ours)


# The files transformers' AutoTokenizer reads a tokenizer from.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
)  # fmt: skip
TOKENIZER_CONFIG = "tokenizer_config.json"
# What transformers writes into tokenizer_config.json of how it loaded the tokenizer it saves
# (a trainer's checkpoint has them, the model it started from may not): no vocabulary changes.
LOAD_RECORD_KEYS = frozenset({"name_or_path", "is_local", "local_files_only", "_commit_hash"})


def same_tokenizer_files(first: Path, second: Path) -> bool:
    """Both directories hold the same tokenizer files, byte for byte, but for what
    tokenizer_config.json records of how it was loaded (LOAD_RECORD_KEYS): the same
    vocabulary, known without loading either tokenizer, so a cached rerun imports no model
    library (docs/decisions.md, "Start-up"). Any other difference, even one that leaves the
    vocabularies equal, is left to `check_same_tokenizer`."""
    names = [n for n in TOKENIZER_FILES if (first / n).is_file() or (second / n).is_file()]
    contents = [(_tokenizer_file(first / n), _tokenizer_file(second / n)) for n in names]
    return bool(contents) and all(a is not None and a == b for a, b in contents)


def _tokenizer_file(path: Path) -> object:
    """A tokenizer file's content as compared: its bytes; tokenizer_config.json parsed,
    without LOAD_RECORD_KEYS. None where the file is missing or unreadable."""
    import json

    try:
        content = path.read_bytes()
        if path.name != TOKENIZER_CONFIG:
            return content
        config = json.loads(content)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return {k: v for k, v in config.items() if k not in LOAD_RECORD_KEYS}


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
