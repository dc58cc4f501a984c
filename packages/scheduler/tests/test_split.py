"""Split reductions: which reductions become a partial and a final one, and that the
split schedule computes what the unfused program and eager compute."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import sympy
import torch

from ember.ir import ComputedBuffer, Program, Reduction, run_program
from ember.ir.printer import format_program
from ember.scheduler import DeviceChoices, Schedule, run_schedule, schedule_program

# Thresholds small enough to split test-sized tensors: 16 workers wanted, a column
# worker covers 4 outputs, chunks of at least 8 elements.
SMALL = DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8)
# What ember.codegen.triton asks for (an H100/H200-class GPU); restated here because
# the scheduler cannot import a codegen.
GPU = DeviceChoices(
    split_workers=132 * 16, split_column_width=64, split_min_chunk=256, split_min_work=8192
)


def reductions(schedule: Schedule) -> list[tuple[str, tuple[int, ...]]]:
    """(name, layout size) of every reduction member, in schedule order."""
    return [
        (m.name, tuple(int(s) for s in m.layout.size))
        for k in schedule.kernels
        for m in k.members
        if m.kind == "reduction"
    ]


def check(program: Program, schedule: Schedule, fn: Callable[..., Any], *args: Any) -> None:
    actual = run_schedule(schedule, [a.clone() for a in args])
    torch.testing.assert_close(actual, run_program(program, [a.clone() for a in args]))
    expected = fn(*args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_the_gpu_choice_for_a_column_sum() -> None:
    # x.sum(0) of [32768, 4096]: 4096 outputs in column tiles of 64 are 64 programs;
    # 32 chunks of 1024 rows make 2048.
    assert GPU.reduction_chunks(4096, 32768, 32768, column=True) == 32
    # the same shape summed along rows already has 32768 programs
    assert GPU.reduction_chunks(32768, 4096, 4096, column=False) == 1
    # a full sum of 2**27 elements: as many chunks as the cap allows
    assert GPU.reduction_chunks(1, 1 << 27, 1 << 27, column=False) == 1024
    # GPT-2's bias gradient, [8192, 768].sum(0): chunks of at least 256 rows
    assert GPU.reduction_chunks(768, 8192, 8192, column=True) == 32
    # no divisor of a prime extent: left whole rather than masked
    assert GPU.reduction_chunks(64, 50021, 50021, column=True) == 1
    # T5-small's RMSNorm at batch 16: 2048 rows of 512 nearly fill the GPU already;
    # halving the rows would add two kernels for 3% more programs. (The count alone:
    # `split_min_work` keeps rows of 512 whole in any case, as tested below.)
    assert GPU.reduction_chunks(2048, 512, 512, column=False) == 1
    assert GPU.reduction_chunks(1024, 512, 512, column=False) == 2  # doubles them
    assert DeviceChoices().reduction_chunks(1, 1 << 27, 1 << 27, column=False) == 1


def test_column_sum_splits_into_a_partial_and_a_final_kernel(
    lower: Callable[..., Program],
) -> None:
    x = torch.randn(64, 16)
    program = lower(lambda t: t.sum(0), x)
    schedule = schedule_program(program, SMALL)
    assert len(schedule.kernels) == 2
    # 16 outputs = 4 column workers; 4 chunks of 16 rows, stored [chunks, outputs]
    (partial, partial_size), (final, final_size) = reductions(schedule)
    assert partial_size == (4, 16) and final_size == (16,)
    assert partial in {a.name for step in schedule.memory.allocations for a in step}
    assert final == next(n.name for n in program.nodes if isinstance(n, ComputedBuffer))
    check(program, schedule, lambda t: t.sum(0), x)


def test_row_reduction_partials_are_stored_row_major(lower: Callable[..., Program]) -> None:
    x = torch.randn(4, 256)
    program = lower(lambda t: t.sum(-1), x)
    schedule = schedule_program(program, SMALL)
    assert [size for _, size in reductions(schedule)] == [(4, 4), (4,)]  # [outputs, chunks]
    check(program, schedule, lambda t: t.sum(-1), x)


def layer_norm_weight_grad(
    dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> torch.Tensor:
    # as in the backward graph: the forward saved the per-row mean and rstd
    return (dy * ((x - mean[:, None]) * rstd[:, None])).sum(0)


def test_row_constants_do_not_turn_a_column_sum_into_row_partials(
    lower: Callable[..., Program],
) -> None:
    # dy and x move across outputs; the per-row mean and rstd are the same for every
    # output and must not vote for a row-major [outputs, chunks] partial.
    args = (torch.randn(64, 16), torch.randn(64, 16), torch.randn(64), torch.rand(64) + 0.5)
    program = lower(layer_norm_weight_grad, *args)
    schedule = schedule_program(program, SMALL)
    sizes = [size for _, size in reductions(schedule) if len(size) == 2]
    assert (4, 16) in sizes and (16, 4) not in sizes  # [chunks, outputs]
    check(program, schedule, layer_norm_weight_grad, *args)


def test_small_and_dynamic_reductions_stay_whole(lower: Callable[..., Program]) -> None:
    small = lower(lambda t: t.sum(0), torch.randn(64, 16))
    assert len(schedule_program(small, GPU).kernels) == 1
    assert len(schedule_program(small).kernels) == 1  # the defaults never split
    dynamic = lower(lambda t: t.sum(0), torch.randn(64, 16), symbolic=True)
    assert len(schedule_program(dynamic, SMALL).kernels) == 1


def test_argmax_stays_whole_and_welford_merges_its_chunks(lower: Callable[..., Program]) -> None:
    x = torch.randn(256, 4) + 3.0

    def stats(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*torch.var_mean(t, 0), t.argmax(0))

    program = lower(stats, x)
    schedule = schedule_program(program, SMALL)
    kinds = [m.reduction for k in schedule.kernels for m in k.members if m.kind == "reduction"]
    # argmax whole; welford as chunk statistics, then a welford of the chunks' means
    # and a sum of their M2s (Chan's merge)
    assert sorted(kinds) == ["argmax", "sum", "welford", "welford"]
    names = {n.name for n in schedule.program.nodes}
    welford = next(n for n in program.nodes if getattr(n.loop, "kind", None) == "welford")
    assert {f"{welford.name}_partial", f"{welford.name}_means", f"{welford.name}_m2s"} <= names
    check(program, schedule, stats, x)


def bias_grad(h: torch.Tensor, gy: torch.Tensor, w: torch.Tensor) -> Any:
    g = torch.ops.aten.gelu_backward(gy, h)
    return g @ w, g.sum(0)


def test_a_small_welford_stays_whole_on_the_gpu(lower: Callable[..., Program]) -> None:
    """Splitting would add three kernels to one that reads 100 KB (convnext's final
    layer norm); a batch norm's statistics over 64 x 112 x 112 rows split."""

    def split(program: Program) -> bool:
        nodes = schedule_program(program, GPU).program.nodes
        return any(n.name.endswith("_partial") for n in nodes)

    head = lower(lambda t: torch.var_mean(t, -1), torch.randn(64, 768))
    assert not split(head)
    stem = lower(lambda t: torch.var_mean(t, 0), torch.randn(64 * 112 * 112, 1))
    assert split(stem)
    # few elements in all, but unsplit only two programs (64 channels each) would
    # reduce 6272 rows: MobileNetV3's 14 x 14 batch norms at batch 32
    columns = lower(lambda t: torch.var_mean(t, 0), torch.randn(6272, 80))
    assert split(columns)


