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


def test_config_command_marks_bad_values_instead_of_raising(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_CHECK", "sometimes")
    monkeypatch.setenv("EMBER_KERNELS", "bogus")
    monkeypatch.setenv("EMBER_FALBACK", "0")
    assert main(["config"]) == 1
    lines = capsys.readouterr().out.splitlines()
    check = next(i for i, line in enumerate(lines) if line.startswith("EMBER_CHECK "))
    assert "INVALID 'sometimes'" in lines[check]
    assert "EMBER_CHECK='sometimes' is not valid: expected 'warn'" in lines[check + 1]
    assert any(line.startswith("EMBER_KERNELS ") and "INVALID 'bogus'" in line for line in lines)
    assert any(line.startswith("EMBER_STRICT ") for line in lines)  # the others still shown
    assert any("EMBER_FALBACK" in line and "EMBER_FALLBACK?" in line for line in lines)


def test_table_aligns_columns() -> None:
    text = format_table(["a", "bb"], [["x", "1.5"], ["yyy", "10.25"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines[1:]}) == 1
    assert lines[2].endswith(" 1.5")
