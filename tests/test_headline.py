"""The README's headline command, run as written: from the results the repository ships for
it (examples/grpo-run-scans), it answers without scanning, with the findings it shows."""

import re
import shutil

from typer.testing import CliRunner

from collapsecheck.cli import app
from tests.conftest import EXAMPLES, ROOT

SHIPPED = EXAMPLES / "grpo-run-scans"


def headline_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(collapsecheck scan examples/grpo-run .*?)```", readme, re.S)
    assert block, "the README's headline command is gone"
    return block.group(1).replace("\\\n", " ").split()[1:]


def test_the_headline_command_answers_from_the_shipped_results(tmp_path, monkeypatch):
    args = headline_command()
    assert args[args.index("--out") + 1] == "examples/grpo-run-scans"
    # the examples as they are, but the shipped results copied: a miss must not write there
    (tmp_path / "examples").mkdir()
    for child in EXAMPLES.iterdir():
        if child != SHIPPED:
            (tmp_path / "examples" / child.name).symlink_to(child)
    shutil.copytree(SHIPPED, tmp_path / "examples" / SHIPPED.name)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    words = " ".join(result.output.split())
    # the gate fails on the run's last checkpoint, a collapse, as the README says
    assert result.exit_code == 1, result.output
    assert "gate failed (rule: regime)" in words
    assert "11 of 11 checkpoints answered from the cache" in words
    for finding in ("entropy_blind", "reward_without_input", "zero_variance_rising"):
        assert f"finding ({finding})" in words
    assert (tmp_path / "run.png").stat().st_size > 10_000
    page = (tmp_path / "run.html").read_text()
    assert page.count('<figure class="') >= 11 and "<svg" in page  # a heatmap per step, the plot
    assert sorted(p.name for p in (tmp_path / "examples" / SHIPPED.name).iterdir()) == sorted(
        p.name for p in SHIPPED.iterdir()
    ), "a step was scanned again: regenerate the shipped results (make grpo-run-scans)"
    assert "sampling" not in result.output
