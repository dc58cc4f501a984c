"""The persistent compile cache: a second process loads a compiled graph's artifact
instead of compiling it (no lowering, no C++ compiler needed), with the same values;
the key changes with what the compile depends on; an altered entry is rebuilt, never
loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.runtime import artifact as artifact_module
from ember.runtime import compile_cache
from ember.runtime.config import config
from ember.runtime.testing import no_eager_fallback

_PROCESS = """
import json, sys, torch
from ember.runtime import compile_cache
from ember.runtime.compiler import compile_records
torch.manual_seed(0)
def model(x, w):
    return torch.nn.functional.gelu(x @ w).softmax(-1) + x.sum(1, keepdim=True)
compiled = torch.compile(model, backend="ember", dynamic={dynamic})
out = []
for rows in {rows}:
    x, w = torch.randn(rows, 16), torch.randn(16, 16)
    torch.testing.assert_close(compiled(x, w), model(x, w), rtol=1e-4, atol=1e-4)
(record,) = [r for r in compile_records]
print(json.dumps({{"stats": compile_cache.stats, "stages": sorted(record.stage_seconds),
                  "eager": record.ran_eagerly, "kernels": record.fused_kernels}}))
"""


def _process(cache: Path, *, dynamic: bool, rows: tuple[int, ...]) -> dict:
    """Compile and run the model in a fresh process sharing the cache `cache`. (The
    key holds the C++ compiler's version and resolved target, so a hit needs the
    same compiler on PATH; that it did not compile shows in the stages run.)"""
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache), "EMBER_STRICT": "1"}
    script = _PROCESS.format(dynamic=dynamic, rows=rows)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result: dict = json.loads(lines[-1])
    return result


def test_a_second_process_loads_the_graph_instead_of_compiling(tmp_path: Path) -> None:
    first = _process(tmp_path, dynamic=False, rows=(8,))
    assert first["stats"] == {"hits": 0, "misses": 1, "stored": 1}
    assert "lowering" in first["stages"] and first["kernels"] > 0
    second = _process(tmp_path, dynamic=False, rows=(8,))
    assert second["stats"] == {"hits": 1, "misses": 0, "stored": 0}
    assert second["stages"] == ["cache"] and second["eager"] is None
    assert second["kernels"] == first["kernels"]


def test_a_dynamic_graph_from_the_cache_takes_other_sizes(tmp_path: Path) -> None:
    _process(tmp_path, dynamic=True, rows=(8,))
    second = _process(tmp_path, dynamic=True, rows=(8, 5, 33))
    assert second["stats"]["hits"] == 1 and second["stages"] == ["cache"]


def test_an_altered_entry_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    _process(tmp_path, dynamic=False, rows=(8,))
    (entry,) = [p for p in (tmp_path / "graphs").iterdir() if not p.name.startswith(".")]
    wrapper = entry / "wrapper.py"
    wrapper.write_text(wrapper.read_text().replace("return (", "return (None, "))
    again = _process(tmp_path, dynamic=False, rows=(8,))
    assert again["stats"]["hits"] == 0 and again["stats"]["stored"] == 1
    assert "lowering" in again["stages"]


def test_the_key_follows_what_the_compile_depends_on() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).relu()

    keys: list[str] = []

    def key_of(fn, *inputs: torch.Tensor, **settings: object) -> str:  # type: ignore[no-untyped-def]
        torch._dynamo.reset()
        seen: list[str] = []
        original = compile_cache.graph_key

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(original(*args, **kwargs))
            return seen[-1]

        compile_cache.graph_key = spy  # type: ignore[assignment]
        try:
            with config.scope(compile_cache=True, **settings), no_eager_fallback():
                torch.compile(fn, backend="ember")(*inputs)
        finally:
            compile_cache.graph_key = original  # type: ignore[assignment]
        (key,) = seen
        keys.append(key)
        return key

    x = torch.randn(4, 8)
    base = key_of(model, x)
    assert key_of(model, x.clone()) == base  # same graph, same metadata
    assert key_of(model, x.double()) != base
    assert key_of(model, torch.randn(4, 9)) != base
    assert key_of(model, x, recompute="all") != base
    assert key_of(lambda x: (x * 3).relu(), x) != base


def test_the_key_follows_ember_source_and_an_entry_of_other_source_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A development install edits ember's code under one version number: the key holds
    the source's fingerprint, so the edited code compiles the graph anew."""

    def model(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sigmoid() + 1

    x = torch.randn(4, 8)
    keys: list[str] = []
    original = compile_cache.graph_key

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        keys.append(original(*args, **kwargs))
        return keys[-1]

    monkeypatch.setattr(compile_cache, "graph_key", spy)

    def compile_once() -> dict[str, int]:
        torch._dynamo.reset()
        before = dict(compile_cache.stats)
        with config.scope(compile_cache=True), no_eager_fallback():
            out = torch.compile(model, backend="ember")(x)
        torch.testing.assert_close(out, model(x))
        return {k: compile_cache.stats[k] - before[k] for k in before}

    assert compile_once() == {"hits": 0, "misses": 1, "stored": 1}
    assert compile_once() == {"hits": 1, "misses": 0, "stored": 0}  # the same source: reused
    monkeypatch.setattr(artifact_module, "source_fingerprint", lambda: "edited" * 4)
    assert compile_once() == {"hits": 0, "misses": 1, "stored": 1}  # other source: compiled
    assert keys[0] == keys[1] != keys[2]
    assert compile_once() == {"hits": 1, "misses": 0, "stored": 0}  # its own entry


def test_the_key_reads_a_lazy_graph_without_compiling_it() -> None:
    """A lazy graph module's code is generated for the key, not compiled: its text is
    what `gm.code` gives, and the module stays to be compiled at its first use."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    traced = torch.fx.symbolic_trace(lambda x: (x * 2).relu() + 1)
    lazy = _LazyGraphModule(traced, traced.graph)
    assert lazy._needs_recompile()
    text = compile_cache._graph_code(lazy)
    assert lazy._needs_recompile()  # not compiled by the key
    assert text == lazy.code  # the text `gm.code` compiles
    x = torch.randn(3)
    torch.testing.assert_close(lazy(x), (x * 2).relu() + 1)


_TRAIN = """
import json, sys, torch
from ember.runtime import compile_cache
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
    torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4), torch.nn.LayerNorm(4),
).train()
x = torch.randn(4, 3, 6, 6)
compiled = torch.compile(model, backend="ember")
loss = compiled(x).square().mean()
loss.backward()
torch.save({"loss": loss.detach(), "grads": {n: p.grad for n, p in model.named_parameters()},
            "buffers": dict(model.named_buffers())}, sys.argv[1])
