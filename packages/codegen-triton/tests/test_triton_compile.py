"""Rendered kernels compile with the real Triton compiler for an H100 (sm_90).

No GPU is needed: Triton's CUDA backend ships ptxas, so `triton.compile` runs from
source to cubin on the CPU. This catches what the interpreter does not check (types
the compiler rejects, constexpr misuse, layouts). Skipped where the compiler entry
points differ.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import render_kernel

triton = pytest.importorskip("triton")
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - other Triton versions
    pytest.skip("triton.compile entry points differ in this Triton", allow_module_level=True)

_POINTER = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int64: "*i64",
    torch.bool: "*i1",
    torch.float64: "*fp64",
    torch.float16: "*fp16",
    torch.int8: "*i8",
    torch.int16: "*i16",
}


def _load_jit(rendered: Any) -> Any:
    """The @triton.jit function of a rendered kernel, imported from a file of its own
    (Triton's jit reads real source files)."""
    import importlib.util

    path = Path(tempfile.mkdtemp()) / f"{rendered.function_name}.py"
    path.write_text(rendered.source)
    spec = importlib.util.spec_from_file_location(rendered.function_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, rendered.function_name)


def _compile(fn: Any, *args: Any, debug: bool = False, **render: Any) -> str:

    kernels = fused_kernels(fn, *args)
    dtypes = {f"{n}_1": a.dtype for n, a in zip("xyzwvu", args, strict=False)}
    kinds = []
    for kernel in kernels:
        for m in kernel.members:
            dtypes[m.name] = m.layout.dtype
        rendered = render_kernel(kernel, debug=debug, **(render if kernel.is_reduction else {}))
        jit = _load_jit(rendered)
        types = [_POINTER[dtypes.get(b, torch.int64)] for b in rendered.buffer_arguments]
        types += ["i64"] * (len(rendered.size_arguments) + len(rendered.bounds_arguments))
        types += ["*i64"] * bool(rendered.workspace)  # a look-back scan's workspace
        names = jit.arg_names
        signature = dict(zip(names, types + ["constexpr"] * (len(names) - len(types)), strict=True))
        config = rendered.configs[0]
        source = ASTSource(jit, signature, constexprs=dict(config.blocks))
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages, "debug": debug}
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        assert compiled.asm["cubin"]
        kinds.append(rendered.kind)
    return "+".join(kinds)


def _index_reduce(reduce: str) -> Any:
    return lambda x, y, z: x.index_reduce(0, y, z, reduce)


def _x(*shape: int) -> torch.Tensor:
    return randn(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("name", "fn", "args", "options"),
    [
        ("softmax", lambda x: torch.softmax(x.float(), -1), (_x(64, 4096),), {}),
        (
            "softmax_looped",
            lambda x: torch.softmax(x, -1),
            (_x(64, 4096),),
            {"reduction": "looped"},
        ),
        ("welford", lambda x: torch.var_mean(x.float(), -1), (_x(16, 1000),), {}),
        ("argmax", lambda x: x.argmax(-1), (_x(16, 20000),), {}),
        ("column_sum", lambda x: x.sum(0), (_x(5000, 64),), {}),
        ("transpose", lambda x: x.t().contiguous(), (_x(256, 128),), {}),
        ("gelu", lambda x: torch.nn.functional.gelu(x), (_x(1000),), {}),
        ("dropout", lambda x: torch.ops.aten.native_dropout(x, 0.2, True)[0], (randn(64),), {}),
        (
            "embedding",
            lambda x, y: torch.nn.functional.embedding(y, x),
            (randn(10, 16), torch.tensor([1, 2])),
            {"debug": True},
        ),
        ("cumsum", lambda x: x.float().cumsum(-1), (_x(64, 512),), {}),
        ("cumsum_looped", lambda x: x.cumsum(-1), (randn(8, 10000),), {}),
        ("cumsum_columns", lambda x: x.cumsum(0), (randn(3000, 64),), {}),
        ("cummax", lambda x: torch.cummax(x, -1), (_x(16, 5000),), {}),
        ("cummin_bool", lambda x: torch.cummin(x > 0, -1), (randn(16, 500),), {}),
        ("logcumsumexp", lambda x: torch.logcumsumexp(x, -1), (randn(16, 3000),), {}),
        ("cumsum_int", lambda x: (x > 0).cumsum(-1), (randn(16, 300),), {}),
        # one-pass look-back scans: the ticket, the published words, the look-back loop
        ("cumsum_lookback", lambda x: x.cumsum(-1), (_x(3, 40000),), {}),
        (
            "scans_lookback",
            lambda x: (x.cumsum(1), x.cumprod(1), torch.logcumsumexp(x, 1)),
            (randn(2, 40000, dtype=torch.float16),),
            {},
        ),
        ("sort", lambda x: torch.sort(x, -1), (_x(16, 1024),), {}),
        ("sort_descending_bf16", lambda x: torch.sort(x, 0, descending=True), (_x(300, 8),), {}),
        ("topk", lambda x: torch.topk(x, 5, -1), (randn(64, 100),), {}),
        ("argsort_bool", lambda x: torch.argsort(x > 0, dim=-1), (randn(16, 33),), {}),
        ("sort_int64", lambda x: torch.sort((x * 9).long(), -1), (randn(8, 7),), {}),
        # the special functions' per-block loops (while any lane needs a step), the
        # order-dependent branch of polygamma and the dtype-dependent constants
        (
            "special_loops",
            lambda x, y: (
                torch.special.airy_ai(x),
                torch.polygamma(3, x),
                torch.special.zeta(x, y),
                torch.special.chebyshev_polynomial_w(x, y),
                torch.special.shifted_chebyshev_polynomial_u(x, y),
                torch.special.hermite_polynomial_h(x, y),
                torch.special.laguerre_polynomial_l(x, y),
                torch.special.legendre_polynomial_p(x, y),
            ),
            (randn(64), randn(64)),
            {},
        ),
        ("special_float64", lambda x: torch.special.airy_ai(x), (randn(64).double(),), {}),
        # the incomplete gamma functions: three float64 loops per block, libdevice in
        # float64, bfloat16 values in and out
        (
            "igamma",
            lambda a, x: (torch.igamma(a, x), torch.igammac(a, x)),
            (_x(64).abs(), _x(64).abs()),
            {},
        ),
        # one element: the loads are 0-d values, and a block-wide loop condition must
        # still reduce over a dimension (Triton 3.6 rejects a reduction of a 0-d value)
        (
            "special_loops_0d",
            lambda x, y: (torch.special.zeta(x, y), torch.special.chebyshev_polynomial_t(x, y)),
            (randn(), randn()),
            {},
        ),
        (
            "scatter",
            lambda x, y, z: x.index_add(0, y, z),
            (randn(10, 8), torch.tensor([1, 1]), randn(2, 8)),
            {},
        ),
        # the compare-and-swap loops: on the element (32 and 64 bits) and on the 32-bit
        # word holding it (8 and 16 bits)
        *(
            (
                f"scatter_{reduce}_{str(dtype)[6:]}",
                _index_reduce(reduce),
                (randn(10, 8).to(dtype), torch.tensor([1, 1, 3]), randn(3, 8).to(dtype)),
                {},
            )
            for reduce, dtype in [
                ("prod", torch.bfloat16),
                ("amax", torch.float16),
                ("amin", torch.float32),
                ("prod", torch.float64),
                ("prod", torch.int8),
                ("amax", torch.int16),
            ]
        ),
    ],
)
def test_compiles_for_sm90(name: str, fn: Any, args: tuple[Any, ...], options: Any) -> None:
    assert _compile(fn, *args, **options)


