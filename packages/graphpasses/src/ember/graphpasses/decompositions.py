"""The decomposition table ember lowers from.

AOTAutograd and `torch.export(...).run_decompositions` apply this table while tracing,
so the graphs that reach the IR contain only the ops left over: the list in
`ember.graphpasses.remaining_ops`, which a test recomputes from this table. The table is
torch's core ATen decomposition set, minus the ops ember prefers to see whole
(`KEEP_WHOLE`, with the reason), plus ember's own additions (`EMBER_ADDITIONS`, with the
reason), all taken from torch's registered decompositions.

`aot_decompositions()` is the same table less its CompositeImplicitAutograd entries, for
AOTAutograd and make_fx, which decompose those ops themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._decomp
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

# Ops torch would (or, in some version, might) decompose that ember keeps as one op,
# and why. The core set already keeps what ember calls as ATen externs on purpose (mm,
# addmm, bmm, convolution), and most of what it decomposes is cheaper for ember as
# pointwise and reduction ops the scheduler can fuse; attention is the exception, and
# batch norm's backward and max pooling, which the IR lowers to those same reductions
# and pointwise ops itself.
KEEP_WHOLE: dict[torch._ops.OpOverloadPacket, str] = {
    aten._scaled_dot_product_flash_attention_for_cpu: (
        "attention stays one fused ATen kernel; and torch 2.15's decomposition of this op "
        "gave wrong gradients on CPU (off by ~40x on plain SDPA; tests/stack/"
        "test_attention_gradients.py)"
    ),
    aten.native_batch_norm_backward: (
        "the IR lowers it whole (ember.ir.norms: two per-channel sums, one pointwise "
        "pass); decomposed, AOTAutograd traced ~20 ops per batch norm, which took 4.2 s "
        "of resnet18's 13.9 s training trace (cProfile, warm compile on the 2-core CPU)"
    ),
    **dict.fromkeys(
        (
            aten.max_pool2d_with_indices,
            aten.max_pool3d_with_indices,
            aten.adaptive_max_pool2d,
            aten.adaptive_max_pool3d,
            aten.max_pool2d_with_indices_backward,
            aten.max_pool3d_with_indices_backward,
            aten.adaptive_max_pool2d_backward,
            aten.adaptive_max_pool3d_backward,
        ),
        "the IR lowers max pooling and its backward whole (ember.ir.pooling, "
        "ember.ir.pool_gradients), on every torch: torch 2.11 has no decomposition of "
        "the 3d pools and the 2d backward, so they failed strict CUDA compiles while "
        "torch 2.15's (a scatter-add for the backward) ran on the CPU; listed so that "
        "no torch version's table decomposes them",
    ),
}

# Ops the core set leaves whole that ember decomposes, and why. Not the other batch
# norm spellings (`native_batch_norm`, `_native_batch_norm_legit[_no_training]`): their
# decompositions go through the in-place `_native_batch_norm_legit`, which AOTAutograd
# rejects in its functional graphs; the IR lowers inference batch norm directly.
EMBER_ADDITIONS: dict[torch._ops.OpOverloadPacket, str] = {
    aten._native_batch_norm_legit_functional: (
        "training batch norm after functionalisation is not a core op and the core set "
        "has no decomposition for it; as mean/var/pointwise it fuses with the activation. "
        "ember.ir lowers it whole too, but kept whole, resnet18's GPU forward schedule "
        "took 3 more kernels and 29% more bytes (the partitioner saves other values)"
    ),
    aten.native_layer_norm: "layer norm as reductions + pointwise fuses with residual adds",
    aten.native_group_norm: "group norm as reductions + pointwise, same reason",
    # Found by the OpInfo sweep without fallbacks: ops that reached the IR whole and
    # whose torch decompositions are ops it lowers (they fuse instead of an ATen call).
    aten.dist: "the norm of a difference: a reduction over a pointwise body",
    aten.grid_sampler_2d: "bilinear/nearest sampling as indirect loads and pointwise math",
    aten.linalg_vector_norm: (
        "torch 2.11's core set leaves it whole (2.15 decomposes it): a reduction over a "
        "pointwise body; found by the CUDA sweep (normalize, norm, cosine_similarity)"
    ),
}


Table = dict[torch._ops.OperatorBase, Callable[..., Any]]


def ember_decompositions() -> Table:
    """Return a fresh copy of the table (callers may add to it)."""
    return _ember_table(dict(core_aten_decompositions()))


def aot_decompositions() -> Table:
    """The table for AOTAutograd and make_fx: `ember_decompositions()` less the entries
    those tracers can never use, a fresh copy.

    Torch's core table maps every CompositeImplicitAutograd op to its decomposition,
    and lists the ~500 of them by walking every operator registered with the
    dispatcher (`_materialize_cpp_cia_ops`): `ember_decompositions()` took 0.35-0.41 s
    of a fresh process's first compile on the H100 machine (cold_timeline.py). A
    tracer below autograd sees such an op whole only where autograd would not have
    decomposed it, that is where the op also has a CPU or CUDA kernel (or autograd is
    off, as under inference mode); otherwise the op decomposes itself, to the same
    ops. So this table keeps, of those entries, only the ops that also have a CPU or
    CUDA kernel (nearest-neighbour upsampling, channel shuffle): found without the
    walk, from the dispatcher's list of composite registrations and the Python
    composite kernels of torch's decompositions. The first OpInfo sample of every op
    (1818 traces: with and without gradients, and under inference mode) traces the
    same graphs with either table (torch 2.15). `torch.export`'s `run_decompositions`
    sees ops above autograd and uses the full table. On a torch without the private
    helpers this builds from, it is the full table."""
    try:
        from torch._export.utils import _get_decomp_for_cia, _is_preservable_cia_op
        from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS

        table: Table = dict(torch._decomp._core_aten_decompositions_post_autograd())
        for op in _composites_with_kernels():
            if op not in table and op not in PRESERVED_ATEN_CIA_OPS and _is_preservable_cia_op(op):
                table[op] = _get_decomp_for_cia(op)
    except (ImportError, AttributeError):
        return ember_decompositions()
    return _ember_table(table)


_DEVICE_KEYS = ("CPU", "CUDA")  # the devices ember compiles for


def _composites_with_kernels() -> list[torch._ops.OpOverload]:
    """ATen ops with a CompositeImplicitAutograd kernel (C++ or Python) that also have a
    CPU or CUDA kernel. The devices' registrations are read as two lists, once: asking
    the dispatcher op by op (about 1500 calls) took 4 ms of each compile on the 2-core
    CPU, the lists take under 2."""
    with_kernel: set[str] = set()
    for key in _DEVICE_KEYS:
        with_kernel.update(torch._C._dispatch_get_registrations_for_dispatch_key(key))

    found: list[torch._ops.OpOverload] = []
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"):
        namespace, _, qualified = name.partition("::")
        if namespace != "aten" or name not in with_kernel:
            continue
        op_name, _, overload = qualified.partition(".")
        packet = getattr(torch.ops.aten, op_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if isinstance(op, torch._ops.OpOverload):
            found.append(op)
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    for op in torch._decomp.decomposition_table:
        if (
            isinstance(op, torch._ops.OpOverload)
            and composite in op.py_kernels
            and op.name() in with_kernel  # type: ignore[no-untyped-call]  # torch stub
        ):
            found.append(op)
    return found


def _ember_table(table: Table) -> Table:
    """Torch's core `table`, less KEEP_WHOLE, plus EMBER_ADDITIONS."""
    for op in list(table):
        packet = getattr(op, "overloadpacket", None)
        if packet is not None and packet in KEEP_WHOLE:
            del table[op]
    for op, fn in get_decompositions(list(EMBER_ADDITIONS)).items():
        if isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable:
            continue  # out= variants: AOTAutograd graphs never contain them
        table[op] = fn
    return table
