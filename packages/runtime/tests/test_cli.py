from __future__ import annotations

import json
from pathlib import Path

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


def test_version_names_every_ember_package_torch_and_triton(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    for layer in ("graphpasses", "ir", "scheduler", "codegen-triton", "codegen-cpp", "runtime"):
        assert lines[f"ember-{layer}"].strip() == "0.2.0"
    assert lines["torch"].strip() == torch.__version__
    assert "triton" in lines


def test_bench_exits_nonzero_when_a_measurement_did_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "records.json"
    argv = ["bench", "--models", "mlp", "--modes", "inference", "--backends", "eager,ember"]
    assert main([*argv, "--time-limit", "0", "--json", str(out)]) == 1
    assert "mlp inference ember: not run" in capsys.readouterr().err
    document = json.loads(out.read_text())
    assert [r["error"] for r in document["records"]] == ["not run: --time-limit reached"] * 2
    about = document["environment"]
    assert about["device"] == "cpu" and about["cpu"] and about["options"]["models"] == ["mlp"]
    assert set(about["versions"]) >= {"torch", "triton", "ember-runtime", "ember-ir"}


def test_unmeasured_counts_failures_skips_and_mismatches() -> None:
    from ember.runtime.bench.harness import BenchRecord, unmeasured

    good = BenchRecord("m", "inference", "cpu", "float32", "ember", ms=1.0, matches_eager=True)
    wrong = BenchRecord("m", "train", "cpu", "float32", "ember", ms=1.0, matches_eager=False)
    failed = BenchRecord("m", "train", "cpu", "float32", "eager", error="cold: boom")
    silent = BenchRecord("n", "train", "cpu", "float32", "eager")  # no time, no error
    assert unmeasured([good, wrong, failed, silent]) == [wrong, failed, silent]
