"""`collapsecheck spec`."""

from __future__ import annotations

from collapsecheck.cli.app import app


@app.command()
def spec() -> None:
    """Print the measurement contract: every metric, the verdict, the dump format."""
    from importlib.resources import files

    print(files("collapsecheck").joinpath("SPEC.md").read_text(encoding="utf-8"), end="")
