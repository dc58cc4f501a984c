"""Ember's own Triton compile and launch path.

On the CPU: the specialisation ember builds for `triton.compile` from a rendered
kernel (a type per argument, block sizes as constants, the alignment assumption as
an attribute), and the checks on a compiled binary's description (a binary that
declares other parameters than the signature, or needs launch features ember's
launcher does not give, is refused with a reason instead of being launched wrongly).

On CUDA: representative models run through bound launches only (no buffer needed
the unaligned variant), a buffer that is not 16-byte aligned gets the unaligned
variant and the right values, and a worker's binary launches here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.runtime import compile_pool
from ember.runtime import triton_kernels as tk
from ember.runtime.compile_worker import count_parameters
from ember.scheduler import FusedKernel, schedule_program


def _kernel(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> FusedKernel:
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode="symbolic")(*inputs)
    schedule = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True)))
    (kernel,) = schedule.kernels
    return kernel


def _launcher(kernel: FusedKernel) -> tk.TritonLauncher:
    cache = Path(tempfile.mkdtemp(prefix="ember-launch-test-"))  # the worker reads the source
    (launcher,) = tk.compile_triton_kernels([kernel], cache_dir=cache).values()
    assert isinstance(launcher, tk.TritonLauncher)
    return launcher


def test_the_specialisation_comes_from_the_rendered_kernel() -> None:
    x = torch.randn(4, 32)
    launcher = _launcher(_kernel(lambda a: (a * 2 + 1).to(torch.bfloat16), x))
    kernel = launcher.kernel
    assert kernel.size_arguments  # symbolic sizes: passed as ints
    config = kernel.configs[0]
    request = launcher.request(tk.Variant(config), ("cuda", 90, 32))
    types = list(request.signature.values())
    buffers = len(kernel.buffer_arguments)
    pointer_types = {torch.float32: "*fp32", torch.bfloat16: "*bf16"}
    assert types[:buffers] == [pointer_types[d] for d in kernel.buffer_dtypes]
    sizes = types[buffers : buffers + len(kernel.size_arguments)]
    assert sizes == ["i32"] * len(kernel.size_arguments)
    blocks = dict(config.blocks)
    names = list(request.signature)
    assert {names[i]: v for (i,), v in request.constexprs.items()} == blocks
    assert all(request.signature[n] == "constexpr" for n in blocks)
    assert set(request.attrs) == {(i,) for i in range(buffers)}  # aligned pointers only
    assert request.options["num_warps"] == config.num_warps
    assert request.function == kernel.function_name and Path(request.path).exists()

    wide = launcher.request(tk.Variant(config, wide=True), ("cuda", 90, 32))
    assert list(wide.signature.values())[buffers] == "i64"
    loose = launcher.request(tk.Variant(config, aligned=False), ("cuda", 90, 32))
    assert loose.attrs == {}
    _, kinds = launcher.signature(tk.Variant(config))
    assert kinds == ["p"] * buffers + ["i32"] * len(kernel.size_arguments)


def _reply(**changes: Any) -> dict[str, Any]:
    reply = {
        "symbol": "k", "image": b"\0", "params": 5, "threads": 128, "shared": 0,
        "num_ctas": 1, "cluster": [1, 1, 1], "scratch": 0, "scratch_align": 1,
        "profile_scratch": 0, "cooperative": False, "pdl": False, "triton": "x",
    }  # fmt: skip
    reply.update(changes)
    return reply


def test_binary_descriptions_are_checked() -> None:
    kinds = ["p", "p", "i32"]
    binary = tk.KernelBinary.from_reply(_reply(), kinds)
    assert binary.kinds == ("p", "p", "i32", "p", "p")  # Triton's two scratch pointers
    assert tk.KernelBinary.from_reply(_reply(params=3), kinds).kinds == tuple(kinds)
    for changes, words in [
        ({"params": 2}, "declares 2 parameters"),
        ({"params": 6}, "declares 6 parameters"),
        ({"params": -1}, "declares -1 parameters"),
        ({"cooperative": True}, "cooperative launch"),
        ({"pdl": True}, "programmatic dependent launch"),
        ({"profile_scratch": 64}, "profiling scratch"),
        ({"num_ctas": 2}, "clusters"),
    ]:
        with pytest.raises(tk.UnsupportedBinary, match=words):
            tk.KernelBinary.from_reply(_reply(**changes), kinds)


def test_parameters_are_counted_from_the_entry_declaration() -> None:
    ptx = """
