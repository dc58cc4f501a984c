"""Ahead-of-time packages of torch.export programs (ember.runtime.aot).

Each model is exported, packaged here, and loaded in a fresh process that has no C++
compiler on its PATH, an empty ember cache and a `triton.compile` that raises; its
outputs must equal `exported_program.module()`'s, for every size in range of a
dynamic dimension, without compiling anything. Sizes out of range, altered files and
manifests, and unregistered custom operators are refused with errors that name them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from safetensors.torch import load_file, save_file
from torch import nn
from torch.export import Dim, ExportedProgram

from ember.runtime import artifact as artifact_module
from ember.runtime import config
from ember.runtime.aot import (
    PackageError,
    PackageInputError,
    compile_and_package,
    describe_package,
    load_package,
    read_package_manifest,
)
from ember.runtime.artifact import ArtifactError
from ember.runtime.cli import main
from ember.runtime.fingerprint import source_fingerprint

Case = tuple[tuple[Any, ...], dict[str, Any]]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.gelu(self.norm(self.up(x))))
        return out


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Structured(nn.Module):
    """A tuple and a dict among the inputs, a keyword argument, nested outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("offset", torch.linspace(-1, 1, 8))

    def forward(
        self,
        pair: tuple[torch.Tensor, torch.Tensor],
        extra: dict[str, torch.Tensor],
        *,
        scale: float,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        a, b = pair
        mixed = self.proj(a) * b + extra["bias"] + self.offset
        return mixed.sum(-1), (mixed * scale, {"max": mixed.amax(0), "min": extra["bias"].min()})


def _export(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, **options: Any
) -> ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(model, args, kwargs, **options)


def _eval_mode(model: nn.Module) -> nn.Module:
    model.eval()
    if isinstance(model, ConvBN):  # statistics unlike the defaults, so that they matter
        mean, var = model.bn.running_mean, model.bn.running_var
        assert mean is not None and var is not None
        with torch.no_grad():
            mean.uniform_(-0.5, 0.5)
            var.uniform_(0.5, 2.0)
    return model


def _run_fresh(
    package: Path, cases: list[Case], work: Path, setup: str = ""
) -> list[dict[str, Any]]:
    """Load `package` in a fresh process without compilers and call it on each case.

    Per case: {"outputs": [...tensors], "spec": treespec JSON} or {"error": type name,
    "message": text}. The fresh process also reports how many graphs ember compiled
    (`compiled`, on every result): none, or it was not loaded as it was saved. `setup`
    runs before a second load, where the first failed (custom operators)."""
    work.mkdir(parents=True, exist_ok=True)
    for number, (args, kwargs) in enumerate(cases):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = {str(i): x for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)}
        others = {str(i): x for i, x in enumerate(leaves) if not isinstance(x, torch.Tensor)}
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, work / f"in{number}.st")
        devices = {k: str(v.device) for k, v in tensors.items()}
        description = {"spec": pytree.treespec_dumps(spec), "others": others, "devices": devices}
        (work / f"in{number}.json").write_text(json.dumps(description))
    script = f"""
import json, sys
from pathlib import Path
import torch
import torch.utils._pytree as pytree
from safetensors.torch import load_file, save_file
try:
    import triton, triton.compiler.compiler as tc
    def refuse(*args, **kwargs):
        raise RuntimeError("a Triton compile while running a loaded package")
    tc.compile = triton.compile = refuse
except ImportError:
    pass
from ember.runtime import compiler
from ember.runtime.aot import load_package
work = Path({str(work)!r})
try:
    package = load_package({str(package)!r})
except Exception as exc:
    (work / "load-error.txt").write_text(f"{{type(exc).__name__}}: {{exc}}")
    exec({setup!r})
    package = load_package({str(package)!r})
results = []
for number in range({len(cases)}):
    description = json.loads((work / f"in{{number}}.json").read_text())
    tensors = load_file(work / f"in{{number}}.st")
    leaves = []
    for i in range(len(tensors) + len(description["others"])):
        key = str(i)
        if key in tensors:
            leaves.append(tensors[key].to(description["devices"][key]))
        else:
            leaves.append(description["others"][key])
    args, kwargs = pytree.tree_unflatten(leaves, pytree.treespec_loads(description["spec"]))
    try:
        outputs = package(*args, **kwargs)
    except Exception as exc:
        results.append({{"error": type(exc).__name__, "message": str(exc)}})
        continue
    flat, spec = pytree.tree_flatten(outputs)
    save_file(
        {{str(i): x.detach().cpu().contiguous() for i, x in enumerate(flat)
          if isinstance(x, torch.Tensor)}},
        work / f"out{{number}}.st",
    )
    results.append({{"spec": pytree.treespec_dumps(spec), "count": len(flat)}})
for result in results:
    result["compiled"] = len(compiler.compile_records)
(work / "results.json").write_text(json.dumps(results))
print("ran ok")
"""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent)  # python only: no cc, c++, gcc, clang
    env["CC"] = env["CXX"] = "/nonexistent/compiler"
    env["EMBER_CACHE_DIR"] = str(work / "empty-cache")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "ran ok" in done.stdout, done.stderr[-4000:]
    results: list[dict[str, Any]] = json.loads((work / "results.json").read_text())
    for number, result in enumerate(results):
        if "spec" in result:
            stored = load_file(work / f"out{number}.st")
            result["outputs"] = [stored[str(i)] for i in range(len(stored))]
    return results


