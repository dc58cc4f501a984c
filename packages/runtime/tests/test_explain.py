"""`ember explain`: a debug directory's graphs as rows of kernels and ATen calls with
their FX nodes, bytes, times and roofs; debug dumps in one directory per process run,
each graph with a runnable repro script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ember.runtime import config
from ember.runtime.cli import main
from ember.runtime.explain import explain, format_explanations
from ember.runtime.profiling import write_profiles


@pytest.fixture(autouse=True)
def aten_matmuls() -> Iterator[None]:
    """Matmuls stay ATen's addmm here: under EMBER_CPU_GEMM=auto a timing chooses
    oneDNN's linear (with the GELU in its output pass) or not, per machine and load,
    and these tests check the rows of one known schedule."""
    with config.scope(cpu_gemm="aten"):
        yield


class Block(nn.Module):
    """A norm, a matmul and an activation: kernels on both sides of an ATen call."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.linear = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(self.norm(x))).sum(-1)


def _compile_and_run(tmp_path: Path, *, profile: bool, calls: int = 4) -> Path:
    debug = tmp_path / "debug"
    model, x = Block().eval(), torch.randn(16, 32)
    # matmul kernels off: the linear stays an ATen call, the extern row these tests read
    with config.scope(debug_dir=debug, profile=profile, matmul_templates="off"), torch.no_grad():
        compiled = torch.compile(model, backend="ember")
        for _ in range(calls):
            out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    write_profiles()
    return debug


def test_explain_lists_each_kernel_with_its_fx_nodes_bytes_time_and_roof(
    tmp_path: Path,
) -> None:
    debug = _compile_and_run(tmp_path, profile=True)
    (graph,) = explain(debug)
    running = [r for r in graph.rows if r.kind in ("kernel", "extern")]
    kernels = [r for r in running if r.kind == "kernel"]
    assert len(kernels) == 2 and [r.kind for r in running].count("extern") == 1
    norm, act = kernels
    assert any(n.startswith("var_mean") for n in norm.fx_nodes) and "gelu" in act.fx_nodes
    assert "gelu" in act.name and "addmm" not in norm.name + act.name
    (addmm,) = [r for r in running if r.kind == "extern"]
    assert addmm.fx_nodes[0].startswith("addmm") and addmm.flops == 2 * 16 * 32 * 64
    # the norm reads x (16x32), weight and bias (32 each), writes 16x32: float32
    assert norm.bytes == (2 * 16 * 32 + 2 * 32) * 4
    assert norm.unfused_bytes is not None and norm.unfused_bytes > norm.bytes
    for row in running:
        assert row.ms is not None and row.ms > 0
        assert row.roof is not None and row.roof > 0
        assert row.bandwidth_bytes_s == pytest.approx(row.bytes / (row.ms / 1e3))  # type: ignore[operator]
    assert graph.profiled_calls == 3  # the first call is not timed
    pairs = {(p.first, p.second): p.reason for p in graph.not_fused}
    assert pairs[(norm.name, addmm.name)].startswith(f"{addmm.name} is an ATen call")
    text = format_explanations([graph])
    assert norm.name in text and "gelu" in text and "of roof" in text


def test_without_a_profile_the_rows_have_no_times_and_the_command_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    debug = _compile_and_run(tmp_path, profile=False, calls=1)
    (graph,) = explain(debug)
    assert all(r.ms is None and r.roof is None for r in graph.rows)
    assert main(["explain", str(debug)]) == 0
    out = capsys.readouterr().out
    assert "floor MB" in out and "of roof" not in out and "gelu" in out
    assert main(["explain", str(tmp_path / "nothing")]) == 1


def test_wrapper_and_kernel_source_name_the_fx_nodes(tmp_path: Path) -> None:
    debug = _compile_and_run(tmp_path, profile=False, calls=1)
    (graph_dir,) = [p for p in debug.glob("run-*/*") if p.is_dir()]
    wrapper = (graph_dir / "wrapper.py").read_text()
    calls = [line for line in wrapper.splitlines() if line.startswith("    k")]  # launches
    assert calls and all("# from " in line for line in calls)
    assert "aten_addmm_default(" in wrapper and "# from addmm" in wrapper
    assert "// from FX nodes: " in (graph_dir / "kernels.cpp").read_text()


PROGRAM = """
import torch, ember.runtime
f = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend="ember")
f(torch.randn(8, 16))
"""


def test_each_process_dumps_into_a_run_of_its_own_and_repro_scripts_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env.update(EMBER_DEBUG_DIR=str(tmp_path / "debug"), EMBER_CACHE_DIR=str(tmp_path / "c"))
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
    runs = sorted((tmp_path / "debug").glob("run-*"))
    assert len(runs) == 2  # the second process overwrote nothing
    assert (tmp_path / "debug" / "LATEST").read_text().strip() in {r.name for r in runs}
    for run in runs:
        assert (run / "inference_0" / "schedule.txt").is_file()
    repro = runs[0] / "inference_0" / "repro.py"
    env.pop("EMBER_DEBUG_DIR")
    done = subprocess.run(
        [sys.executable, str(repro)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ember matches eager" in done.stdout
    (graph,) = explain(tmp_path / "debug")  # the root: its latest run
    assert graph.directory.parent.name == (tmp_path / "debug" / "LATEST").read_text().strip()


def test_one_command_compiles_profiles_and_explains_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = torch.get_num_threads()
    try:
        assert main(["explain", "--model", "mlp", "--calls", "3", str(tmp_path / "d")]) == 0
    finally:
        torch.set_num_threads(saved)
    out = capsys.readouterr().out
    assert "of roof" in out and "addmm" in out and "%" in out
    (graph,) = explain(tmp_path / "d")
    assert graph.profiled_calls == 3 and all(
        r.ms is not None for r in graph.rows if r.kind in ("kernel", "extern")
    )
