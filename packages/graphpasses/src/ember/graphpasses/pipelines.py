"""The pipelines ember runs: what, in which order, and why.

`default_pipeline` is what the runtime runs on every graph AOTAutograd gives it
(forward, backward, inference), so every pass in it keeps values (up to floating-point
rounding in the pattern rewrites and the oneDNN linears), keeps mutation epilogues and
random ops, and adds only ops the IR lowers or runs as intentional externs:

1. view normalisation: one spelling per view, so patterns and CSE see equal things equal;
2. no-op removal: drops same-shape views/expands, identity arithmetic, redundant casts;
3. pattern rewrite: attention -> SDPA, tanh GELU -> gelu, mm/bmm + bias -> addmm/baddbmm
   (runs after 1-2 because patterns are matched in that canonical form);
4. permute composition (after the patterns: they spell `k^T` as a permute of `k`);
5. padding of matmuls, layouts and biases of convolutions;
6. CPU matmuls as oneDNN linears with the bias and an activation in their output pass,
   where the caller's `cpu_linear_prefer` says so (after the patterns, which make addmm);
7. common subexpression elimination;
8. constant folding (results up to `max_constant_elements` only);
9. dead code elimination, last, to sweep what the others left unused (the matmuls and
   activations the linears replaced among them).

The export passes are not in it: they change a program's interface (guards, call
signatures, assertions) and are chosen by whoever prepares an exported program.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ember.graphpasses.channels_last import channels_last_convolutions
from ember.graphpasses.constant_folding import DEFAULT_MAX_ELEMENTS, fold_constants
from ember.graphpasses.conv_bias import convolution_bias_epilogue
from ember.graphpasses.cpu_linear import Prefer, cpu_linear
from ember.graphpasses.cse import eliminate_common_subexpressions
from ember.graphpasses.dce import eliminate_dead_code
from ember.graphpasses.manager import PassManager
from ember.graphpasses.noop_removal import remove_noops
from ember.graphpasses.pad_matmul import pad_matmul
from ember.graphpasses.patterns import DEFAULT_PATTERNS
from ember.graphpasses.rewrite import rewrite_patterns
from ember.graphpasses.view_normalisation import compose_permutes, normalise_views


def default_pipeline(
    *,
    dump_dir: Path | str | None = None,
    patterns: bool = True,
    max_constant_elements: int = DEFAULT_MAX_ELEMENTS,
    layout_devices: Sequence[str] = ("cuda",),
    cpu_linear_prefer: Prefer | None = None,
    layout_by_convolution: Sequence[str] = (),
) -> PassManager:
    """The passes the runtime runs on every graph before lowering. Convolution graphs
    on `layout_devices` run channels-last, and on `layout_by_convolution` each
    convolution in the layout its shapes favour; CUDA convolutions' biases become fusable
    adds whatever the layout (CPU kernels add the bias inside the convolution). CPU
    matmuls become oneDNN linears where `cpu_linear_prefer` (if given) prefers them."""
    passes = [normalise_views, remove_noops]
    if patterns:
        passes.append(rewrite_patterns(DEFAULT_PATTERNS))
    passes += [
        compose_permutes,
        pad_matmul(),
        channels_last_convolutions(layout_devices, by_convolution=layout_by_convolution),
        convolution_bias_epilogue(),
        *([cpu_linear(cpu_linear_prefer)] if cpu_linear_prefer is not None else []),
        eliminate_common_subexpressions,
        fold_constants(max_constant_elements),
        eliminate_dead_code,
    ]
    return PassManager(passes, name="default", dump_dir=dump_dir)
