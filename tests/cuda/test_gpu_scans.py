"""Long scans on a CUDA GPU, strict: cumsum, cumprod and logcumsumexp carried in float32
(float32, bfloat16 inputs) run as one look-back kernel (ember.codegen.triton.lookback),
integer cumsums in segments (ember.ir.scan: three kernels where a segment length
divides the row, four otherwise); values against eager under the accuracy rule
(integers exactly), over row lengths no tile divides, rows beside rows, a scanned
middle dimension, many launches on one kept workspace, CUDA graph replays, two streams
at once and more tiles than the GPU holds at a time.

Run on the GPU machine from the repository root with
`PYTHONPATH=$(printf '%s:' $PWD/packages/*/src) python3 -m pytest -q tests/cuda/test_gpu_scans.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.ir import scan as ir_scan
from ember.runtime.accuracy import compare_outputs
from ember.runtime.compiler import CompileRecord, compile_records
from ember.runtime.config import config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEVICE = "cuda"


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path) -> Iterator[None]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    with config.scope(cache_dir=tmp_path / "cache", strict=True, fallback=False):
        yield
    torch._dynamo.reset()


def _compile(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    return torch.compile(fn, backend="ember", dynamic=False, options=options)  # type: ignore[no-any-return]  # torch stub


def _kinds(records: list[CompileRecord]) -> list[str]:
    """Each launched Triton kernel's plan kind ('lookback_scan', ...)."""
    assert records, "nothing was compiled"
    return [
        launcher.kernel.kind
        for r in records
        for launcher in r.artifact.launchers.values()
        if hasattr(launcher, "kernel")
    ]


def _check(got: Any, fn: Callable[..., Any], *args: torch.Tensor) -> None:
    want = fn(*args)
    floating = any(a.is_floating_point() for a in args)
    reference = fn(*[a.double() for a in args]) if floating else None
    if not floating:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        return
    verdict = compare_outputs(got, want, reference=reference)
    assert verdict is None, verdict[0].describe() if verdict else ""


def _input(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, device=DEVICE).to(dtype)
    return torch.randint(-1000, 1000, shape, device=DEVICE, dtype=dtype)


# (shape, scanned dim): 33001 and 1000003 are divided by no tile (nor any segment
# length); 1 << 20 by all of them
SHAPES = [
    ((32768,), 0),
    ((33001,), 0),
    ((1 << 20,), 0),
    ((1000003,), 0),
    ((3, 33001), 1),
    ((2, 1 << 20), -1),
    ((2, 33001, 3), 1),
    ((4, 65536, 2), 1),
]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, dim", SHAPES)
def test_long_cumsum_kernels_and_values(
    shape: tuple[int, ...], dim: int, dtype: torch.dtype
) -> None:
    x = _input(shape, dtype)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(dim)

    start = len(compile_records)
    got = _compile(fn, cudagraphs="off")(x)
    kinds = _kinds(compile_records[start:])
    if dtype.is_floating_point:
        assert kinds == ["lookback_scan"]
    else:
        divides = ir_scan.segment_length(shape[dim])[1]
        assert len(kinds) == (3 if divides else 4), kinds
        assert "lookback_scan" not in kinds
    _check(got, fn, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumprod_and_logcumsumexp_take_one_kernel(dtype: torch.dtype) -> None:
    x = (1 + torch.randn(3, 100003, device=DEVICE) * 1e-4).to(dtype)
    for fn in (lambda x: x.cumprod(1), lambda x: torch.logcumsumexp(x, 1)):
        torch._dynamo.reset()
        start = len(compile_records)
        got = _compile(fn, cudagraphs="off")(x)
        assert _kinds(compile_records[start:]) == ["lookback_scan"]
        _check(got, fn, x)


@pytest.mark.parametrize("cudagraphs", ["off", "on"])
def test_many_launches_on_one_workspace(cudagraphs: str) -> None:
    """Every launch after the first reuses the words the last one left (tagged by
    launch), graphed and not."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0) * 2

    compiled = _compile(fn, cudagraphs=cudagraphs)
    inputs = [torch.randn(1 << 20, device=DEVICE) for _ in range(4)]
    start = len(compile_records)
    for round_ in range(50):
        x = inputs[round_ % len(inputs)]
        got = compiled(x).clone()
        if round_ % 7 == 0 or round_ > 45:
            _check(got, fn, x)
    records = compile_records[start:]
    assert "lookback_scan" in _kinds(records)
    if cudagraphs == "on":
        assert records[0].cudagraphs.startswith("recorded"), records[0].cudagraphs


def test_two_streams_at_once() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0)

    compiled = _compile(fn, cudagraphs="off")
    xs = [torch.randn(4 << 20, device=DEVICE) for _ in range(2)]
    compiled(xs[0])  # compiled and tuned on the default stream
    streams = [torch.cuda.Stream() for _ in xs]
    results: list[list[torch.Tensor]] = [[], []]
    torch.cuda.synchronize()
    for _ in range(20):
        for k, (stream, x) in enumerate(zip(streams, xs, strict=True)):
            with torch.cuda.stream(stream):
                results[k].append(compiled(x))
    torch.cuda.synchronize()
    for k, x in enumerate(xs):
        for got in results[k][::5]:
            _check(got, fn, x)


def test_more_tiles_than_the_gpu_holds_at_once() -> None:
    """64M elements: 16384 tiles of 4096, many waves of programs; a tile waits only on
    tiles that started before it, whatever order the GPU starts them in."""
    x = torch.randn(64 << 20, device=DEVICE)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0)

    start = len(compile_records)
    got = _compile(fn, cudagraphs="off")(x)
    assert _kinds(compile_records[start:]) == ["lookback_scan"]
    _check(got, fn, x)
