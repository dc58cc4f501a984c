"""Fusion decisions on real graphs: how many kernels, which nodes share one, what
each kernel stores and reads."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import (
    ComputedBuffer,
    ExternKernel,
    Load,
    LoweringOptions,
    Program,
    lower_graph,
    walk,
)
from ember.scheduler import (
    ExternCall,
    KernelStep,
    Schedule,
    kernel_bytes,
    run_schedule,
    schedule_program,
    unfused_bytes,
)


def test_softmax_is_one_kernel_reading_its_input_once(
    lower: Callable[..., Program], schedule: Callable[..., Schedule]
) -> None:
    x = torch.randn(16, 64)
    program = lower(lambda t: torch.softmax(t, -1), x)
    sched = schedule(lambda t: torch.softmax(t, -1), x)
    (kernel,) = sched.kernels
    kinds = [(m.kind, m.reduction, m.stored) for m in kernel.members]
    assert kinds == [
        ("reduction", "max", False),
        ("reduction", "sum", False),
        ("pointwise", None, True),
    ]
    assert kernel.inputs == ("t_1",) or len(kernel.inputs) == 1
    assert kernel_bytes(kernel, program) == 2 * x.numel() * 4  # one read, one write
    assert unfused_bytes(program) > kernel_bytes(kernel, program)


def test_layer_norm_written_out_is_one_kernel(schedule: Callable[..., Schedule]) -> None:
    def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).square().mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * w + b

    sched = schedule(layer_norm, torch.randn(8, 32), torch.randn(32), torch.randn(32))
    (kernel,) = sched.kernels
    assert [m.kind for m in kernel.members if m.stored] == ["pointwise"]
    assert sum(m.kind == "reduction" for m in kernel.members) == 2


def test_rms_norm_and_gelu_after_bias_are_one_kernel_each(
    schedule: Callable[..., Schedule],
) -> None:
    def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w

    assert len(schedule(rms_norm, torch.randn(8, 32), torch.randn(32)).kernels) == 1
    gelu = schedule(lambda x, b: F.gelu(x + b), torch.randn(8, 32), torch.randn(32))
    assert len(gelu.kernels) == 1
    assert len(gelu.kernels[0].ranges) == 2  # the bias broadcast keeps rows and columns apart


def test_residual_add_then_norm_is_one_kernel_with_both_outputs(
    schedule: Callable[..., Schedule],
) -> None:
    def residual_norm(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return h, h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)

    (kernel,) = schedule(residual_norm, torch.randn(8, 32), torch.randn(8, 32)).kernels
    assert len(kernel.outputs) == 2


def test_sibling_reductions_share_a_kernel(schedule: Callable[..., Schedule]) -> None:
    sched = schedule(lambda x: (x.sum(-1), x.amax(-1)), torch.randn(8, 32))
    (kernel,) = sched.kernels
    assert sorted(m.reduction or "" for m in kernel.members) == ["max", "sum"]
    assert len(kernel.inputs) == 1


def test_reductions_over_different_axes_stay_apart(schedule: Callable[..., Schedule]) -> None:
    sched = schedule(lambda x: torch.softmax(x, -1).sum(0), torch.randn(8, 32))
    assert len(sched.kernels) == 2


def test_row_and_column_sums_of_a_square_matrix_stay_apart(
    schedule: Callable[..., Schedule],
) -> None:
    """A 64x64 input summed over rows and over columns fits one [64] over [64] loop,
    but the two read it along different axes: one kernel would walk it across its
    rows for one of them (layer-norm backward on the CPU was 7x slower so). Sums
    along the same axis still share a kernel."""
    sched = schedule(lambda x: (x.sum(1), x.sum(0)), torch.randn(64, 64))
    assert len(sched.kernels) == 2
    same_axis = schedule(lambda x: (x.sum(1), (x * 2).sum(1), x.sum(0)), torch.randn(64, 64))
    assert sorted(len(k.members) for k in same_axis.kernels) == [1, 2]


def test_nothing_fuses_across_a_matmul_that_needs_it(schedule: Callable[..., Schedule]) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.exp() @ w)

    sched = schedule(f, torch.randn(8, 16), torch.randn(16, 4))
    kinds = [type(s).__name__ for s in sched.steps if s.launches_kernel]
    assert kinds == ["KernelStep", "ExternCall", "KernelStep"]


def test_independent_pointwise_siblings_share_one_kernel(schedule: Callable[..., Schedule]) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = x.exp()
        m = x @ w
        return a, m, x.sin()  # x.sin() needs nothing from the matmul

    sched = schedule(f, torch.randn(8, 16), torch.randn(16, 4))
    assert len(sched.kernels) == 1 and len(sched.kernels[0].outputs) == 2
    assert sched.kernels[0].inputs == ("x_1",)


def test_contiguous_dimensions_merge_and_transposes_do_not(
    schedule: Callable[..., Schedule],
) -> None:
    sched = schedule(lambda x: (x * 2, (x + 1).transpose(1, 2).contiguous()), torch.randn(4, 6, 8))
    shapes = sorted(k.ranges for k in sched.kernels)
    assert (sympy_int(192),) in shapes
    assert any(len(r) == 3 for r in shapes)


def test_input_mutation_writes_into_the_input_and_stays_alone(
    lower: Callable[..., Program], schedule: Callable[..., Schedule]
) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1

    program = lower(f, torch.randn(8))
    mutations = [n for n in program.nodes if isinstance(n, ComputedBuffer) and n.mutates]
    assert mutations
    sched = schedule(f, torch.randn(8))
    writers = [k for k in sched.kernels if any(m.mutates for m in k.members)]
    assert writers and all(len(k.members) == 1 for k in writers)
    assert not any(isinstance(n, ExternKernel) for n in program.nodes)


def test_symbolic_sizes_flow_into_kernel_arguments(schedule: Callable[..., Schedule]) -> None:
    sched = schedule(lambda x: torch.softmax(x, -1), torch.randn(8, 32), symbolic=True)
    (kernel,) = sched.kernels
    assert [s.name for s in kernel.size_arguments()]  # the row length and count are symbols
    assert all(not r.is_number for r in kernel.ranges)


def sympy_int(value: int) -> object:
    import sympy

    return sympy.Integer(value)


def test_transformer_block_schedule(schedule: Callable[..., Schedule]) -> None:
    """torch's pre-norm encoder layer, inference: matmuls and attention stay externs.
    Its batch-first input is transposed to sequence-first inside the layer, so each
    norm's output is read back through a permutation (not the same point): the
    statistics and the normalisation are two kernels there, unlike the next test."""
    block = torch.nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=True
    ).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        sched = schedule(lambda x: block(x), x)
        expected = block(x)
    externs = [s for s in sched.steps if s.launches_kernel and not hasattr(s, "kernel")]
    assert len(externs) == 5  # qkv, attention, out-projection, two MLP matmuls
    assert len(sched.kernels) == KERNELS_OF_TORCH_ENCODER_LAYER, [k.name for k in sched.kernels]
    welford = [k for k in sched.kernels if any(m.reduction == "welford" for m in k.members)]
    assert len(welford) == 2
    # the residual add (a loop left in several dimensions by the permutation) is the
    # second norm's prologue, read back through the norm's index
    assert "add" in welford[1].name
    (actual,) = run_schedule(sched, [x])
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


KERNELS_OF_TORCH_ENCODER_LAYER = 6


def test_layer_norm_before_a_linear_is_one_kernel(schedule: Callable[..., Schedule]) -> None:
    """[B, S, D] normalised, read back as [B*S, D] by the matmul: the welford and its
    epilogue meet once the loop dimensions are merged (iteration.merge_loop)."""

    def norm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(F.layer_norm(x, (32,)), w)

    sched = schedule(norm_linear, torch.randn(2, 8, 32), torch.randn(16, 32))
    (kernel,) = sched.kernels
    assert [m.kind for m in kernel.members] == ["reduction", "pointwise"]


def test_cnn_block_with_batch_norm_schedule(schedule: Callable[..., Schedule]) -> None:
    """Inference batch norm folds into one pointwise kernel with the ReLU after the
    convolution; training batch norm computes its statistics in one welford pass."""
    conv, bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
    x = torch.randn(2, 3, 16, 16)
    bn.eval()
    with torch.no_grad():
        sched = schedule(lambda t: torch.relu(bn(conv(t))), x)
    assert len(sched.kernels) == 1 and sched.kernels[0].members[0].kind == "pointwise"
    bn.train()
    train = schedule(lambda t: torch.relu(bn(conv(t))), x)
    reductions = {m.reduction for k in train.kernels for m in k.members if m.kind == "reduction"}
    assert "welford" in reductions or "sum" in reductions
    # num_batches_tracked += 1; the statistics with the two running-stat updates
    # (written into the buffers by the statistics' kernel); normalise + ReLU
    assert len(train.kernels) == 3, [k.name for k in train.kernels]
    (stats,) = [k for k in train.kernels if k.reduction_ranges]
    assert sum(1 for m in stats.members if m.mutates) == 2


def embedding_and_bias_grads(
    x: torch.Tensor, idx: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # the order of GPT-2's backward graph: a column sum, the embedding gradient's
    # scatter, then the cast of the sum to the output dtype
    total = x.sum(0)
    table = torch.zeros(10, 4).index_put((idx,), g, accumulate=True)
    return table, total.to(torch.float16)


def test_a_cast_joins_its_reduction_across_an_unrelated_scatter(
    lower: Callable[..., Program],
) -> None:
    args = (torch.randn(64, 4), torch.randint(0, 10, (12,)), torch.randn(12, 4))
    program = lower(embedding_and_bias_grads, *args)
    schedule = schedule_program(program)
    kinds = [sorted(m.kind for m in k.members) for k in schedule.kernels]
    assert ["pointwise", "reduction"] in kinds  # sum + cast in one kernel
    actual = run_schedule(schedule, [a.clone() for a in args])
    torch.testing.assert_close(actual, list(embedding_and_bias_grads(*args)))


def scatter_then_read(x: torch.Tensor, idx: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    total = x.sum(0)
    table = x.index_put((idx,), g, accumulate=True)
    return total * table.sum(0)  # reads the scatter's result: stays after it


def test_a_read_of_a_scattered_buffer_stays_after_the_scatter(
    lower: Callable[..., Program],
) -> None:
    args = (torch.randn(10, 4), torch.randint(0, 10, (12,)), torch.randn(12, 4))
    program = lower(scatter_then_read, *args)
    schedule = schedule_program(program)
    kinds = [[m.kind for m in k.members] for k in schedule.kernels]
    scatter = next(i for i, members in enumerate(kinds) if "scatter" in members)
    after = [kind for members in kinds[scatter + 1 :] for kind in members]
    assert after.count("reduction") == 1 and "pointwise" in after  # table.sum(0), product
    actual = run_schedule(schedule, [a.clone() for a in args])
    torch.testing.assert_close(actual[-1], scatter_then_read(*args))


def mutating_program(
    fn: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], name: str
) -> Program:
    """`fn`, which writes into some of its inputs, functionalised (each write a
    `copy_` into the input at the end), traced on copies of `args` and lowered."""
    gm = make_fx(
        torch.func.functionalize(fn, remove="mutations_and_views"),
        decomposition_table=ember_decompositions(),
    )(*[a.clone() for a in args])
    return lower_graph(gm, name=name, options=LoweringOptions(loops=True))


def batch_norm_step(
    x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor
) -> torch.Tensor:
    count.add_(1)
    return F.batch_norm(x, mean, var, training=True, momentum=0.1)


def test_a_group_that_stores_nothing_makes_no_kernel() -> None:
    """Functionalised `count.add_(1)` realises `count + 1` and then recomputes it in the
    `copy_` into `count`: that first buffer is read by no one. It made an empty kernel
    (no arguments), which the Triton launcher could not launch (resnet50 training)."""
    args = (
        torch.randn(8, 4, 5, 5),
        torch.zeros(4),
        torch.ones(4),
        torch.zeros((), dtype=torch.int64),
    )
    program = mutating_program(batch_norm_step, args, "bn")
    schedule = schedule_program(program)
    assert schedule.kernels and all(k.members and k.buffer_arguments() for k in schedule.kernels)
    actual = run_schedule(schedule, [a.clone() for a in args])
    expected_args = [a.clone() for a in args]
    torch.testing.assert_close(actual[0], batch_norm_step(*expected_args))


def counters_step(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    a.add_(1)
    b.add_(2)
    y = x * c  # reads c's old value after a's and b's writes, before c's
    c.add_(3)
    d.mul_(0.5)  # a write over another space: a kernel of its own
    return y


def test_independent_writes_into_inputs_share_one_kernel() -> None:
    """Writes into inputs whose values no kernel computes (a batch norm's
    `num_batches_tracked += 1`, one per batch norm) run in one kernel per iteration
    space, each still after every read of its old value: c's write may not move up to
    a's kernel, which runs before `x * c` reads c."""
    args = (
        torch.randn(3),
        torch.zeros((), dtype=torch.int64),
        torch.ones((), dtype=torch.int64),
        torch.full((), 2.0),
        torch.ones(3),
    )
    program = mutating_program(counters_step, args, "counters")
    schedule = schedule_program(program)
    writers = [k for k in schedule.kernels if any(m.mutates for m in k.members)]
    written = sorted(sorted(m.mutates for m in k.members if m.mutates) for k in writers)
    assert written == [["a_1", "b_1"], ["c_1"], ["d_1"]], written
    actual_args = [t.clone() for t in args]
    actual = run_schedule(schedule, actual_args)
    expected_args = [t.clone() for t in args]
    torch.testing.assert_close(actual[0], counters_step(*expected_args))
    for got, want in zip(actual_args, expected_args, strict=True):
        torch.testing.assert_close(got, want)


