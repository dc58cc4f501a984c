"""`ember bench` end to end: one process per measurement, records, table and chart
(needs the bench group's matplotlib, which the stack session installs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ember.runtime.bench.harness import BenchRecord
from ember.runtime.bench.registry import MODELS, loss_input
from ember.runtime.bench.report import format_records, plot_speedups
from ember.runtime.cli import main

pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the bench group)")

REQUIRED_FIELDS = {
    "model", "mode", "device", "dtype", "backend", "compile_cold_s", "compile_warm_s", "ms",
    "speedup_vs_eager", "peak_mem_bytes", "max_abs_err", "kernels", "error",
}  # fmt: skip


def test_bench_command_runs_and_writes_records_and_a_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, chart = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--models", "softmax_chain", "--modes", "train", "--backends", "eager,ember"]
    argv += ["--runs", "2", "--json", str(out), "--plot", str(chart)]
    assert main(argv) == 0
    document = json.loads(out.read_text())
    records = document["records"]
    versions = document["environment"]["versions"]
    assert versions["torch"] == torch.__version__ and versions["ember-runtime"]
    assert document["environment"]["device_name"] and document["environment"]["cpu"]
    assert [r["backend"] for r in records] == ["eager", "ember"]
    assert set(records[0]) >= REQUIRED_FIELDS
    ember = records[1]
    assert ember["error"] is None, ember["error"]
    assert ember["matches_eager"] is True and ember["max_abs_err"] < 1e-4
    assert ember["compile_cold_s"] > 0 and ember["compile_warm_s"] > 0 and ember["ms"] > 0
    assert ember["kernels"] > 0 and ember["speedup_vs_eager"] > 0
    # CPU peak memory is tensor allocations during one call: a training step of this
    # block allocates activations and gradients, far less than a process's resident set
    assert 0 < records[0]["peak_mem_bytes"] < 64 * 2**20
    table = capsys.readouterr().out
    assert "softmax_chain  train" in table and "speedup" in table
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_report_marks_failures_and_formats_speedups(tmp_path: Path) -> None:
    rows = [
        BenchRecord("m", "inference", "cpu", "float32", "eager", ms=2.0, speedup_vs_eager=1.0),
        BenchRecord("m", "inference", "cpu", "float32", "ember", ms=1.0, speedup_vs_eager=2.0),
        BenchRecord("m", "inference", "cpu", "float32", "inductor", error="cold: boom"),
    ]
    text = format_records(rows)
    assert "2.00x" in text and "cold: boom" in text
    assert plot_speedups(rows, tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.parametrize("name", [n for n, s in MODELS.items() if s.requires is not None])
def test_every_real_model_builds_from_code_and_runs_at_cpu_size(name: str) -> None:
    spec = MODELS[name]
    pytest.importorskip(spec.requires or "", reason=f"{name} needs {spec.requires}")
    model, inputs = spec.build("cpu")
    with torch.no_grad():
        out = loss_input(model.eval()(*inputs))
    assert out.shape[0] == inputs[0].shape[0] and bool(out.isfinite().all())
