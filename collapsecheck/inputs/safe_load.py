"""Trainers' `.pt` and pickle dumps read as data, never run.

A pickle names the functions that rebuild its objects, and loading it calls them: a dump can
carry code. Here nothing the file names is imported or called except plain data (containers,
strings, numbers), tensors and numpy arrays rebuilt as `torch.load(weights_only=True)` rebuilds
them, and a trainer's own record classes, which are never imported: each becomes a `Record`
(a dict of its fields) named after the class. PIL images (a vision run's samples) become a
`PickledImage` of their mode, size and raw pixels, not rebuilt by PIL's pickle code. A file
that needs anything else is refused in one line naming the file and what it asked for.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.formats.base import first_line

# plain data a pickle may rebuild: (module, name) -> how
PLAIN = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("collections", "OrderedDict"): dict,
    ("collections", "defaultdict"): lambda *args: {},
}


class Record(dict):
    """A trainer's record class as data: its fields (pickled state), or, for an enum or a
    class rebuilt from arguments, `args`. `kind` is the class it stands for."""

    kind = "record"

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if args:
            self["args"] = list(args)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            for part in state:
                self.__setstate__(part) if part is not None else None
        elif isinstance(state, dict):
            self.update(state)
        else:
            self["state"] = state

    @property
    def value(self) -> Any:
        """An enum's value (a record rebuilt from one argument), else the record."""
        args = self.get("args")
        return args[0] if len(self) == 1 and isinstance(args, list) and len(args) == 1 else self


class PickledImage(Record):
    """A PIL image as its pickle holds it (`[info, mode, size, palette, pixels]`, PIL's
    `__getstate__`), never rebuilt by PIL's own code: `png()` makes an image of the raw pixels."""

    kind = "PIL image"

    def png(self) -> bytes:
        """The pixels as a PNG file (decoding raw bytes of a named mode runs no code)."""
        from PIL import Image

        _info, mode, size, palette, pixels = self["state"][:5]  # an ImageFile adds its format
        image = Image.frombytes(mode, tuple(size), pixels)
        if mode in ("L", "LA", "P", "PA") and palette:  # as PIL's own __setstate__
            image.putpalette(palette)
        stream = io.BytesIO()
        image.save(stream, format="PNG")
        return stream.getvalue()


# PIL's image classes: Image itself and each format plugin's (PngImagePlugin.PngImageFile, ...)
PIL_IMAGE = re.compile(r"PIL\.(Image\.Image|\w+ImagePlugin\.\w+ImageFile)")


def record_class(qualified: str) -> type[Record]:
    """A stand-in for the trainer's class `qualified` (module.Name), never imported."""
    return type(qualified.rsplit(".", 1)[-1], (Record,), {"kind": qualified})


def refusal(path: Path, wanted: str) -> CollapsecheckError:
    return CollapsecheckError(
        f"{path}: the file needs {wanted} to be read, which could run code; collapsecheck "
        "reads pickles and .pt files only as data (containers, numbers, text, tensors, the "
        "trainer's own records), so it does not read this one"
    )


def numpy_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    reconstruct = np._core.multiarray._reconstruct
    scalar = np._core.multiarray.scalar
    return {
        (module, name): value
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name, value in (("_reconstruct", reconstruct), ("scalar", scalar))
    } | {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        **{("numpy.dtypes", n): getattr(np.dtypes, n) for n in dir(np.dtypes) if "DType" in n},
    }


def torch_globals() -> dict[tuple[str, str], Any]:
    """What a plain pickle of tensors names: the rebuild functions torch's own weights-only
    loader allows, and a storage's bytes loaded by it."""
    import torch

    def storage_from_bytes(data: bytes) -> Any:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    allowed = {("torch.storage", "_load_from_bytes"): storage_from_bytes}
    for qualified, value in torch._weights_only_unpickler._get_allowed_globals().items():
        module, _, name = qualified.rpartition(".")
        allowed[(module, name)] = value
    return allowed


class DataUnpickler(pickle.Unpickler):
    """An unpickler that builds only data (module docstring); `records`: the trainer's class
    names read as `Record`s."""

    def __init__(self, stream: Any, path: Path, records: Iterable[str]) -> None:
        super().__init__(stream)
        self.path = path
        self.records = {name: record_class(name) for name in records}
        self.allowed = {**PLAIN, **numpy_globals(), **torch_globals()}

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified in self.records:
            return self.records[qualified]
        if PIL_IMAGE.fullmatch(qualified):
            return PickledImage
        found = self.allowed.get((module, name), KeyError)
        if found is KeyError:
            raise refusal(self.path, qualified)
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise refusal(self.path, f"a persistent object ({pid!r:.40})")


def load_pickle(path: Path, records: Iterable[str] = ()) -> Any:
    """A pickle file's data (`records`: the trainer's classes to read as `Record`s)."""
    try:
        with path.open("rb") as stream:
            return DataUnpickler(stream, path, records).load()
    except CollapsecheckError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
        raise CollapsecheckError(f"{path}: not a readable pickle ({err})") from None


def load_torch(path: Path, records: Iterable[str] = ()) -> Any:
    """A `torch.save` file's data, read by torch's weights-only loader; `records`: the
    trainer's classes it may name, read as `Record`s (registered for this load only)."""
    import torch

    if not zipfile.is_zipfile(path):
        return load_pickle(path, records)
    stand_ins = [(record_class(name), name) for name in records] + [
        (value, f"{module}.{name}") for (module, name), value in numpy_globals().items()
    ]
    stand_ins += [(PickledImage, name) for name in pil_images_named(path)]
    try:
        with torch.serialization.safe_globals(stand_ins):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        wanted = unsupported_global(str(err))
        if wanted is not None:
            raise refusal(path, wanted) from None
        raise CollapsecheckError(f"{path}: not a readable .pt file ({first_line(err)})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile) as err:
        raise CollapsecheckError(f"{path}: not a readable .pt file ({first_line(err)})") from None


def pil_images_named(path: Path) -> list[str]:
    """The PIL image classes a `.pt` file's pickle names (read from its opcodes, not run)."""
    import torch

    try:
        named = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # an unreadable file is said by the load that follows
        return []
    return [name for name in named if PIL_IMAGE.fullmatch(name)]


def unsupported_global(message: str) -> str | None:
    """The global torch's weights-only loader refused, from its message ("Unsupported
    global: GLOBAL a.b" or "unsupported GLOBAL a.b whose module a is blocked")."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    return found.group(1).rstrip(".") if found else None
