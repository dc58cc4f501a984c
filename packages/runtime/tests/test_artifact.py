"""Compiled artifacts: a graph compiled here, saved, and loaded in a fresh process
that has no C++ compiler on its PATH and whose Triton compile raises, gives the same
values; an altered file or a manifest that does not fit this process is refused with
an error naming the file or both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.runtime.artifact import ArtifactError, load_artifact
from ember.runtime.compiler import CompileRecord
from ember.runtime.testing import no_eager_fallback


def _model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).softmax(-1) * 2 + x.sum()


def _compile(device: str, dynamic: bool) -> tuple[CompileRecord, list[torch.Tensor]]:
    torch._dynamo.reset()
    x, w = torch.randn(8, 16, device=device), torch.randn(16, 16, device=device)
    with no_eager_fallback() as graphs:
        compiled = torch.compile(_model, backend="ember", dynamic=dynamic)
        torch.testing.assert_close(compiled(x, w), _model(x, w), rtol=1e-4, atol=1e-4)
    (record,) = graphs
    return record, [x, w]


def _run_loaded(directory: Path, device: str, dynamic: bool) -> list[str]:
    """Load `directory` in a fresh process without compilers and check its values."""
    script = f"""
import sys, torch
import triton, triton.compiler.compiler as tc
def refuse(*args, **kwargs):
    raise RuntimeError("a Triton compile while running a loaded artifact")
tc.compile = triton.compile = refuse
from ember.runtime.artifact import load_artifact
artifact, call = load_artifact({str(directory)!r})
def model(x, w):
    return torch.nn.functional.gelu(x @ w).softmax(-1) * 2 + x.sum()
for rows in ({(8, 5) if dynamic else (8,)}):
    x, w = torch.randn(rows, 16, device={device!r}), torch.randn(16, 16, device={device!r})
    tensor_records = [r for r in artifact.inputs if r.kind == "tensor"]
    by_record = dict(zip([r.index for r in tensor_records], [x, w]))
    def size_of(name):  # a size input's value: the tensor dimension that is that symbol
        for r in tensor_records:
            if name in r.size:
                return by_record[r.index].shape[r.size.index(name)]
        raise AssertionError(name)
    args = [
        size_of(r.binds[0][0]) if r.kind == "size" else by_record[r.index]
        for r in artifact.inputs
    ]
    for _ in range(3):
        (out,) = call(list(args))
        torch.testing.assert_close(out, model(x, w), rtol=1e-4, atol=1e-4)
print("loaded ok", type(call).__name__, getattr(call, "replays", None))
"""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent)  # python only: no cc, c++, gcc, clang
    env["CC"] = env["CXX"] = "/nonexistent/compiler"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "loaded ok" in done.stdout, done.stderr[-4000:]
    return done.stdout.split("loaded ok", 1)[1].split()


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_saved_cpu_artifact_runs_in_a_process_without_compilers(
    tmp_path: Path, dynamic: bool
) -> None:
    record, _ = _compile("cpu", dynamic)
    assert record.artifact is not None and record.fused_kernels > 0
    directory = record.artifact.save(tmp_path / "graph")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["versions"]["torch"] == torch.__version__
    assert manifest["requires"]["cpu"]["machine"]
    assert any(path.endswith(".so") for path in manifest["files"])
    assert not any(path.endswith((".pkl", ".pt", ".pyc")) for path in manifest["files"])
    assert "cudagraphs" not in manifest  # no CUDA tensors
    _run_loaded(directory, "cpu", dynamic)


def test_a_loaded_artifact_runs_its_checked_wrapper_from_the_private_directory(
    tmp_path: Path,
) -> None:
    """A load writes its copies (wrapper, libraries) into this process's own
    directory, removed at exit: each load left a /tmp/ember-artifact-* directory
    behind. The wrapper that runs is the manifest's, byte for byte."""
    from ember.runtime.store import private_directory

    record, inputs = _compile("cpu", False)
    assert record.artifact is not None
    directory = record.artifact.save(tmp_path / "graph")
    artifact, call = load_artifact(directory)
    assert artifact.source_path is not None
    assert artifact.source_path.is_relative_to(private_directory())
    assert artifact.source_path.read_bytes() == (directory / "wrapper.py").read_bytes()
    assert list(artifact.source_path.parent.glob("*.so"))
    (out,) = call(list(inputs))
    torch.testing.assert_close(out, _model(*inputs), rtol=1e-4, atol=1e-4)


def test_an_altered_file_is_refused(tmp_path: Path) -> None:
    record, _ = _compile("cpu", False)
    assert record.artifact is not None
    directory = record.artifact.save(tmp_path / "graph")
    library = next((directory / "kernels").glob("*.so"))
    library.write_bytes(library.read_bytes()[:-100])  # truncated
    with pytest.raises(ArtifactError, match="do not match the manifest's hash"):
        load_artifact(directory)
    library.unlink()
    with pytest.raises(ArtifactError, match="cannot be read"):
        load_artifact(directory)


def test_a_manifest_from_another_torch_is_refused(tmp_path: Path) -> None:
    record, _ = _compile("cpu", False)
    assert record.artifact is not None
    directory = record.artifact.save(tmp_path / "graph")
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["versions"]["torch"] = "1.0.0"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"torch 1\.0\.0; this process has torch "):
        load_artifact(directory)
    manifest["versions"]["torch"] = torch.__version__
    manifest["requires"]["cpu"]["features"].append("avx9000")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="avx9000"):
        load_artifact(directory)
    with pytest.raises(ArtifactError, match=r"manifest\.json is missing"):
        load_artifact(tmp_path)


@pytest.mark.cuda
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_saved_cuda_artifact_runs_without_triton_compiling(tmp_path: Path, dynamic: bool) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    record, _ = _compile("cuda", dynamic)
    assert record.artifact is not None and record.fused_kernels > 0
    directory = record.artifact.save(tmp_path / "graph")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert next(iter(manifest["requires"]["cuda"].values())).startswith("sm_")
    assert any(path.endswith(".cubin") for path in manifest["files"])
    assert manifest["cudagraphs"]["blocker"] is None
    kind, replays = _run_loaded(directory, "cuda", dynamic)
    # the loaded graph replays CUDA graphs as a compiled one does (each size: a plain
    # call, then a recording and replays)
    assert kind == "GraphedCall" and int(replays) >= (2 if dynamic else 1)


def test_records_do_not_keep_a_dropped_graph_loaded() -> None:
    """The compile records (kept for reports) hold their artifact weakly: once Dynamo
    drops the compiled graph, its kernels and constants are freed."""
    import gc
    import weakref

    record, _ = _compile("cpu", False)
    artifact = record.artifact
    assert artifact is not None
    launchers = [weakref.ref(launcher) for launcher in artifact.launchers.values()]
    assert launchers
    del artifact
    torch._dynamo.reset()
    gc.collect()
    assert record.artifact is None
    assert all(ref() is None for ref in launchers)
