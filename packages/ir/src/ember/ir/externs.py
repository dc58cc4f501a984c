"""The ops that stay ATen calls on purpose (intentional externs), by reason.

Lowering makes every op with an entry in ember.ir.lowering.LOWERINGS a loop node; an
op listed here stays an `ExternKernel` by design and is not a fallback (no log line, no
error under EMBER_FALLBACK=0), and so does any op on a complex tensor (the loop IR has
real dtypes only), and the effectful ops of this list that AOTAutograd wraps in
`with_effects` (linalg's error checks). Everything else without a lowering is a
fallback. `python -m ember.ir.coverage` counts the overloads of each category.
"""

from __future__ import annotations

import contextlib
import importlib

import torch

aten = torch.ops.aten

# Ops that stay ATen calls by design, and why. Each is a library routine that generated
# loops would not beat or cannot express; everything else without a lowering is a
# fallback (logged, and an error under EMBER_FALLBACK=0). Not listed, because a rule
# covers them (`_has_complex` in ember.ir.lowering): ops with a complex input or result
# (view_as_complex, polar, complex, conj_physical, the complex `_to_copy` and views of
# the FFT ops' results), since the loop IR has real dtypes only.
_EXTERN_GROUPS: dict[str, tuple[str, ...]] = {
    # vendor BLAS/cuBLAS/oneDNN kernels beat generated loops
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addbmm",
               "_scaled_mm", "_int_mm", "_cdist_forward", "_weight_int8pack_mm"),
    # (but 2-d depthwise ones, memory-bound, are lowered: ember.ir.depthwise)
    "convolution": ("convolution", "convolution_backward", "_convolution"),
    "attention": (
        *(
            f"_scaled_dot_product_{kind}{suffix}"
            for kind in ("flash_attention", "efficient_attention", "cudnn_attention",
                         "flash_attention_for_cpu")
            for suffix in ("", "_backward")
        ),
        "_flash_attention_forward", "_efficient_attention_forward",  # the kernels under them
    ),
    # LAPACK/cuSOLVER factorizations and solvers: iterative, pivoting, not loop nests
    "linalg": ("cholesky", "linalg_cholesky_ex", "linalg_eig", "_linalg_eigh", "linalg_inv_ex",
               "linalg_ldl_factor_ex", "linalg_ldl_solve", "linalg_lstsq", "linalg_lu",
               "linalg_lu_factor_ex", "linalg_lu_solve", "linalg_matrix_exp", "linalg_qr",
               "linalg_solve_triangular", "linalg_householder_product", "_linalg_svd",
               "_linalg_solve_ex", "_linalg_slogdet", "_linalg_det", "_linalg_check_errors",
               "cholesky_solve", "cholesky_inverse", "triangular_solve", "geqrf", "ormqr",
               "lu_unpack", "linalg_pinv", "linalg_polar", "linalg_matrix_sqrth"),
    # FFT libraries (pocketfft, cuFFT); complex results are outside the loop IR
    "fft": ("_fft_r2c", "_fft_c2c", "_fft_c2r"),
    # selection and searching not yet lowered (sort, topk and the median of all
    # elements are: ember.ir.sort; listed here, `median` covers its per-dim form)
    "selection": ("kthvalue", "median", "nanmedian", "mode", "searchsorted", "bucketize",
                  "_unique2", "unique_consecutive", "unique_dim"),
    # results whose size depends on the data: the IR's sizes are known before running;
    # nonzero_static's fill order follows the data as nonzero's does
    "data_dependent": ("nonzero", "masked_select", "nonzero_static"),
    # histograms: bin edges from the data's own min and max (a reduction before the
    # counting pass) and counts by scatter-adds that collide on every repeated bin; the
    # ATen kernels do both in one pass per thread with private counts
    "histogram": ("histc", "histogram", "_histogramdd_bin_edges", "_histogramdd_from_bin_cts",
                  "_histogramdd_from_bin_tensors"),
    # ragged segments whose extents are data (lengths or offsets): a reduction over
    # data-dependent ranges, which the IR's loop ranges (known before running) cannot say
    "segments": ("segment_reduce", "_segment_reduce_backward"),
    # an xor of the elements' raw bit patterns as uint64: the IR has no bit casts, no
    # xor reduction and no uint64 arithmetic
    "bits": ("hash_tensor",),
}  # fmt: skip
# torch.nn's linear + cross entropy (custom ops of the `torch_nn` namespace): they exist
# to run the vocabulary matmul in chunks of the batch so that the whole logits tensor
# never exists; a lowering would materialise it, and the chunks are BLAS matmuls, as
# the "matmul" group. Absent from torch builds before they were added.
CHUNKED_LOSSES: tuple[str, ...] = (
    "_linear_cross_entropy_batch_chunked",
    "_linear_cross_entropy_batch_chunked_no_reduction",
)
# torch.distributed's functional collectives: calls into a process group by design
# (the issue returns at once, `wait_tensor` waits; ember.scheduler.collectives orders
# them for overlap). Absent where torch is built without distributed.
COMMUNICATION: tuple[str, ...] = (
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
    "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out",
    "all_to_all_single", "broadcast", "broadcast_", "wait_tensor", "wait_tensors",
)  # fmt: skip


# oneDNN's linear with post-ops (ember.graphpasses.cpu_linear puts it in CPU graphs);
# absent where torch is built without oneDNN
ONEDNN: tuple[str, ...] = ("_linear_pointwise",)


def _onednn_ops() -> list[torch._ops.OpOverloadPacket]:
    found = []
    for name in ONEDNN:
        with contextlib.suppress(AttributeError, RuntimeError):
            found.append(getattr(torch.ops.mkldnn, name))
    return found


def _chunked_loss_ops() -> list[torch._ops.OpOverloadPacket]:
    found = []
    with contextlib.suppress(ImportError):
        # registers the ops where torch has them (2.15; not 2.11). Imported by name:
        # an `import torch.nn...` statement would make `torch` a local of this function
        importlib.import_module("torch.nn.modules.linear_cross_entropy")
    for name in CHUNKED_LOSSES:
        with contextlib.suppress(AttributeError, RuntimeError):
            found.append(getattr(torch.ops.torch_nn, name))
    return found


def _communication_ops() -> list[torch._ops.OpOverloadPacket]:
    found = []
    for name in COMMUNICATION:
        with contextlib.suppress(AttributeError, RuntimeError):
            found.append(getattr(torch.ops._c10d_functional, name))
    return found


INTENTIONAL_EXTERNS: frozenset[torch._ops.OpOverloadPacket] = frozenset(
    [
        *(
            getattr(aten, name)
            for names in _EXTERN_GROUPS.values()
            for name in names
            if hasattr(aten, name)
        ),
        *_communication_ops(),
        *_onednn_ops(),
        *_chunked_loss_ops(),
    ]
)
