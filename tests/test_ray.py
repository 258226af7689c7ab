"""--ray: each uncached checkpoint of a run as one task on a real Ray cluster, started here
with `ray start` as a cluster's head node is; the numbers are those of a one-process scan and
of a sharded one."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, PROMPTS, ROOT, RUN
from tests.tolerances import assert_same_numbers

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
RAY = Path(sys.executable).parent / "ray"
FAST = ["-p", str(PROMPTS), "-n", "4", "-k", "2", "--max-new-tokens", "32", "--device", "cpu",
        "--fail-on", "none"]  # fmt: skip
# a Ray worker runs one BLAS thread, the driver's process two: the same traces' float32 sums in
# another order (tests/tolerances.py); the longest trace here is the played scan's 48 tokens
LONGEST = 48


# Ray turns token authentication on for a cluster when ~/.ray/auth_token exists (left by any
# earlier local ray.init()), and a driver then fails to join unless it is configured alike:
# the test's cluster and drivers run without it, whatever this machine's home holds
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collapsecheck(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "collapsecheck", "scan", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=ENV,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    """A one-node Ray cluster, as `ray start --head` makes one."""
    port = free_port()
    start = [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    subprocess.run(start, check=True, capture_output=True, timeout=180, env=ENV)
    yield f"127.0.0.1:{port}"
    subprocess.run([str(RAY), "stop", "--force"], capture_output=True, timeout=120, env=ENV)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two checkpoints of the demo run: a grounded one and a collapsed one."""
    run = tmp_path_factory.mktemp("run")
    for step in ("global_step_100", "global_step_500"):
        (run / step).symlink_to(RUN / step)
    return run


def joined(cluster: str, stderr: str) -> bool:
    """The driver named the cluster (by the node's address, with the head's port)."""
    port = cluster.rpartition(":")[2]
    return any(
        line.startswith("Ray: joined the cluster at ") and f":{port} (2 CPUs, 0 GPUs)" in line
        for line in stderr.splitlines()
    )


def step_metrics(report_json: Path) -> dict:
    report = json.loads(report_json.read_text())
    return {s["step"]: s["report"]["metrics"] for s in report["steps"]}


def test_ray_sharded_and_one_process_scans_give_identical_numbers(cluster, run_dir, tmp_path):
    single = collapsecheck(
        run_dir, *FAST, "--out", tmp_path / "one", "--json", tmp_path / "one.json"
    )
    assert single.returncode == 0, single.stderr
    on_ray = collapsecheck(run_dir, *FAST, "--out", tmp_path / "ray", "--json",
                           tmp_path / "ray.json", "--ray", cluster)  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    assert joined(cluster, on_ray.stderr)
    assert "Ray: 2 checkpoint(s) scanned on" in on_ray.stderr
    assert "2 of 2 checkpoints answered from the cache" in on_ray.stdout
    for index in (0, 1):
        shard = collapsecheck(run_dir, *FAST, "--out", tmp_path / "shards", "--shard", f"{index}/2")
        assert shard.returncode == 0, shard.stderr
    join = collapsecheck(
        run_dir, *FAST, "--out", tmp_path / "shards", "--json", tmp_path / "j.json"
    )
    assert join.returncode == 0 and "2 of 2 checkpoints answered from the cache" in join.stdout
    one = step_metrics(tmp_path / "one.json")
    assert one.keys() == {100, 500}
    assert step_metrics(tmp_path / "j.json") == one  # the same process's arithmetic: exact
    assert_same_numbers(step_metrics(tmp_path / "ray.json"), one, LONGEST)


