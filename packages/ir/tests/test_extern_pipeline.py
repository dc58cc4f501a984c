"""Lowering with every op as an extern call: the thin path the runtime uses today."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import (
    BufferRef,
    ExternKernel,
    InputBuffer,
    LoweringError,
    LoweringOptions,
    MultiOutput,
    SizeInput,
    VerificationError,
    format_program,
    lower_graph,
    run_program,
    verify,
)


def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.relu(x @ w)
    var, mean = torch.var_mean(y, 0)
    return y.sum() + var.sum(), mean


def test_lowering_keeps_layouts_and_runs_like_eager() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    gm = make_fx(f, decomposition_table=ember_decompositions())(x, w)
    program = lower_graph(gm, name="f")
    verify(program)
    inputs = [n for n in program.inputs if isinstance(n, InputBuffer)]
    assert [tuple(int(s) for s in n.layout.size) for n in inputs] == [(4, 8), (8, 3)]
    mm = next(n for n in program.nodes if isinstance(n, ExternKernel) and "mm" in str(n.op))
    assert not mm.fallback  # matmul is an extern on purpose
    expected = f(x, w)
    actual = run_program(program, [x, w])
    torch.testing.assert_close(actual, list(expected))
    assert "extern aten.mm.default" in format_program(program)


def test_symbolic_sizes_never_specialise() -> None:
    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 8), torch.randn(8, 3))
    program = lower_graph(gm)
    verify(program)
    (x_in, _) = program.inputs
    assert isinstance(x_in, InputBuffer)
    assert all(isinstance(s, sympy.Symbol) for s in x_in.layout.size)
    for rows in (2, 9):
        x, w = torch.randn(rows, 8), torch.randn(8, 3)
        torch.testing.assert_close(run_program(program, [x, w]), list(f(x, w)))


def test_multi_output_ops_are_read_through_multioutput() -> None:
    gm = make_fx(lambda x: torch.var_mean(x, 0))(torch.randn(3, 2))
    program = lower_graph(gm)
    picks = [n for n in program.nodes if isinstance(n, MultiOutput)]
    assert [p.index for p in picks] == [0, 1]
    assert program.outputs == [BufferRef(picks[0].name), BufferRef(picks[1].name)]


def test_size_inputs_become_size_nodes() -> None:
    gm = make_fx(lambda x, n: x.view(n, -1), tracing_mode="symbolic")(torch.randn(6), 2)
    program = lower_graph(gm)
    assert any(isinstance(n, SizeInput) for n in program.inputs)
    out = run_program(program, [torch.arange(12.0), 3])[0]
    assert out.shape == (3, 4)


def test_fallback_disabled_is_an_error_naming_op_and_node() -> None:
    gm = make_fx(lambda x: torch.sigmoid(x))(torch.randn(3))
    with pytest.raises(LoweringError, match=r"aten\.sigmoid\.default.*EMBER_FALLBACK") as info:
        lower_graph(gm, options=LoweringOptions(allow_fallback=False))
    assert info.value.node_name.startswith("sigmoid")


def test_functional_collectives_are_intentional_externs() -> None:
    """A tensor-parallel graph's all-reduce and its wait are calls into the process
    group by design: no fallback, and they lower with fallbacks disabled. (Traced with
    fake tensors: no process group is needed.)"""
    c10d = torch.ops._c10d_functional

    def reduce(x: torch.Tensor) -> torch.Tensor:
        return c10d.wait_tensor(c10d.all_reduce(x @ x, "sum", "0")) + 1

    gm = make_fx(reduce, tracing_mode="fake")(torch.randn(4, 4))
    program = lower_graph(gm, options=LoweringOptions(loops=True, allow_fallback=False))
    ops = {str(n.op) for n in program.nodes if isinstance(n, ExternKernel)}
    assert {"_c10d_functional.all_reduce.default", "_c10d_functional.wait_tensor.default"} <= ops
    assert not program.fallback_ops
    assert not any(n.fallback for n in program.nodes if isinstance(n, ExternKernel))


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "cholesky"), reason="this torch has no aten.cholesky op"
)
def test_the_legacy_cholesky_is_an_intentional_extern() -> None:
    """`aten.cholesky` reaches the IR whole on a torch that still has it (2.11; later
    versions have no such op): a LAPACK/cuSOLVER call like the rest of linalg, not a
    fallback."""
    a = torch.randn(4, 4)
    spd = a @ a.T + 4 * torch.eye(4)
    gm = make_fx(lambda x: torch.ops.aten.cholesky.default(x) * 2)(spd)
    program = lower_graph(gm, options=LoweringOptions(loops=True, allow_fallback=False))
    ops = {str(n.op) for n in program.nodes if isinstance(n, ExternKernel)}
    assert "aten.cholesky.default" in ops
    assert not program.fallback_ops


def test_verifier_rejects_a_dangling_read() -> None:
    gm = make_fx(lambda x: x.exp())(torch.randn(3))
    program = lower_graph(gm)
    program.nodes.insert(0, MultiOutput("bogus", "nowhere", 0, None))
    with pytest.raises(VerificationError, match="'nowhere'"):
        verify(program)


def test_a_copy_between_devices_is_an_intentional_extern_never_a_fused_read() -> None:
    """`x.cpu()` of a CUDA input, then CPU math: the copy is an ATen call even with
    loops on and fallbacks off; fused into the CPU kernel, the kernel read the CUDA
    pointer on the host (a crash)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(8, device="cuda")
        gm = make_fx(lambda x: (x.cpu() * 2).sum())(x)
    program = lower_graph(gm, options=LoweringOptions(loops=True, allow_fallback=False))
    text = format_program(program)
    assert "extern aten._to_copy.default(x_1" in text, text
    assert "[fallback]" not in text.split("_to_copy", 1)[1].split("\n", 1)[0]
