"""Plain-text tables for the command line (no dependency for a few columns)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def numeric(cell: str) -> bool:
        return (
            cell.replace(".", "", 1).replace("x", "").replace("e-", "").replace("-", "").isdigit()
        )

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if numeric(c) else c.ljust(w) for c, w in zip(cells, widths, strict=True)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
