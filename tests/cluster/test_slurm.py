"""The Slurm array example (examples/slurm/scan-run.sh) against a real one-node Slurm that
scripts/slurm-one-node.sh starts (munged, slurmctld, slurmd): `make test-cluster`, as root."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROMPTS, ROOT, RUN

START = ROOT / "scripts" / "slurm-one-node.sh"
SCRIPT = ROOT / "examples" / "slurm" / "scan-run.sh"
OPTIONS = "-n 4 -k 2 --max-new-tokens 32 --device cpu --fail-on none"

if shutil.which("apt-get") is None or os.geteuid() != 0:
    pytest.skip("a one-node Slurm needs root and Debian's packages", allow_module_level=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    subprocess.run([START, "start", state], check=True, timeout=600, capture_output=True)
    bin_dir = str(Path(sys.executable).parent)
    yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "SCAN_OPTIONS": OPTIONS,
           "PATH": bin_dir + os.pathsep + os.environ["PATH"]}  # fmt: skip
    subprocess.run([START, "stop", state], timeout=120)


def run_of(tmp_path, broken=False):
    run = tmp_path / "run"
    run.mkdir()
    (run / "global_step_100").symlink_to(RUN / "global_step_100")
    last = run / "global_step_500"
    if broken:
        shutil.copytree(RUN / "global_step_500", last)
        weights = next(last.glob("*.safetensors"))
        weights.write_bytes(weights.read_bytes()[:100])  # its array task fails loading it
    else:
        last.symlink_to(RUN / "global_step_500")
    return run


def array_scan(env, run, cache, cwd):
    return subprocess.run(
        [SCRIPT, "--wait", run, PROMPTS, cache, "2"], env=env, cwd=cwd,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_an_array_and_its_join_give_the_one_process_numbers(slurm, tmp_path):
    run, cache = run_of(tmp_path), tmp_path / "cache"
    result = array_scan(slurm, run, cache, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "COMPLETED" in result.stdout
    joined = json.loads((cache / "run.json").read_text())
    assert (cache / "run.png").is_file() and (cache / "gate.xml").is_file()
    one = tmp_path / "one.json"
    local = [sys.executable, "-m", "collapsecheck", "scan", run, "-p", PROMPTS, *OPTIONS.split(),
             "--out", tmp_path / "one", "--json", one]  # fmt: skip
    assert subprocess.run(local, capture_output=True, timeout=600).returncode == 0
    steps = {s["step"]: s["report"]["metrics"] for s in joined["steps"]}
    assert list(steps) == [100, 500]
    assert steps == {
        s["step"]: s["report"]["metrics"] for s in json.loads(one.read_text())["steps"]
    }
    # each array task said which share it took
    shares = sorted(p.read_text() for p in tmp_path.glob("slurm-*_*.out"))
    assert "shard 0/2 (SLURM_ARRAY_TASK_ID=0 of 2)" in shares[0]
    assert "shard 1/2 (SLURM_ARRAY_TASK_ID=1 of 2)" in shares[1]


def test_a_failed_task_cancels_the_join_and_the_script_says_so(slurm, tmp_path):
    run, cache = run_of(tmp_path, broken=True), tmp_path / "cache"
    result = array_scan(slurm, run, cache, tmp_path)
    assert result.returncode == 1
    assert "CANCELLED" in result.stdout and "the join did not complete" in result.stderr
    assert not (cache / "run.json").exists()
    # the task that succeeded kept its work: its checkpoint is in the cache
    entries = [p for p in cache.iterdir() if (p / "report.json").is_file()]
    assert len(entries) == 1
