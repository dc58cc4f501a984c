"""The entry point: one `FusedKernel` in, one `TritonKernel` (source + launch
metadata) out.

`render_kernel` plans the tiling (ember.codegen.triton.plan), renders the bodies
(body, pointwise, reduction), and assembles a self-contained module: imports, the
helpers the kernel uses, and the @triton.jit function named after the kernel (its
name says what it fuses). It compiles nothing and touches no device, so it is cheap
to call and to test; the runtime writes the source to a file, imports it, picks a
config among `configs` and launches with `grid`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ember.codegen.triton.body import BodyRenderer, Scope
from ember.codegen.triton.gemm import GEMM, gemm_configs, plan_gemm, render_gemm
from ember.codegen.triton.helpers import helper_source
from ember.codegen.triton.lookback import setup_lookback_axes
from ember.codegen.triton.plan import (
    LOOKBACK_SCAN,
    POINTWISE,
    POINTWISE_2D,
    SCANS,
    SCATTER,
    SORT,
    GridSpec,
    LaunchConfig,
    candidate_configs,
    plan_kernel,
)
from ember.codegen.triton.pointwise import render_pointwise, render_scatter
from ember.codegen.triton.printer import UnsupportedKernelError, sanitize
from ember.codegen.triton.reduction import ReductionRenderer
from ember.codegen.triton.regroup import split_divided_variables
from ember.codegen.triton.scan import ScanRenderer
from ember.codegen.triton.skeleton import decorator, parameters, setup_axes
from ember.codegen.triton.sort import SortRenderer
from ember.codegen.triton.special import FULL_RANGE_HELPERS
from ember.scheduler import FusedKernel, KernelMember

# Triton compile options of kernels with index checks (see TritonKernel).
CHECKED_OPTIONS: tuple[tuple[str, bool], ...] = (("debug", True), ("sanitize_overflow", False))
# Triton compile options of kernels using FULL_RANGE_HELPERS: libdevice keeps subnormals.
FULL_RANGE_OPTIONS: tuple[tuple[str, bool], ...] = (("enable_reflect_ftz", False),)


@dataclass(frozen=True)
class TritonKernel:
    """A rendered kernel and what launching it takes.

    Launch: `fn[grid(config, sizes)](*buffers, *sizes, *bounds, **config blocks,
    num_warps=..., num_stages=...)` where `fn` is `function_name` in the module made
    from `source`, buffers follow `buffer_arguments` (storage base pointers), sizes follow
    `size_arguments`, and `bounds_arguments` (debug mode) are the storage sizes, in
    elements, of those buffers. `launch_options` go with every launch and compile of
    it: a kernel with index checks (`index_checks`: what each `tl.device_assert`
    checks, by the number its message starts with) needs Triton's `debug` for its
    asserts to be compiled in, without `sanitize_overflow`, which would also assert on
    32-bit integer arithmetic that wraps on purpose (and wraps in eager). A kernel
    calling one of `FULL_RANGE_HELPERS` compiles libdevice without flushing subnormals
    to zero (Triton's default flushes them; eager's kernels keep them, and a float32
    zeta term that is subnormal decides whether the sum is finite).
    """

    name: str
    function_name: str
    source: str
    kind: str
    buffer_arguments: tuple[str, ...]
    buffer_dtypes: tuple[torch.dtype, ...]  # element type of each buffer argument
    size_arguments: tuple[str, ...]
    bounds_arguments: tuple[str, ...]
    reads: tuple[str, ...]  # buffers the kernel reads
    written: tuple[str, ...]  # buffers the kernel writes (outputs and mutated targets)
    grid: GridSpec
    configs: tuple[LaunchConfig, ...]
    index_type: str
    index_checks: tuple[tuple[str, int], ...] = ()  # (op and graph node, dimension)
    launch_options: tuple[tuple[str, bool], ...] = ()
    workspace: int = 0  # int64 words per program of the launcher's workspace (see below)

    @property
    def idempotent(self) -> bool:
        """Running it twice leaves memory as running it once (no buffer is both read
        and written, no atomics), so configs may be timed on the real arguments. The
        runtime also checks that the tensors it passes do not alias."""
        return self.kind != SCATTER and not set(self.reads) & set(self.written)

    def launch_grid(self, config: LaunchConfig, sizes: Mapping[str, int]) -> tuple[int, int, int]:
        return self.grid(config, sizes)


def render_kernel(
    kernel: FusedKernel, *, debug: bool = False, reduction: str | None = None
) -> TritonKernel:
    """Render `kernel`. `debug` adds bounds checks on indirect accesses;
    `reduction` forces 'persistent' or 'looped' for reduction kernels.

    The source names buffers by position (`a0_ptr`, ...) and the function by what it
    fuses without the kernel's number (`red_var_mean_add`), so the kernels of a layer
    repeated twelve times render to one source, which the runtime compiles once."""
    positional = _positional(kernel)  # rendered; the launch contract keeps real names
    if kernel.matmul is not None:
        plan = plan_gemm(positional)
        configs = gemm_configs(positional, plan)
    else:
        plan = plan_kernel(positional, reduction=reduction)
    if plan.kind == POINTWISE:
        # the same points in the same order, with indices Triton can vectorize
        # (ember.codegen.triton.regroup); kept only where the tiling stays 1-D
        split = split_divided_variables(positional)
        if split is not positional:
            split_plan = plan_kernel(split)
            if split_plan.kind == POINTWISE:
                positional, plan = split, split_plan
    body = BodyRenderer(positional, plan, debug=debug)
    scope = Scope()
    if plan.kind == GEMM:
        render_gemm(positional, plan, body, scope, configs)
    elif plan.kind == LOOKBACK_SCAN:
        setup_lookback_axes(plan, body.printer, scope)
        configs = candidate_configs(kernel, plan)
    else:
        setup_axes(plan, body.printer, scope)
        configs = candidate_configs(kernel, plan)
    if plan.kind in (POINTWISE, POINTWISE_2D):
        render_pointwise(positional, body, scope)
    elif plan.kind == SCATTER:
        render_scatter(positional, body, scope)
    elif plan.kind in SCANS:
        ScanRenderer(positional, plan, body).render(scope)
    elif plan.kind == SORT:
        SortRenderer(positional, plan, body).render(scope)
    elif plan.kind != GEMM:
        ReductionRenderer(positional, plan, body).render(scope)
    function = re.sub(r"^k\d+_", "", sanitize(kernel.name)) or "kernel"
    params = parameters(positional, plan, body.bounds_checked)
    header = ["import triton", "import triton.language as tl"]
    helpers = helper_source({h for h in body.helpers if h != "libdevice"})
    if "libdevice" in body.helpers or "libdevice." in helpers:  # a helper may call it too
        header.append("from triton.language.extra import libdevice")
    doc = f'    """{_summary(positional, plan.kind)}"""'
    source = "\n".join(
        [
            *header,
            helpers,
            "",
            decorator(positional, body.bounds_checked, debug),
            f"def {function}({', '.join(params)}):",
            doc,
            *scope.lines,
            "",
        ]
    )
    by_position = dict(zip(positional.buffer_arguments(), kernel.buffer_arguments(), strict=True))
    written = [m.mutates or m.name for m in kernel.members if m.stored or m.mutates]
    return TritonKernel(
        name=kernel.name,
        function_name=function,
        source=source,
        kind=plan.kind,
        buffer_arguments=kernel.buffer_arguments(),
        buffer_dtypes=kernel.buffer_dtypes(),
        size_arguments=tuple(s.name for s in kernel.size_arguments()),
        bounds_arguments=tuple(by_position[b] for b in body.bounds_checked),
        reads=kernel.inputs,
        written=tuple(dict.fromkeys(written)),
        grid=plan.grid,
        configs=configs,
        index_type=plan.index_type,
        index_checks=tuple((c.describe(), c.dim) for c in body.index_checks),
        launch_options=(CHECKED_OPTIONS if body.index_checks else ())
        + (FULL_RANGE_OPTIONS if FULL_RANGE_HELPERS & body.helpers else ()),
        workspace=len(positional.members) if plan.kind == LOOKBACK_SCAN else 0,
    )


def _positional(kernel: FusedKernel) -> FusedKernel:
    """`kernel` with its buffers named by argument position and its kernel-local
    members by member position."""
    names = {b: f"a{i}" for i, b in enumerate(kernel.buffer_arguments())}
    for j, m in enumerate(kernel.members):
        names.setdefault(m.name, f"local{j}")
    return kernel.renamed(names)


def _summary(kernel: FusedKernel, kind: str) -> str:
    members = ", ".join(
        f"{m.name}={m.reduction or m.scan or _sort(m) or m.kind}" + ("" if m.stored else " (local)")
        for m in kernel.members
    )
    ranges = " x ".join(str(r) for r in kernel.ranges) or "1"
    inner = " x ".join(str(r) for r in kernel.reduction_ranges)
    space = f"[{ranges}]" + (f" over [{inner}]" if inner else "")
    return f"{kind} {space}: {members}"


__all__ = ["TritonKernel", "UnsupportedKernelError", "render_kernel"]


def _sort(member: KernelMember) -> str | None:
    if member.sort is None:
        return None
    order = "descending" if member.sort.descending else "ascending"
    return f"{'argsort' if member.sort.indices else 'sort'} {order} first {member.sort.count}"
