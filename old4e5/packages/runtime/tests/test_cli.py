from __future__ import annotations

import pytest

from ember.runtime.cli import main
from ember.runtime.table import format_table


def test_demo_prints_a_table_that_matches_eager(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["model", "mode", "compile"]
    rows = [line for line in lines if line.startswith(("transformer_block", "mlp"))]
    assert len(rows) == 4 and all(row.rstrip().endswith("yes") for row in rows)
    assert "generated code:" in out


def test_config_command_lists_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for name in (
        "EMBER_FALLBACK",
        "EMBER_STRICT",
        "EMBER_DEBUG_DIR",
        "EMBER_CACHE_DIR",
        "EMBER_LOGS",
    ):
        assert name in out


def test_table_aligns_columns() -> None:
    text = format_table(["a", "bb"], [["x", "1.5"], ["yyy", "10.25"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines[1:]}) == 1
    assert lines[2].endswith(" 1.5")