def test_channels_last_pointwise_runs_in_storage_order(
    lower: Callable[..., Program], schedule: Callable[..., Schedule]
) -> None:
    """A channels-last [N, C, H, W] output is iterated as [N, H, W, C]: the loop order
    follows the store's strides, so the loop merges into one contiguous range and
    neighbouring points store neighbouring elements (not 2*C bytes apart)."""
    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    b = torch.randn(8, 1, 1)

    def f(t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.relu(t * 2.0 + bias)

    (kernel,) = schedule(f, x, b).kernels
    (stored,) = [m for m in kernel.members if m.stored]
    assert kernel.ranges == (60, 8)  # [N*H*W, C]: C innermost, as stored
    assert str(stored.index) in ("8*i0 + i1", "i1 + 8*i0")
    program = lower(f, x, b)
    (actual,) = run_schedule(schedule_program(program), [x, b])
    torch.testing.assert_close(actual, f(x, b))


def test_a_shared_masked_score_is_a_prologue_read_once(
    lower: Callable[..., Program], schedule: Callable[..., Schedule]
) -> None:
    """Attention's math path adds a mask broadcast over the heads to the scores and
    reads the sum twice (softmax, and the all-masked check of safe softmax), so the
    sum is stored. Its loop stays [B, H, S*S] (the mask keeps B and H apart) while the
    softmax runs over [B*H*S] x [S]: the sum is still the softmax's prologue, mapped
    through the softmax's read of it, and the scores are read once."""

    def f(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = scores + mask
        return torch.softmax(a, -1), (a == float("-inf")).logical_not().any(-1)

    scores, mask = torch.randn(2, 3, 8, 8), torch.randn(2, 1, 1, 8)
    mask[1, 0, 0, :] = float("-inf")
    program = lower(f, scores, mask)
    (kernel,) = schedule_program(program).kernels
    stored = 2 * 3 * 8 * 8 * 4 + 2 * 3 * 8  # probabilities, flags
    assert kernel_bytes(kernel, program) == scores.numel() * 4 + mask.numel() * 4 + stored
    for actual, expected in zip(
        run_schedule(schedule_program(program), [scores, mask]), f(scores, mask), strict=True
    ):
        torch.testing.assert_close(actual, expected, equal_nan=True)


def test_a_prologue_that_maps_dimension_by_dimension_keeps_plain_indices(
    schedule: Callable[..., Schedule],
) -> None:
    """A per-row scale broadcast before a softmax: the product's loop is [rows, cols],
    the softmax's [rows] x [cols], so the scale is read at the row index, not through
    a floor and mod of the softmax's linear index."""

    def f(x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x * b  # stored: read twice
        return torch.softmax(a, -1), a + 1

    x, b = torch.randn(6, 40), torch.randn(6, 1)
    sched = schedule(f, x, b)
    (kernel,) = sched.kernels
    loads = [n for m in kernel.members for n in walk(m.body) if isinstance(n, Load)]
    assert {str(n.index) for n in loads if n.buffer == "b_1"} == {"i0"}
    for actual, expected in zip(run_schedule(sched, [x, b]), f(x, b), strict=True):
        torch.testing.assert_close(actual, expected)


def test_space_map_splits_a_partly_merged_loop_over_runs_of_kernel_dimensions() -> None:
    """A pointwise loop merged to [B*H*Q, K] (a broadcast operand kept K apart) maps
    onto a softmax kernel over [B*H, Q] x [K]: i0 -> i0*Q + i1, i1 -> r0 (the
    safe-softmax epilogue beside an index-built attention mask). Only for epilogues
    (`partial`): as prologues such maps split resnet50's batch-norm backward sums."""
    import sympy

    from ember.ir.symbolic import index_var
    from ember.scheduler.fusion import _space_map

    S = sympy.Integer
    i0, i1, r0 = index_var("i", 0), index_var("i", 1), index_var("r", 0)
    got = _space_map((S(98304), S(512)), (S(192), S(512)), (S(512),), partial=True)
    assert got == ({i0: 512 * i0 + i1, i1: r0}, True)
    assert _space_map((S(98304), S(512)), (S(192), S(512)), (S(512),)) is None  # a prologue
    got = _space_map((S(6), S(4)), (S(2), S(3)), (S(4),), partial=True)
    assert got == ({i0: 3 * i0 + i1, i1: r0}, True)
    assert _space_map((S(5), S(4)), (S(2), S(3)), (S(4),), partial=True) is None  # no run: 5
    assert _space_map((S(24),), (S(2), S(3)), (S(4),)) == ({i0: 12 * i0 + 4 * i1 + r0}, True)


def _masked_sum_plus_count(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0].sum() + x.nonzero().shape[0]


def test_nothing_runs_before_the_step_that_binds_a_data_dependent_size() -> None:
    """`nonzero`'s row count u1 is bound when nonzero returns. The pointwise sum that
    adds u1 to the masked sum fused into the reduction's kernel, which runs before
    nonzero: the wrapper read u1 before binding it (UnboundLocalError)."""
    gm = make_fx(_masked_sum_plus_count, tracing_mode="symbolic")(torch.randn(8))
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    sched = schedule_program(program)
    defined: dict[object, int] = {}
    for position, step in enumerate(sched.steps):
        if isinstance(step, ExternCall):
            names = step.node.outputs[0].free_symbols if step.node.outputs[0] else set()
            for symbol in {*names, *([step.node.symbol] if step.node.symbol else [])}:
                defined.setdefault(symbol, position)
    unbacked = set(defined) - program.size_symbols()
    assert len(unbacked) == 2  # the mask's count and nonzero's
    used = 0
    for position, step in enumerate(sched.steps):
        if isinstance(step, KernelStep):
            symbols = set(step.kernel.size_arguments()) & unbacked
            used += len(symbols)
            assert all(defined[s] < position for s in symbols), (step.name, symbols)
    assert used == 2


def _running_mean(x: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
    mean = x.mean(0)
    running.copy_(running * 0.9 + mean * 0.1)  # as AOTAutograd writes it back
    return x - mean


def test_a_write_into_an_input_joins_the_kernel_of_what_it_writes(
    lower: Callable[..., Program],
) -> None:
    """A batch norm's running statistics: the update of the input `running` is written
    by the kernel computing the mean (it reads `running` only at the element it
    writes), not by a kernel of its own."""
    args = (torch.randn(64, 8), torch.randn(8))
    program = lower(_running_mean, *[a.clone() for a in args])
    sched = schedule_program(program)
    writers = [k for k in sched.kernels if any(m.mutates for m in k.members)]
    assert len(writers) == 1 and any(m.kind == "reduction" for m in writers[0].members)
    assert len(sched.kernels) == 2  # the mean with the write, then x - mean
    expected_args = [a.clone() for a in args]
    expected = _running_mean(*expected_args)
    got_args = [a.clone() for a in args]
    (got,) = run_schedule(sched, got_args)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_args[1], expected_args[1])  # the input, updated


def _read_then_write(x: torch.Tensor, running: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mean = x.mean(0)
    spread = running.flip(0) * 2.0  # reads every element of the old value
    running.copy_(mean)
    return spread, mean


def test_a_write_stays_alone_where_a_later_kernel_reads_the_old_value(
    lower: Callable[..., Program],
) -> None:
    """`spread` reads `running` at other elements than the ones the write stores, in a
    kernel of its own after the mean's: the write may not move up into the mean's
    kernel, ahead of that read."""
    args = (torch.randn(64, 8), torch.randn(8))
    program = lower(_read_then_write, *[a.clone() for a in args])
    sched = schedule_program(program)
    expected_args = [a.clone() for a in args]
    expected = _read_then_write(*expected_args)
    got_args = [a.clone() for a in args]
    got = run_schedule(sched, got_args)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(got_args[1], expected_args[1])