def _assert_same(result: dict[str, Any], expected: Any) -> None:
    assert "error" not in result, result
    assert result["compiled"] == 0  # nothing compiled at load or at any call
    flat, spec = pytree.tree_flatten(expected)
    assert result["spec"] == pytree.treespec_dumps(spec)
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    assert len(result["outputs"]) == len(tensors) > 0
    for got, want in zip(result["outputs"], tensors, strict=True):
        torch.testing.assert_close(got, want.detach().cpu(), rtol=1e-4, atol=1e-4)


def _assert_refused(result: dict[str, Any], *fragments: str) -> None:
    assert result.get("error") == "PackageInputError", result
    for fragment in fragments:
        assert fragment in result["message"], (fragment, result["message"])


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ExportedProgram, Path]]:
    """The MLP exported with a dynamic batch (2..64), packaged once for this module."""
    root = tmp_path_factory.mktemp("mlp")
    with config.scope(cache_dir=root / "cache"):
        torch.manual_seed(0)
        model = MLP().eval()
        batch = Dim("batch", min=2, max=64)
        ep = _export(model, (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
        path = compile_and_package(ep, root / "mlp.ember")
    yield ep, Path(path)


def test_a_dynamic_mlp_package_runs_every_size_in_range_without_compiling(
    mlp_package: tuple[ExportedProgram, Path], tmp_path: Path
) -> None:
    ep, package = mlp_package
    manifest = read_package_manifest(package)
    (symbol,) = manifest["dynamic_dims"]
    assert manifest["dynamic_dims"][symbol] == {"min": 2, "max": 64, "from": "x.shape[0]"}
    assert manifest["inputs"][0]["shape"] == [f"sym_{symbol}", 16]
    graph = json.loads((package / "graph" / "manifest.json").read_text())
    assert graph["static_inputs"] == list(range(len(manifest["weights"])))
    assert any(path.endswith(".so") for path in graph["files"])
    files = [p.name for p in package.rglob("*") if p.is_file()]
    assert not any(name.endswith((".pkl", ".pt", ".pth", ".pyc")) for name in files)
    weights = load_file(package / "weights.safetensors")
    assert set(weights) == {
        "up.weight",
        "up.bias",
        "norm.weight",
        "norm.bias",
        "down.weight",
        "down.bias",
    }

    sizes = [4, 2, 37, 64]
    cases: list[Case] = [((torch.randn(n, 16),), {}) for n in sizes]
    cases += [((torch.randn(65, 16),), {}), ((torch.randn(1, 16),), {})]
    cases += [((torch.randn(4, 15),), {}), ((torch.randn(4, 16, dtype=torch.float64),), {})]
    results = _run_fresh(package, cases, tmp_path / "run")
    for (args, _), result in zip(cases[:4], results[:4], strict=True):
        _assert_same(result, ep.module()(*args))
    _assert_refused(results[4], "input x", "dimension 0", "size 65", "2..64")
    _assert_refused(results[5], "input x", "dimension 0", "size 1", "2..64")
    _assert_refused(results[6], "input x", "dimension 1", "size 15", "size 16")
    _assert_refused(results[7], "input x", "float64", "float32")


def test_loading_a_package_imports_no_compiler(
    mlp_package: tuple[ExportedProgram, Path], tmp_path: Path
) -> None:
    """A fresh process that imports ember.runtime.aot, loads a CPU package and calls it
    imports neither Dynamo (3 s) nor ember's backend or compiler, where ember-runtime
    is installed (its entry point registers the backend). With the packages only on
    PYTHONPATH, `import ember.runtime` registers the backend itself, which imports
    Dynamo: that is asserted instead."""
    from ember.runtime.registration import entry_point_visible

    ep, package = mlp_package
    x = torch.randn(5, 16)
    torch.save(x, tmp_path / "x.pt")
    script = f"""
import json, sys
import torch
import ember.runtime.aot
package = ember.runtime.aot.load_package({str(package)!r})
out = package(torch.load({str(tmp_path / "x.pt")!r}))
torch.save(out, {str(tmp_path / "out.pt")!r})
names = ("torch._dynamo", "ember.runtime.backend", "ember.runtime.compiler")
print(json.dumps([name for name in names if name in sys.modules]))
"""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent)  # python only: no compiler
    env["CC"] = env["CXX"] = "/nonexistent/compiler"
    env["EMBER_CACHE_DIR"] = str(tmp_path / "empty-cache")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    imported = json.loads(done.stdout.splitlines()[-1])
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), ep.module()(x))
    if entry_point_visible():
        assert imported == []
    else:
        assert "torch._dynamo" in imported


