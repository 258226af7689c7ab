"""The GitHub Actions example runs its gate steps here, as a runner would after installing."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

WORKFLOW = ROOT / "examples" / "ci" / "collapsecheck.yml"


def gate_steps():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    for name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if "run" in step and "pip install" not in step["run"]:
                yield name, {**workflow["env"], **job.get("env", {})}, step["run"]


def test_workflow_gate_steps_pass(tmp_path):
    """Each job's checkout is the repository: here a folder that links to its examples."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    steps = list(gate_steps())
    assert [name for name, _, _ in steps] == ["gate", "catches-collapse"]
    for name, env, script in steps:
        summary = tmp_path / f"{name}.md"
        environment = {
            **os.environ,
            **env,
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "org/rl-run",
            "GITHUB_RUN_ID": "7",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        result = subprocess.run(
            ["bash", "-e", "-c", script], cwd=tmp_path, env=environment,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        assert "## collapsecheck:" in summary.read_text()
    assert (tmp_path / "collapsecheck.xml").is_file() and (tmp_path / "report.json").is_file()
    # the page the artifact step keeps, linked from the job summary to the run's artifacts
    assert '<img class="heatmap"' in (tmp_path / "collapsecheck.html").read_text()
    artifacts = "(https://github.com/org/rl-run/actions/runs/7#artifacts)"
    assert artifacts in (tmp_path / "gate.md").read_text()
