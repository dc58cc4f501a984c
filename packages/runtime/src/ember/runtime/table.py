"""Plain-text tables for the command line, drawn by rich (`ember demo`, `ember bench`,
`ember cache info`): numbers right-aligned, text left-aligned, no colour, nothing
wrapped or cut, so the text reads the same in a terminal, a pipe or a log file."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table


def _numeric(cell: str) -> bool:
    """A number as the tables print them: 1.5, -3, 2.00x, 1.0e-05, 12%."""
    text = cell.removesuffix("x").removesuffix("%").replace("e-", "").replace("e+", "")
    return text.replace(".", "", 1).removeprefix("-").isdigit()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a rule under the headers; a column whose
    cells are all numbers (or '-') is right-aligned."""
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    for index, header in enumerate(headers):
        cells = [row[index] for row in rows if row[index] not in ("-", "")]
        right = bool(cells) and all(_numeric(c) for c in cells)
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console(file=io.StringIO(), width=10_000, color_system=None, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    return "\n".join(line.rstrip() for line in lines if line.strip())