def test_a_conv_batchnorm_package_in_eval_mode_matches_the_module(tmp_path: Path) -> None:
    model = _eval_mode(ConvBN())
    ep = _export(model, (torch.randn(2, 3, 12, 12),))
    package = Path(compile_and_package(ep, tmp_path / "convbn"))
    manifest = read_package_manifest(package)
    assert manifest["mutations"] == [] and manifest["dynamic_dims"] == {}
    kinds = {w["name"]: w["kind"] for w in manifest["weights"]}
    assert kinds["bn.running_mean"] == "buffer" and kinds["conv.weight"] == "parameter"
    x = torch.randn(2, 3, 12, 12)
    (result,) = _run_fresh(package, [((x,), {})], tmp_path / "run")
    _assert_same(result, ep.module()(x))


def test_a_package_takes_and_returns_nested_structures(tmp_path: Path) -> None:
    rows = Dim("rows", min=2, max=32)
    pair = (torch.randn(5, 8), torch.randn(5, 8))
    extra = {"bias": torch.randn(5, 8)}
    ep = _export(
        Structured(),
        (pair, extra),
        {"scale": 0.5},
        dynamic_shapes=(({0: rows}, {0: rows}), {"bias": {0: rows}}, None),
    )
    package = Path(compile_and_package(ep, tmp_path / "structured"))
    manifest = read_package_manifest(package)
    names = [entry["name"] for entry in manifest["inputs"]]
    assert names == ["pair[0]", "pair[1]", "extra['bias']", "scale"]
    assert [o["name"] for o in manifest["outputs"]] == [
        "output[0]",
        "output[1][0]",
        "output[1][1]['max']",
        "output[1][1]['min']",
    ]

    def case(n: int, m: int | None = None) -> Case:
        p = (torch.randn(n, 8), torch.randn(n, 8))
        return (p, {"bias": torch.randn(m or n, 8)}), {"scale": 0.5}

    cases = [case(5), case(11), case(6, 7)]
    cases.append(((pair, extra), {"scale": 2.0}))
    results = _run_fresh(package, cases, tmp_path / "run")
    for (args, kwargs), result in zip(cases[:2], results[:2], strict=True):
        _assert_same(result, ep.module()(*args, **kwargs))
    _assert_refused(results[2], "input extra['bias']", "dimension 0", "size 7", "pair[0].shape[0]")
    _assert_refused(results[3], "input scale", "2.0", "0.5")

    loaded = load_package(package)
    with pytest.raises(PackageInputError, match=r"structure[\s\S]*differs"):
        loaded(pair, {"weights": extra["bias"]}, scale=0.5)


def test_buffers_a_training_program_mutates_are_written_back(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)).train()
    ep = _export(model, (torch.randn(8, 6),))
    package = Path(compile_and_package(ep, tmp_path / "train-bn"))
    manifest = read_package_manifest(package)
    written = {m["target"] for m in manifest["mutations"]}
    assert written == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    loaded = load_package(package)
    module = ep.module()
    for _ in range(3):
        x = torch.randn(8, 6)
        torch.testing.assert_close(loaded(x), module(x), rtol=1e-4, atol=1e-5)
    state = loaded.state_dict()
    expected = module.state_dict()
    for name in written:
        torch.testing.assert_close(state[name], expected[name], rtol=1e-4, atol=1e-6)
    assert int(state["1.num_batches_tracked"]) == 3