print(json.dumps(compile_cache.stats))
"""


def test_a_training_step_from_the_cache_gives_the_cold_values_and_gradients(
    tmp_path: Path,
) -> None:
    """A warm process runs the artifacts the cold one stored: the loss, every
    parameter's gradient and batch norm's running statistics are the cold compile's,
    bit for bit, and eager's within float tolerance."""
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path / "cache"), "EMBER_STRICT": "1"}
    results, stats = [], []
    for run in ("cold", "warm"):
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, str(tmp_path / f"{run}.pt")],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0 and lines, done.stderr[-4000:]
        stats.append(json.loads(lines[-1]))
        results.append(torch.load(tmp_path / f"{run}.pt"))
    assert stats[0] == {"hits": 0, "misses": 2, "stored": 2}  # forward and backward
    assert stats[1] == {"hits": 2, "misses": 0, "stored": 0}
    cold, warm = results
    assert torch.equal(cold["loss"], warm["loss"])
    assert cold["grads"].keys() == warm["grads"].keys() and len(cold["grads"]) == 8
    for name, grad in cold["grads"].items():
        assert torch.equal(grad, warm["grads"][name]), name
    for name, buffer in cold["buffers"].items():
        assert torch.equal(buffer, warm["buffers"][name]), name

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4), torch.nn.LayerNorm(4),
    ).train()  # fmt: skip
    x = torch.randn(4, 3, 6, 6)
    loss = model(x).square().mean()
    loss.backward()
    torch.testing.assert_close(warm["loss"], loss.detach(), rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(warm["grads"][name], p.grad, rtol=1e-3, atol=1e-5)
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(warm["buffers"][name], buffer, rtol=1e-4, atol=1e-5)


def test_the_cpu_target_is_found_once_while_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key's compiler identity and target are asked for in a thread started by the
    backend; the key waits for that answer instead of running the compiler again."""
    import threading
    import time

    calls: list[str] = []
    release = threading.Event()

    def slow_find() -> str:
        calls.append(threading.current_thread().name)
        release.wait(10)
        return "g++ 99\0znver9"

    monkeypatch.setattr(compile_cache, "_TARGET", [])
    monkeypatch.setattr(compile_cache, "_TARGET_STARTED", [])
    monkeypatch.setattr(compile_cache, "_find_cpu_target", slow_find)
    compile_cache.prepare_cpu_target()
    compile_cache.prepare_cpu_target()  # once per process
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == ["ember-cpu-target"]
    release.set()
    assert compile_cache._cpu_target() == "g++ 99\0znver9"
    assert compile_cache._cpu_target() == "g++ 99\0znver9"
    assert calls == ["ember-cpu-target"]


def test_a_graph_compiled_before_is_remembered_per_graph_inputs_and_settings(
    tmp_path: Path,
) -> None:
    """The hint that lets a warm process skip starting the compile workers: found for
    the same Dynamo graph and inputs, not for other sizes, other settings or another
    graph; none for inputs it cannot describe without their values; nothing is read
    or written with the cache off; `ember cache info` names the store and `ember cache
    clear` empties it."""
    from ember.runtime import cache

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    other = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 3)
    x = torch.randn(4, 8)
    with config.scope(cache_dir=tmp_path, compile_cache=True):
        hint = compile_cache.warm_hint(gm, [x])
        assert hint is not None and not compile_cache.seen(hint)
        compile_cache.remember(hint)
        assert compile_cache.seen(compile_cache.warm_hint(gm, [x]))
        assert not compile_cache.seen(compile_cache.warm_hint(gm, [torch.randn(5, 8)]))
        assert not compile_cache.seen(compile_cache.warm_hint(other, [x]))
        with config.scope(layout="channels-last"):
            assert not compile_cache.seen(compile_cache.warm_hint(gm, [x]))
        assert compile_cache.warm_hint(gm, [[x]]) is None  # nested: described by values
        assert compile_cache.warm_hint(gm, [x.to_sparse()]) is None
        assert "warm-start hints" in cache.info()
        cache.clear_cache()
        assert not compile_cache.seen(hint)
    with config.scope(cache_dir=tmp_path / "off", compile_cache=False):
        assert compile_cache.warm_hint(gm, [x]) is None
        compile_cache.remember(hint)
        assert not compile_cache.seen(hint)
    assert not (tmp_path / "off").exists()


def test_a_real_constant_is_keyed_under_an_active_fake_mode() -> None:
    """Compiles can run under AOTAutograd's fake mode, where torch ops refuse a real
    tensor: the key read a constant's bytes there and failed ("Please convert all
    Tensors to FakeTensors"), so such graphs were never cached (OpInfo sweep logs).
    Its bytes are keyed all the same, and different values give different keys."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    one, two = torch.tensor(1.0), torch.tensor(2.0)
    with FakeTensorMode():
        first = compile_cache._describe(one, values=True)
        second = compile_cache._describe(two, values=True)
    assert first != second
    assert first == compile_cache._describe(one, values=True)  # as outside the mode
