"""Provenance: each kernel lists the FX nodes whose computation it holds, its name
lists only ops it computes, and the schedule says why kernels were not fused."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.ir import ComputedBuffer, ExternKernel, Program
from ember.scheduler import ExternCall, KernelStep, Schedule


def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A layer norm feeding a matmul, then a GELU: the pointwise chain before the
    matmul is stored when the matmul (an ATen call) is lowered."""
    h = F.layer_norm(x, (x.shape[-1],))
    return F.gelu(torch.addmm(b, h, w))


def test_a_buffer_stored_for_an_aten_call_names_the_nodes_it_computes(
    lower: Callable[..., Program],
) -> None:
    x, w, b = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)
    program = lower(_block, x, w, b)
    extern = next(n for n in program.nodes if isinstance(n, ExternKernel) and "addmm" in str(n.op))
    (normalised,) = [n for n in program.nodes if n.name == extern.args[1].name]
    assert isinstance(normalised, ComputedBuffer)
    # stored while the addmm was lowered, but it holds the layer norm, not the addmm
    assert not any("addmm" in o for o in normalised.origins), normalised.origins
    assert normalised.origins and normalised.origin == normalised.origins[-1]
    assert extern.origin.startswith("addmm")


def test_kernel_names_list_only_what_the_kernel_computes(
    schedule: Callable[..., Schedule],
) -> None:
    x, w, b = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)
    sched = schedule(_block, x, w, b)
    kernels = sched.kernels
    assert len(kernels) == 2
    first, second = kernels
    assert "addmm" not in first.name and "gelu" not in first.name
    assert "addmm" not in second.name and "gelu" in second.name  # the GELU after the matmul
    for kernel in kernels:
        assert kernel.origins
        words = kernel.name.split("_", 2)[2]
        for origin in kernel.origins:
            assert not origin.startswith("addmm")
        assert all(any(w in o for o in kernel.origins) for w in words.split("_") if w != "mean")
    externs = [s for s in sched.steps if isinstance(s, ExternCall) and not s.node.is_view]
    assert [s.origins for s in externs] == [(externs[0].node.origin,)]


def test_the_schedule_says_why_adjacent_kernels_did_not_fuse(
    schedule: Callable[..., Schedule],
) -> None:
    def residual(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (x.shape[-1],))
        return (h @ w) + h  # the add reads the norm and the matmul that follows it

    sched = schedule(residual, torch.randn(8, 16), torch.randn(16, 16))
    first, second = sched.kernels
    notes = [n for n in sched.fusion_notes if n.kernel == second.name]
    assert [n.other for n in notes] == [first.name]
    assert "made by an ATen call between them" in notes[0].reason
    assert f"fusion: {second.name} not fused into {first.name}" in sched.format()


def test_a_scatter_is_noted_as_running_alone(schedule: Callable[..., Schedule]) -> None:
    def scatter(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (x * 2).index_put((i,), v, accumulate=True)

    x, i, v = torch.randn(10), torch.tensor([1, 3, 3]), torch.randn(3)
    sched = schedule(scatter, x, i, v)
    alone = [n for n in sched.fusion_notes if not n.other]
    assert alone and "scatter" in alone[0].reason
    scatter_kernel = next(
        s.kernel for s in sched.steps if isinstance(s, KernelStep) and s.kernel.is_scatter
    )
    assert alone[0].kernel == scatter_kernel.name
    assert "index_put" in scatter_kernel.name