def test_partial_absorbs_the_prologue_and_final_the_epilogue(
    lower: Callable[..., Program],
) -> None:
    args = (torch.randn(64, 16), torch.randn(64, 16), torch.randn(16, 8))
    program = lower(bias_grad, *args)
    schedule = schedule_program(program, SMALL)
    first, second = schedule.kernels
    # the gradient (also read by the matmul) is computed and stored by the partial
    assert [(m.kind, m.stored) for m in first.members] == [
        ("pointwise", True),
        ("reduction", True),
    ]
    assert [m.kind for m in second.members] == ["reduction"]
    check(program, schedule, bias_grad, *args)
    unsplit = schedule_program(program)  # the column sum absorbs it unsplit too
    assert len(unsplit.kernels) == 1

    def mean_cast(t: torch.Tensor) -> torch.Tensor:
        return (t * 2).mean(0).to(torch.float16)

    x = torch.randn(128, 8)
    program = lower(mean_cast, x)
    schedule = schedule_program(program, SMALL)
    assert len(schedule.kernels) == 2
    final = schedule.kernels[1]
    assert [m.kind for m in final.members if m.stored] == ["pointwise"]
    check(program, schedule, mean_cast, x)


CASES: dict[str, tuple[Callable[..., Any], list[torch.Tensor]]] = {
    "sum_all": (lambda t: t.sum(), [torch.randn(32, 24)]),
    "prod_cols": (lambda t: t.prod(0), [1 + 0.01 * torch.randn(64, 8)]),
    "max_rows": (lambda t: t.amax(-1), [torch.randn(3, 512)]),
    "min_cols": (lambda t: t.amin(0) * 2, [torch.randn(96, 5)]),
    "any_all": (
        lambda t: ((t > 2.0).any(0), (t > -2.5).all(-1)),
        [torch.randn(128, 6)],
    ),
    "two_dims": (lambda t: t.sum((0, 2)), [torch.randn(16, 3, 20)]),
    "int_sum": (lambda t: (t * 10).to(torch.int32).sum(0), [torch.randn(64, 4)]),
    "bf16_sum": (
        lambda t: t.sum(0),
        [torch.randn(64, 8).to(torch.bfloat16)],
    ),
    "var_mean_cols": (lambda t: torch.var_mean(t, 0), [torch.randn(256, 4) * 3 + 50]),
    "var_rows": (lambda t: torch.var(t, -1, correction=0), [torch.randn(3, 512) - 7]),
    # a training batch norm's statistics: per channel over N, H and W, channels-last
    "batch_norm_stats": (
        lambda t: torch.var_mean(t, (0, 2, 3), correction=0),
        [(torch.randn(16, 4, 6, 6) + 20).to(memory_format=torch.channels_last)],
    ),
    "norm_backward": (
        lambda g, x, w: ((g * x).sum(0), g.sum(0), g * w),
        [torch.randn(64, 12), torch.randn(64, 12), torch.randn(12)],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_split_matches_unfused_program_and_eager(case: str, lower: Callable[..., Program]) -> None:
    fn, args = CASES[case]
    program = lower(fn, *args)
    schedule = schedule_program(program, SMALL)
    partials = [
        n
        for n in schedule.program.nodes
        if isinstance(n, ComputedBuffer) and n.name.endswith("_partial")
    ]
    assert partials, "the case should split"
    for node in partials:
        assert isinstance(node.loop, Reduction)
        assert all(isinstance(r, sympy.Integer) for r in node.loop.reduction_ranges)
    check(program, schedule, fn, *args)


def test_split_finals_share_a_kernel(lower: Callable[..., Program]) -> None:
    """A split reduction's final steps over the same outputs run as one kernel: the
    Welford merge's mean and M2 sums (its partials interleave them in pairs), and the
    two per-channel sums of a batch norm's backward (cousins: they read what one
    partial kernel wrote, and share no bytes)."""
    x = torch.randn(512, 8) + 2.0

    def stats(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.var_mean(t, 0)

    program = lower(stats, x)
    schedule = schedule_program(program, SMALL)
    finals = [
        k for k in schedule.kernels if any(m.name.endswith(("_means", "_m2s")) for m in k.members)
    ]
    assert len(finals) == 1
    assert {m.reduction for m in finals[0].members if m.kind == "reduction"} == {"welford", "sum"}
    check(program, schedule, stats, x)

    def backward_sums(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return g.sum(0), (g * h).sum(0)

    args = (torch.randn(512, 8), torch.randn(512, 8))
    program = lower(backward_sums, *args)
    schedule = schedule_program(program, SMALL)
    shapes = [[m.name for m in k.members if m.kind == "reduction"] for k in schedule.kernels]
    assert len(schedule.kernels) == 2, shapes  # the partials, then both finals
    assert sorted(len(names) for names in shapes) == [2, 2]
    check(program, schedule, backward_sums, *args)


def test_a_split_welford_pair_folds_into_its_readers(lower: Callable[..., Program]) -> None:
    """A batch norm's statistics: the chunks, then one kernel merging them and
    computing what is per channel (rstd, the running mean). The stored [C, 2] pair
    was a kernel of its own that nothing per channel could join."""

    def bn_stats(t: torch.Tensor, running: torch.Tensor) -> tuple[torch.Tensor, ...]:
        var, mean = torch.var_mean(t, 0, correction=0)
        return torch.rsqrt(var + 1e-5), running * 0.9 + mean * 0.1

    args = (torch.randn(256, 4) * 2.0 + 3.0, torch.randn(4))
    program = lower(bn_stats, *args)
    schedule = schedule_program(program, SMALL)
    welford = next(n for n in program.nodes if getattr(n.loop, "kind", None) == "welford")
    assert welford.name not in {n.name for n in schedule.program.nodes}
    assert len(schedule.kernels) == 2, [[m.name for m in k.members] for k in schedule.kernels]
    check(program, schedule, bn_stats, *args)


def test_a_pair_that_is_an_output_stays(lower: Callable[..., Program]) -> None:
    """Where the pair itself is returned (its mean, a view of it, is an output), it is
    stored as before and the values are unchanged."""
    x = torch.randn(256, 4) + 3.0
    program = lower(lambda t: torch.var_mean(t, 0), x)
    schedule = schedule_program(program, SMALL)
    check(program, schedule, lambda t: torch.var_mean(t, 0), x)


def test_a_training_batch_norm_takes_three_kernels(lower: Callable[..., Program]) -> None:
    """AOTAutograd's batch norm forward returns the batch mean as a view of the
    statistics (an `as_strided` extern) and reads it back through that view: the
    view then points at the merged means and readers load the buffer itself, so the
    chunks, the merge with every per-channel result, and the normalisation are the
    three kernels (six before)."""

    def forward(*args: torch.Tensor) -> Any:
        return torch.ops.aten._native_batch_norm_legit_functional.default(*args, True, 0.1, 1e-5)

    x = torch.randn(32, 6, 4, 4).to(memory_format=torch.channels_last) * 2.0 + 1.0
    args = (x, torch.randn(6), torch.randn(6), torch.randn(6), torch.rand(6) + 1.0)
    program = lower(forward, *args)
    schedule = schedule_program(program, SMALL)
    assert len(schedule.kernels) == 3, [[m.name for m in k.members] for k in schedule.kernels]
    check(program, schedule, forward, *args)


def two_batch_norm_backwards(*args: torch.Tensor) -> Any:
    """A downsampling residual block's backward: one gradient into the batch norms of
    both branches (each its own input and statistics)."""
    dy, x1, w1, m1, s1, x2, w2, m2, s2 = args
    grads = []
    for x, w, m, s in ((x1, w1, m1, s1), (x2, w2, m2, s2)):
        grads += torch.ops.aten.native_batch_norm_backward.default(
            dy, x, w, None, None, m, s, True, 1e-5, [True, True, True]
        )
    return tuple(grads)


def test_two_batch_norm_backwards_of_one_gradient_take_three_kernels(
    lower: Callable[..., Program],
) -> None:
    """Batch norm's backward, lowered whole: the partial sums of both batch norms in one
    kernel (they read the one gradient), the final sums of both with their weight and
    bias gradients in one (a final joins its cousin's kernel, the other batch norm's
    weight and bias gradients in it already), and both input gradients in one."""
    x1, x2, dy = (torch.randn(16, 6, 4, 4) * 2 + 1 for _ in range(3))
    stats = [torch.randn(6), torch.rand(6) + 0.5]
    args = (dy, x1, torch.randn(6), *stats, x2, torch.randn(6), *stats)
    program = lower(two_batch_norm_backwards, *args)
    schedule = schedule_program(program, SMALL)
    kinds = [sorted({m.kind for m in k.members}) for k in schedule.kernels]
    assert len(schedule.kernels) == 3, [[m.name for m in k.members] for k in schedule.kernels]
    assert kinds[1] == ["pointwise", "reduction"] and kinds[2] == ["pointwise"]
    assert sum(m.kind == "reduction" for m in schedule.kernels[1].members) == 4
    check(program, schedule, two_batch_norm_backwards, *args)


def test_a_whole_reduction_is_not_split(lower: Callable[..., Program]) -> None:
    """A reduction the lowering marks `whole` (a segmented scan's segment totals: one
    program per segment already) keeps its rows, where the same loop unmarked splits."""
    x = torch.randn(4, 256)
    program = lower(lambda t: t.sum(-1), x)
    assert len(schedule_program(program, SMALL).kernels) == 2
    nodes = [
        replace(n, loop=replace(n.loop, whole=True))
        if isinstance(n, ComputedBuffer) and isinstance(n.loop, Reduction)
        else n
        for n in program.nodes
    ]
    whole = replace(program, nodes=nodes)
    assert "reduction sum [4] over [256] whole" in format_program(whole)  # IR dumps say so
    schedule = schedule_program(whole, SMALL)
    assert [size for _, size in reductions(schedule)] == [(4,)]
    check(whole, schedule, lambda t: t.sum(-1), x)


def test_a_reduction_with_little_work_per_worker_is_not_split(
    lower: Callable[..., Program],
) -> None:
    """`split_min_work`: rows of 256 elements each (T5's RMSNorm, in small) would split
    under SMALL's thresholds; with 512 elements wanted per worker they stay whole."""
    x = torch.randn(4, 256)
    program = lower(lambda t: t.sum(-1), x)
    assert len(schedule_program(program, SMALL).kernels) == 2
    schedule = schedule_program(program, replace(SMALL, split_min_work=512))
    assert [size for _, size in reductions(schedule)] == [(4,)]
