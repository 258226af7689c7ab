"""The console's run table fits the terminal it is printed on: no cell cut short, the columns
that do not fit continued in a second table, the regime always in the first. Checked on the
README's own GRPO run, answered from a copy of the results this repository ships."""

import io
import os
import shutil
import subprocess
import sys

import pytest
from rich.console import Console
from rich.measure import Measurement
from rich.text import Text

from collapsecheck.reports.fitted_table import Column, fitted_tables, natural_width, table_of
from tests.conftest import EXAMPLES, PROMPTS

README_RUN = [
    "scan", EXAMPLES / "grpo-run", "-p", PROMPTS, "-n", "16", "-k", "8", "--max-new-tokens",
    "64", "--baseline", EXAMPLES / "demo-run" / "global_step_200", "--reward-fn",
    EXAMPLES / "rewards" / "gridworld.py",
]  # fmt: skip
TITLES = (
    "norm. MI", "skill", "H(Z|X)/tok", "z EMA", "norm. MI 95%", "reward (log)", "entropy (log)",
    "0-var", "RV~MI", "regime", "flow", "onset",
)  # fmt: skip
# the regimes of the shipped scans, each of which must be printed whole
REGIMES = ("low_entropy_collapse (kind uncertain)", "template_collapse (partial)")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    copy = tmp_path_factory.mktemp("scans") / "grpo-run-scans"
    shutil.copytree(EXAMPLES / "grpo-run-scans", copy)
    return copy


def table_lines(output: str) -> list[str]:
    """The lines of the run's tables: from its title to the legend under them."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("collapsecheck: "))
    end = next(i for i, line in enumerate(lines) if line.startswith("norm. MI: normalized_mi"))
    return lines[start:end]


@pytest.mark.parametrize("width", [120, 180])
def test_the_readme_runs_table_fits_its_terminal_whole(shipped, width):
    # its own process: the console takes COLUMNS (a terminal's width) when it starts
    result = subprocess.run(
        [sys.executable, "-m", "collapsecheck", *map(str, [*README_RUN, "--out", shipped])],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": str(width)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # the gate fails on the collapsed last step
    lines = table_lines(result.stdout)
    assert "…" not in "\n".join(lines)
    assert max(len(line.rstrip()) for line in lines) <= width
    headers = [line for line in lines if line.startswith(" step ┃")]
    assert len(headers) == 2  # the rest continued in a second table, "step" repeated
    assert "regime" in headers[0]
    for title in TITLES:  # every column shown, once
        assert sum(f" {title} " in header for header in headers) == 1, title
    for regime in REGIMES:
        assert regime in result.stdout
    assert "(continued)" in [line.strip() for line in lines]


def test_natural_width_is_what_rich_lays_out():
    cells = ("0*", "200*")
    columns = [
        Column("step", cells, "left", key=True),
        Column("regime", (Text("low_entropy_collapse (kind uncertain)"), Text("x")), "left"),
        Column("interval", ("[0.1, 0.2]", "")),
        Column("wide 漢字", ("漢字漢字", "")),
    ]
    console = Console(width=10_000, file=io.StringIO())
    for count in range(1, len(columns) + 1):
        chosen = columns[:count]
        laid_out = Measurement.get(console, console.options, table_of(chosen, None)).maximum
        assert natural_width(chosen) == laid_out


def test_ranked_columns_stay_first_and_a_column_too_wide_wraps_whole():
    key = Column("step", ("1", "2"), "left", key=True)
    regime = Column("regime", ("template_collapse (partial)", "grounded"), "left")
    numbers = [Column(f"m{i}", ("0.123", "0.456")) for i in range(6)]
    columns = [key, *numbers, regime]
    tables = fitted_tables(columns, 50, ("regime",), "run")
    assert [c.header for c in tables[0].columns][:2] == ["step", "m0"]
    assert "regime" in [c.header for c in tables[0].columns]
    shown = [c.header for t in tables for c in t.columns if c.header != "step"]
    assert sorted(shown) == sorted(c.title for c in [*numbers, regime])
    for table in tables:
        console = Console(width=50, file=io.StringIO())
        console.print(table)
        assert max(len(line) for line in console.file.getvalue().splitlines()) <= 50
    # narrower than the step and the regime together: the regime wraps, never cut
    console = Console(width=24, file=io.StringIO())
    for table in fitted_tables(columns, 24, ("regime",), "run"):
        console.print(table)
    printed = console.file.getvalue()
    assert "…" not in printed
    assert max(len(line) for line in printed.splitlines()) <= 24
    letters = "".join(ch for ch in printed if not ch.isspace() and ch not in "│┃━╇")
    assert "template_collapse(partial)" in letters