def test_a_runs_own_rollouts_on_ray_give_the_one_process_numbers(cluster, tmp_path):
    """The trainer's rollouts take the same route: one Ray task per checkpoint (its rollout
    steps read on the node), joined from the results cache."""
    trl_run = ROOT / "tests" / "fixtures" / "trl-grpo-completions"
    common = [trl_run, "--baseline", EXAMPLES / "demo-run" / "global_step_200", "--device",
              "cpu", "--bootstrap", "200", "--fail-on", "none"]  # fmt: skip
    one = one_process_and_ray(common, cluster, tmp_path, tasks=3)
    assert one.keys() == {2, 4, 6}


def one_process_and_ray(common: list, cluster: str, tmp_path: Path, tasks: int) -> dict:
    """The same scan in this process and on Ray (`tasks` checkpoints, one task each): each
    step's metrics, the same from both."""
    single = collapsecheck(*common, "--out", tmp_path / "one", "--json", tmp_path / "one.json")
    assert single.returncode == 0, single.stderr
    on_ray = collapsecheck(*common, "--out", tmp_path / "ray", "--json", tmp_path / "ray.json",
                           "--ray", cluster)  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    assert f"Ray: {tasks} checkpoint(s) scanned on" in on_ray.stderr
    one = step_metrics(tmp_path / "one.json")
    assert_same_numbers(step_metrics(tmp_path / "ray.json"), one, LONGEST)
    return one


def test_a_bare_ray_joins_the_cluster_running_here(cluster, run_dir, tmp_path):
    """As ray.init() does: the cluster `ray start` left on this machine; cached steps are
    not sent to it again."""
    result = collapsecheck(run_dir, *FAST, "--out", tmp_path, "--ray")
    assert result.returncode == 0, result.stderr
    assert joined(cluster, result.stderr)
    again = collapsecheck(run_dir, *FAST, "--out", tmp_path, "--ray")
    assert "Ray: 0 checkpoint(s) scanned" in again.stderr


def test_a_failed_task_is_named_and_the_others_are_kept(cluster, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "global_step_100").symlink_to(RUN / "global_step_100")
    broken = run / "global_step_200"
    shutil.copytree(RUN / "global_step_200", broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: the task fails loading it
    result = collapsecheck(run, *FAST, "--out", tmp_path / "out", "--ray", cluster)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: 1 of 2 Ray tasks failed (the others are in the results")
    assert "200:" in lines[-1]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray", "127.0.0.1:1"], "error: --ray 127.0.0.1:1: nothing answers at 127.0.0.1:1"),
        (["--ray", "ray://127.0.0.1:1"], "error: --ray ray://127.0.0.1:1: nothing answers at"),
        (["--ray", "127.0.0.1:6379", "--shard", "0/2"], "error: --ray and --shard"),
    ],
)
def test_bad_ray_use_is_one_line_and_exit_2(run_dir, tmp_path, args, message):
    result = collapsecheck(run_dir, *FAST, "--out", tmp_path, *args, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr


def test_ray_takes_a_run_not_one_checkpoint(tmp_path):
    result = collapsecheck(RUN / "global_step_100", *FAST, "--ray", "local")
    assert result.returncode == 2
    assert "--ray spreads a run directory" in result.stderr


def test_a_played_run_on_ray_gives_the_one_process_numbers(cluster, tmp_path):
    """`scan RUN --env` (SPEC "Agents across turns") takes the same route: each checkpoint
    played in its own task, the environment loaded again there from its SPEC."""
    run = tmp_path / "run"
    for step, agent in ((100, "walker"), (200, "undoer")):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        for file in (EXAMPLES / "agents" / agent).iterdir():
            (run / f"checkpoint-{step}" / file.name).symlink_to(file)
    common = [run, "--env", f"{EXAMPLES / 'environments' / 'gridworld.py'}:make",
              "--context-window", "1", "--max-turns", "4", "-n", "4", "-k", "2",
              "--max-new-tokens", "48", "--device", "cpu", "--bootstrap", "200",
              "--fail-on", "none"]  # fmt: skip
    one = one_process_and_ray(common, cluster, tmp_path, tasks=2)
    assert "revisit_rate" in one[200]
