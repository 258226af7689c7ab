"""What the trainer-dump fixture scripts share (scripts/make_*_rollouts.py, make_skyrl_*.py,
make_roll_dumps.py, make_prime_rl_traces.py, make_ragen_trajectories.py): where the batch and
the fixtures are, the gridworld reward, and fetching a trainer's own code at generation time
(a wheel, or a folder of a git snapshot) without keeping it here. Standard library only: each
script runs in its trainer's own environment, which does not have collapsecheck."""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import importlib.util
import io
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
DUMPS = ROOT / "tests" / "fixtures" / "trainer-dumps"
BATCH = DUMPS / "batch.json"  # make_trainer_dumps.py: the sampled batch every dump holds


def load_reward():
    """examples/rewards/gridworld.py's `compute_score`, loaded from its file."""
    path = ROOT / "examples" / "rewards" / "gridworld.py"
    spec = importlib.util.spec_from_file_location("gridworld", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def git_archive(repo: str | Path, rev: str, folder: str, into: Path) -> str:
    """`git archive REV FOLDER` of a repository (bare or not) extracted into `into`; the
    commit it named."""
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", f"{rev}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, folder],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def fetch_wheel(
    spec: str, into: Path, blanked: tuple[str, ...] = (), python_version: str | None = None
) -> Path:
    """`pip download SPEC --no-deps` unzipped (not installed) into `into/site`, put first on
    sys.path; `blanked`: its `__init__`s that import heavy dependencies, emptied there."""
    python = ["--python-version", python_version] if python_version else []
    subprocess.run(
        [sys.executable, "-m", "pip", "download", spec, "--no-deps", *python,
         "--only-binary=:all:", "-q", "-d", str(into / "wheel")],
        check=True,
    )  # fmt: skip
    (wheel,) = (into / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(into / "site")
    for name in blanked:
        (into / "site" / name).write_text("")
    sys.path.insert(0, str(into / "site"))
    return into / "site"


class _Meta(abc.ABCMeta):
    """Placeholder classes: any attribute is another placeholder class."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Placeholder,), {})

    def __getitem__(cls, item):
        return cls


class _Placeholder(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):  # decorators, factories
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __bool__(self):  # ray.is_initialized() -> falsy
        return False


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Placeholder,), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages):
        self.packages = set(packages)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _PlaceholderModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def stub_modules(packages: list[str]) -> None:
    """Import these packages (and their submodules) as placeholders: a trainer's module
    imports them, the code a fixture runs never uses them."""
    sys.meta_path.insert(0, _StubFinder(packages))
