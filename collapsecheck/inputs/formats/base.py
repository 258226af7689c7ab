"""What every checkpoint format shares: the recognised checkpoint, and how transformers is
asked to load things offline and quietly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from collapsecheck.settings import LoadSettings

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Checkpoint:
    """A recognised checkpoint: its format, where its weights are, where its config and
    tokenizer are, and (PEFT) its base model."""

    kind: str
    path: Path
    config_dir: Path
    base: Checkpoint | None = None
    # what was read other than the folder named, or how it was read (said in the report)
    note: str | None = None
    # where the policy was read, where not a folder (a served policy's URL: a Path folds "//")
    url: str | None = None

    @property
    def where(self) -> str:
        """The folder, or the URL of a served policy."""
        return self.url or str(self.path)


# Loads another checkpoint's weights (an adapter's base) with the same dtype and settings.
LoadBase = Callable[[Checkpoint], Any]
# Recognises the checkpoint in another directory (an adapter's base), or says what is wrong.
Require = Callable[[Path], Checkpoint]


class CheckpointFormat(Protocol):
    """One module per format provides these."""

    KIND: str
    EXPECTED: str  # what a directory of this format holds, for "no checkpoint here" errors

    def detect(
        self, path: Path, base_model: Path | None, require: Require
    ) -> Checkpoint | None: ...

    def files(self, checkpoint: Checkpoint) -> list[Path]: ...

    def load_weights(
        self, checkpoint: Checkpoint, dtype: Any, settings: LoadSettings, load_base: LoadBase
    ) -> Any: ...


def weight_files(path: Path) -> list[Path]:
    return [path / name for name in WEIGHT_FILES if (path / name).is_file()]


def own_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file())


def first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers on the user's terminal."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def model_from_config(config_dir: Path, dtype: Any, trust_remote_code: bool) -> Any:
    """An uninitialised causal LM of the architecture in `config_dir`, for weights merged in
    memory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(
        config_dir, local_files_only=True, trust_remote_code=trust_remote_code
    )
    return AutoModelForCausalLM.from_config(
        config, dtype=dtype, trust_remote_code=trust_remote_code
    )