.visible .entry other(.param .u64 a)
.visible .entry kern(
	.param .u64 .ptr .global .align 1 kern_param_0,
	.param .u32 kern_param_1,
	.param .u64 .ptr .global .align 1 kern_param_2
)
"""
    assert count_parameters(ptx, "kern") == 3
    assert count_parameters(ptx, "other") == 1
    assert count_parameters(ptx, "missing") == -1


# -- on a GPU --------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["mlp", "transformer_block", "cnn"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_models_launch_through_bound_launches(name: str, mode: str) -> None:
    """Representative models in bf16 on CUDA, compiled with ember and run three times:
    every launcher bound its sizes and no launch needed the unaligned variant."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import gc

    from ember.runtime.bench.blocks import CNNBlock
    from ember.runtime.models import MLP, TransformerBlock
    from ember.runtime.testing import no_eager_fallback

    models: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
        "mlp": lambda: (MLP(256, 1024, 256), torch.randn(64, 256)),
        "transformer_block": lambda: (TransformerBlock(256, 4, 1024), torch.randn(4, 128, 256)),
        "cnn": lambda: (
            nn.Sequential(CNNBlock(32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)),
            torch.randn(8, 32, 28, 28),
        ),
    }
    model, x = models[name]()
    model = model.to(device="cuda", dtype=torch.bfloat16)
    x = x.to(device="cuda", dtype=torch.bfloat16)
    # type() rather than isinstance: gc also lists dead weak proxies
    before = {id(o) for o in gc.get_objects() if type(o) is tk.TritonLauncher}
    compiled = torch.compile(model, backend="ember")
    tk.unaligned_launches.clear()
    with no_eager_fallback() as graphs:
        for _ in range(3):
            if mode == "inference":
                model.eval()
                with torch.no_grad():
                    compiled(x)
            else:
                model.train()
                compiled(x).float().square().mean().backward()
        torch.cuda.synchronize()
    assert sum(g.fused_kernels for g in graphs) > 0  # Triton kernels did launch
    assert tk.unaligned_launches == {}
    launchers = [
        o for o in gc.get_objects() if type(o) is tk.TritonLauncher and id(o) not in before
    ]
    assert launchers and all(launcher._bound for launcher in launchers)


@pytest.mark.cuda
def test_an_unaligned_buffer_launches_the_unaligned_variant() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(1000, device="cuda")
    kernel = _kernel(lambda a: a * 2 + 1, x)
    launcher = _launcher(kernel)

    def call(inp: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(inp, float("nan"))
        buffers = [out if b in kernel.outputs else inp for b in kernel.buffer_arguments()]
        launcher(*buffers, *_sizes(kernel, inp))
        return out

    tk.unaligned_launches.clear()
    torch.testing.assert_close(call(x), x * 2 + 1)
    assert tk.unaligned_launches == {}
    # a tensor whose storage starts 4 bytes past a 16-byte boundary (the caching
    # allocator's storages never do; external memory may)
    raw = torch.empty(1004, device="cuda")
    storage = torch._C._construct_storage_from_data_pointer(raw.data_ptr() + 4, raw.device, 4000)
    unaligned = torch.empty(0, device="cuda").set_(storage, 0, (1000,), (1,))
    unaligned.copy_(x)
    assert unaligned.data_ptr() % 16 == 4 and unaligned.storage_offset() == 0
    for _ in range(2):
        torch.testing.assert_close(call(unaligned), x * 2 + 1)
    assert tk.unaligned_launches == {kernel.name: 2}


@pytest.mark.cuda
def test_a_worker_compiled_binary_launches_here() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ember.runtime.config import config

    x = torch.randn(1000, device="cuda")
    kernel = _kernel(lambda a: a * 3 - 2, x)
    compile_pool._close_all()  # start one worker of our own
    try:
        with config.scope(compile_workers=1):
            device = torch.device("cuda", torch.cuda.current_device())
            assert compile_pool.start(compile_pool.cuda_target(device)) == 1
            assert compile_pool.workers()[0].ready.wait(120)
            launcher = _launcher(kernel)
            pending = launcher.pending
            assert pending is not None
            pending.finish()
            assert pending._session.by_workers == len(kernel_configs := launcher.kernel.configs)
            assert all(
                isinstance(launcher.binaries[tk.Variant(c)], tk.KernelBinary)
                for c in kernel_configs
            )
    finally:
        compile_pool._close_all()
    out = torch.empty_like(x)
    launcher(
        *[out if b in kernel.outputs else x for b in kernel.buffer_arguments()], *_sizes(kernel, x)
    )
    torch.testing.assert_close(out, x * 3 - 2)


def _sizes(kernel: FusedKernel, x: torch.Tensor) -> list[int]:
    """The size arguments of a kernel traced symbolically over the 1-D `x`: its
    length, and its storage offset."""
    return [
        x.storage_offset() if s.name.startswith("offset") else x.numel()
        for s in kernel.size_arguments()
    ]
