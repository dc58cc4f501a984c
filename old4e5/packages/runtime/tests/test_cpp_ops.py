"""The C++ ops table, op by op, against torch: one kernel per dtype whose members each
apply one op of ember.ir.ops to inputs full of edge values (NaN, inf, -0, ties for
rounding, negative operands for floor division and modulo). One compile for all."""

from __future__ import annotations

import pytest
import sympy
import torch

from ember.codegen.cpp import OP_FORMATS
from ember.ir import Layout, Load, Op, walk
from ember.ir.evaluate import TORCH_OPS
from ember.ir.ops import BOOL_RESULT, UNARY
from ember.ir.symbolic import index_var
from ember.runtime.cpp_kernels import compile_cpp_kernels
from ember.scheduler import POINTWISE, FusedKernel, KernelMember

N = 64
I0 = index_var("i", 0)
FLOATS = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.0, -7.25, 0.3, 1e-3, 100.0]
FLOATS += [-100.0, 1e30, -1e-30, 0.999, -0.999, float("nan"), float("inf"), float("-inf")]


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return (torch.rand(N, generator=g) > 0.5, torch.rand(N, generator=g) > 0.5)
    if dtype.is_floating_point:
        x = torch.cat([torch.tensor(FLOATS), torch.randn(N - len(FLOATS), generator=g) * 4])
        y = torch.cat([torch.tensor(FLOATS[::-1]), torch.randn(N - len(FLOATS), generator=g)])
        return x.to(dtype), y.to(dtype)
    x = torch.randint(-60, 60, (N,), generator=g, dtype=dtype)
    y = torch.randint(1, 7, (N,), generator=g, dtype=dtype) * (
        torch.randint(0, 2, (N,), generator=g) * 2 - 1
    ).to(dtype)
    return x, y


DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.int8, torch.bool]


def _magnitude(y: torch.Tensor) -> torch.Tensor:
    return y if y.dtype == torch.bool else y.abs()


def _reference(name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """torch's result for the op, or None where torch does not define it for the dtype."""
    args = (x,) if name in UNARY else (x, y)
    if name in ("bitwise_left_shift", "bitwise_right_shift") and not x.dtype.is_floating_point:
        args = (x, _magnitude(y))
    if name == "pow" and not x.dtype.is_floating_point:
        args = (x, _magnitude(y))
    try:
        out = TORCH_OPS[name](*args)
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    dtype = torch.bool if name in BOOL_RESULT else x.dtype
    if out.dtype != dtype:
        return None  # torch promotes (e.g. sqrt of ints): not an op of this dtype in the IR
    return out.to(dtype)


def _kernel(dtype: torch.dtype) -> tuple[FusedKernel, dict[str, torch.Tensor], list[str]]:
    x, y = _inputs(dtype)
    members, expected = [], {}
    name = str(dtype).removeprefix("torch.")
    for op in sorted(OP_FORMATS):
        want = _reference(op, x, y)
        if want is None:
            continue
        shift = (
            op in ("bitwise_left_shift", "bitwise_right_shift", "pow")
            and not dtype.is_floating_point
        )
        loads = (Load("x", I0, dtype), Load("yabs" if shift else "y", I0, dtype))
        args = loads[:1] if op in UNARY else loads
        body = Op(op, args, torch.bool if op in BOOL_RESULT else dtype)
        layout = Layout.contiguous(torch.device("cpu"), body.dtype, (sympy.Integer(N),))
        members.append(KernelMember(f"o_{op}", layout, POINTWISE, body, I0, stored=True))
        expected[f"o_{op}"] = want
    kernel = FusedKernel(
        name=f"ops_{name}",
        ranges=(sympy.Integer(N),),
        reduction_ranges=(),
        members=tuple(members),
        inputs=tuple(
            sorted({n.buffer for m in members for n in walk(m.body) if isinstance(n, Load)})
        ),
        outputs=tuple(m.name for m in members),
    )
    return kernel, expected, [m.name for m in members]


@pytest.fixture(scope="module")
def swept(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[FusedKernel, dict[str, torch.Tensor]]]:
    built = {str(d): _kernel(d) for d in DTYPES}
    compiled = compile_cpp_kernels(
        [k for k, _, _ in built.values()], cache_dir=tmp_path_factory.mktemp("ops")
    )
    results = {}
    for dtype in DTYPES:
        kernel, expected, names = built[str(dtype)]
        x, y = _inputs(dtype)
        outs = {n: torch.empty(N, dtype=expected[n].dtype) for n in names}
        buffers = {"x": x, "y": y, "yabs": _magnitude(y), **outs}
        compiled[kernel.name](*[buffers[n] for n in kernel.buffer_arguments()])
        results[str(dtype)] = (outs, expected)
    return results  # type: ignore[return-value]


# Where C++'s math library and torch's (SLEEF, own kernels) may differ in the last bits.
TOLERANCE = {torch.float32: dict(rtol=2e-6, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_op_matches_torch(
    dtype: torch.dtype, swept: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]
) -> None:
    outs, expected = swept[str(dtype)]
    failures = []
    for name, want in expected.items():
        got = outs[name]
        try:
            if want.dtype.is_floating_point:
                torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[want.dtype])
            else:
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc).splitlines()[:4]}")
    assert not failures, "\n".join(failures)


def test_sweep_covers_the_table(
    swept: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]],
) -> None:
    tested = {name.removeprefix("o_") for outs, _ in swept.values() for name in outs}
    assert tested == set(OP_FORMATS)