def test_look_back_reads_published_words_past_the_l1_cache() -> None:
    """The look-back's reads are volatile (each poll reaches the L2 cache, where other
    programs' words land), the ticket is one 64-bit atomic add, the tile's loads and
    stores 16 bytes at a time."""
    (kernel,) = fused_kernels(lambda x: x.cumsum(0), randn(1 << 20, dtype=torch.bfloat16))
    rendered = render_kernel(kernel)
    assert rendered.kind == "lookback_scan"
    jit = _load_jit(rendered)
    types = ["*bf16", "*bf16", "*i64", "constexpr", "constexpr"]
    signature = dict(zip(jit.arg_names, types, strict=True))
    config = rendered.configs[0]
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(2)}  # as the runtime says
    source = ASTSource(jit, signature, constexprs=dict(config.blocks), attrs=aligned)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    assert "ld.volatile.global.b64" in ptx
    assert ptx.count("atom.global.gpu.relaxed.add.u64") == 1
    assert ptx.count("atom.global.gpu.relaxed.exch.b64") == 2  # the aggregate, the prefix
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx


def _attention_output(x: torch.Tensor) -> torch.Tensor:
    """Attention's output back to [batch, sequence, heads * head_dim] in bf16 (BERT's
    math-SDPA path: a [B, H, S, D] float32 bmm result, transposed and merged)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).to(torch.bfloat16)


def test_merged_head_copy_loads_16_bytes_at_a_time() -> None:
    """[B, H, S, D] -> [B, S, H*D] with H*D = 768 (not a power of two): the store's
    last variable (range 768) is split into heads and head_dim for the load, so the
    index has no `% 768` followed by `// 64` and `% 64`, which Triton cannot see
    through (it loaded one float32 at a time: 8 x ld.global.b32 per thread)."""
    import re

    (kernel,) = fused_kernels(_attention_output, randn(2, 12, 16, 64))
    rendered = render_kernel(kernel)
    assert rendered.kind == "pointwise"
    assert "[2 x 16 x 12 x 64]" in rendered.source
    (load,) = [line for line in rendered.source.splitlines() if "tl.load" in line]
    assert "//" not in load and "%" not in load
    jit = _load_jit(rendered)
    types = ["*fp32", "*bf16"]
    signature = dict(zip(jit.arg_names, [*types, "constexpr"], strict=True))
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(types))}  # as launches
    config = rendered.configs[0]
    source = ASTSource(jit, signature, constexprs=dict(config.blocks), attrs=aligned)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    loads = re.findall(r"ld\.global[\w.]*", ptx)
    assert loads and all(".v4." in load for load in loads), loads
