"""A wide table that fits the console it is printed on: no cell is cut short. The columns
that do not fit go to a continuation table, which repeats the row's key columns (the step);
the columns a caller ranks first (the regime) always stay in the first table. Only where one
column cannot fit beside the keys at any width does it wrap, whole, never with an ellipsis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

Cell = str | Text


@dataclass(frozen=True)
class Column:
    """One column: its title, its cells (one per row), how its cells justify; `key`: repeated
    in every table (it names the row)."""

    title: str
    cells: tuple[Cell, ...]
    justify: str = "right"
    key: bool = False

    @property
    def width(self) -> int:
        """The console columns of its widest cell or title."""
        cells = (c.cell_len if isinstance(c, Text) else cell_len(c) for c in self.cells)
        return max(cell_len(self.title), *cells)


def table_of(columns: Sequence[Column], title: str | None, caption: str | None = None) -> Table:
    """The columns as one table, in the order given, every cell on one line."""
    table = Table(
        title=title, title_justify="left", show_edge=False, caption=caption,
        caption_justify="left",
    )  # fmt: skip
    for column in columns:
        table.add_column(column.title, justify=column.justify, no_wrap=True)  # type: ignore[arg-type]
    rows = len(columns[0].cells) if columns else 0
    for index in range(rows):
        table.add_row(*(column.cells[index] for column in columns))
    return table


def natural_width(columns: Sequence[Column]) -> int:
    """The console columns the table of `columns` takes with every cell whole: each column's
    widest cell (or title) with a space either side, and a rule between columns (`table_of`'s
    layout: no outer edge)."""
    return sum(column.width for column in columns) + 3 * len(columns) - 1


def fitted_tables(
    columns: Sequence[Column], width: int, ranked: Sequence[str], title: str
) -> list[Table]:
    """The columns split into tables no wider than `width`: the key columns in each, the
    others taken in the order of `ranked` (titles; the unranked after them, as given) into the
    first table they fit, each table showing its columns in their given order. The title heads
    the first table; the others are headed "(continued)"."""
    keys = [c for c in columns if c.key]
    rank = {name: i for i, name in enumerate(ranked)}
    waiting = sorted((c for c in columns if not c.key), key=lambda c: rank.get(c.title, len(rank)))
    groups: list[list[Column]] = []
    while waiting:
        group = [waiting.pop(0)]  # the first waiting column always opens a table
        for column in list(waiting):
            if natural_width(in_order(columns, keys + group + [column])) <= width:
                group.append(column)
                waiting.remove(column)
        groups.append(group)
    tables = []
    for index, group in enumerate(groups):
        shown = in_order(columns, keys + group)
        table = table_of(shown, title if index == 0 else "(continued)")
        if natural_width(shown) > width:  # too wide even alone: wrap its cells, whole
            for column in table.columns:
                column.no_wrap, column.overflow = False, "fold"
        tables.append(table)
    return tables


def in_order(columns: Sequence[Column], chosen: Sequence[Column]) -> list[Column]:
    """`chosen` in the order the columns were given."""
    wanted = {id(c) for c in chosen}
    return [c for c in columns if id(c) in wanted]