class Accumulates(nn.Module):
    def forward(self, total: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        total.add_(x.sum(0))
        return total * 2


def test_inputs_a_program_mutates_are_written_back(tmp_path: Path) -> None:
    ep = _export(Accumulates(), (torch.zeros(4), torch.randn(3, 4)))
    package = Path(compile_and_package(ep, tmp_path / "accumulates"))
    manifest = read_package_manifest(package)
    assert manifest["mutations"] == [{"output": 0, "kind": "input", "target": "total", "index": 0}]
    loaded = load_package(package)
    ours, theirs = torch.zeros(4), torch.zeros(4)
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(loaded(ours, x), ep.module()(theirs, x))
    torch.testing.assert_close(ours, theirs)
    assert ours.abs().sum() > 0


class Checked(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(x.shape[0] % 2 == 0)
        positive = (x[:, 0] > 0).sum().item()
        torch._check(positive >= 0)
        return x * 2, x[:positive]


def test_size_conditions_are_checked_by_the_package_and_data_checks_stay_in_the_graph(
    tmp_path: Path,
) -> None:
    ep = _export(Checked(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim.DYNAMIC(max=100)},))
    package = Path(compile_and_package(ep, tmp_path / "checked"))
    manifest = read_package_manifest(package)
    assert [c["text"] for c in manifest["conditions"]] == ["x.shape[0] % 2 == 0"]
    assert manifest["data_dependent_sizes"]  # the .item() size, checked in the graph
    wrapper = (package / "graph" / "wrapper.py").read_text()
    assert "_assert_scalar" in wrapper  # positive >= 0 stays, as the graph computes it
    loaded = load_package(package)
    for rows in (2, 6, 100):
        x = torch.randn(rows, 3)
        for got, want in zip(loaded(x), ep.module()(x), strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(
        PackageInputError, match=r"condition x\.shape\[0\] % 2 == 0 \(x\.shape\[0\] = 5\)"
    ):
        loaded(torch.randn(5, 3))
    with pytest.raises(PackageInputError, match=r"dimension 0 has size 102, outside the range"):
        loaded(torch.randn(102, 3))


@torch.library.custom_op("embertest_aot::shift", mutates_args=())
def shift(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by


@shift.register_fake
def _(x: torch.Tensor, by: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.embertest_aot.shift(self.lin(x).relu(), 0.5)
        return out


SHIFT_DEFINITION = """
import torch
@torch.library.custom_op("embertest_aot::shift", mutates_args=())
def shift(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by
"""


def test_a_package_names_the_custom_operators_it_needs(tmp_path: Path) -> None:
    ep = _export(UsesCustomOp(), (torch.randn(3, 4),))
    package = Path(compile_and_package(ep, tmp_path / "custom"))
    manifest = read_package_manifest(package)
    (profile,) = manifest["custom_ops"]["embertest_aot::shift.default"]
    assert profile["args"][0] == {
        "rank": 2,
        "dtype": "float32",
        "device": "cpu",
        "layout": "strided",
    }
    wrapper = (package / "graph" / "wrapper.py").read_text()
    assert "_assert_tensor_metadata" in wrapper  # the guard in front of the custom op
    x = torch.randn(3, 4)
    (result,) = _run_fresh(package, [((x,), {})], tmp_path / "run", setup=SHIFT_DEFINITION)
    error = (tmp_path / "run" / "load-error.txt").read_text()
    assert error.startswith("PackageError") and "embertest_aot::shift.default" in error
    _assert_same(result, ep.module()(x))


def test_an_altered_package_is_refused(
    mlp_package: tuple[ExportedProgram, Path], tmp_path: Path
) -> None:
    _, original = mlp_package
    load_package(original)  # as written, it loads

    weights = shutil.copytree(original, tmp_path / "weights")
    data = bytearray((weights / "weights.safetensors").read_bytes())
    data[-3] ^= 0xFF  # one weight's value changes
    (weights / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"weights\.safetensors: its contents do not match"):
        load_package(weights)

    edited = shutil.copytree(original, tmp_path / "manifest")
    manifest = json.loads((edited / "package.json").read_text())
    (symbol,) = manifest["dynamic_dims"]
    manifest["dynamic_dims"][symbol]["max"] = 4096  # a wider range than compiled for
    (edited / "package.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=r"package\.json: its contents do not match its digest"):
        load_package(edited)

    graph = shutil.copytree(original, tmp_path / "graph")
    inner = json.loads((graph / "graph" / "manifest.json").read_text())
    inner["static_inputs"] = []
    (graph / "graph" / "manifest.json").write_text(json.dumps(inner))
    with pytest.raises(ArtifactError, match=r"graph/manifest\.json: its contents do not match"):
        load_package(graph)

    missing = shutil.copytree(original, tmp_path / "missing")
    (missing / "package.json").unlink()
    with pytest.raises(PackageError, match=r"not an ember package: package\.json is missing"):
        load_package(missing)


def test_a_package_built_by_other_ember_source_is_refused(
    mlp_package: tuple[ExportedProgram, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, package = mlp_package
    built = read_package_manifest(package)["versions"]["ember-source"]
    assert built == source_fingerprint()  # recorded in the package's manifest
    monkeypatch.setattr(artifact_module, "source_fingerprint", lambda: "0" * 24)
    with pytest.raises(ArtifactError, match=f"other ember source \\(fingerprint {built}\\)"):
        load_package(package)
    text, problem = describe_package(package)
    assert f"ember source fingerprint: {built}" in text
    assert problem is not None and "other ember source" in problem


def test_packaging_replaces_a_package_but_nothing_else(
    mlp_package: tuple[ExportedProgram, Path], tmp_path: Path
) -> None:
    ep, _ = mlp_package
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    with pytest.raises(PackageError, match="exists and is not an ember package"):
        compile_and_package(ep, occupied)
    assert (occupied / "notes.txt").read_text() == "mine"
    first = Path(compile_and_package(ep, tmp_path / "again"))
    (first / "stale.txt").write_text("from before")
    second = Path(compile_and_package(ep, tmp_path / "again"))
    assert second == first and not (second / "stale.txt").exists()
    x = torch.randn(3, 16)
    torch.testing.assert_close(load_package(second)(x), ep.module()(x), rtol=1e-4, atol=1e-4)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_package_command_prints_the_manifest(
    mlp_package: tuple[ExportedProgram, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, package = mlp_package
    assert main(["package", str(package)]) == 0
    out = capsys.readouterr().out
    manifest = read_package_manifest(package)
    (symbol,) = manifest["dynamic_dims"]
    assert f"x: float32[{symbol}, 16] on cpu" in out
    assert f"{symbol}: 2..64 (read from x.shape[0])" in out
    assert "up.weight: parameter float32[32, 16] on cpu" in out
    assert "files: each matches its hash" in out and "fits this machine and process: yes" in out
    assert main(["package", str(package), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == manifest

    altered = shutil.copytree(package, tmp_path / "altered")
    (altered / "weights.safetensors").write_bytes(b"not weights")
    assert main(["package", str(altered)]) == 1
    assert "PROBLEM:" in capsys.readouterr().out
    assert main(["package", str(tmp_path / "nowhere")]) == 1
    assert "not an ember package" in capsys.readouterr().err


@pytest.mark.cuda
def test_a_cuda_package_runs_without_triton_compiling(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = MLP().eval().cuda()
    batch = Dim("batch", min=2, max=64)
    ep = _export(model, (torch.randn(4, 16, device="cuda"),), dynamic_shapes=({0: batch},))
    package = Path(compile_and_package(ep, tmp_path / "mlp-cuda"))
    graph = json.loads((package / "graph" / "manifest.json").read_text())
    assert next(iter(graph["requires"]["cuda"].values())).startswith("sm_")
    assert any(path.endswith(".cubin") for path in graph["files"])
    cases: list[Case] = [((torch.randn(n, 16, device="cuda"),), {}) for n in (4, 2, 37, 64)]
    cases.append(((torch.randn(65, 16, device="cuda"),), {}))
    results = _run_fresh(package, cases, tmp_path / "run")
    for (args, _), result in zip(cases[:4], results[:4], strict=True):
        _assert_same(result, ep.module()(*args))
    _assert_refused(results[4], "input x", "dimension 0", "size 65", "2..64")
