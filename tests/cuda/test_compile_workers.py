"""The compile workers on a GPU: a compile captured from Triton's real jit, compiled by
a worker that has only Triton, is a cache hit when this process then compiles the
same kernel, and the kernel computes the right thing. If the capture and this
process's own compile disagreed on any part of Triton's cache key, this process would
compile the kernel a second time (silently slower), and the cache would hold two
binaries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.runtime import compile_pool
from ember.runtime.config import config
from ember.runtime.loader import load_module, write_source

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

KERNEL = """
import triton
import triton.language as tl

@triton.jit(do_not_specialize=["n"])
def triple_plus(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * 3 + {salt}, mask=i < n)
"""


def test_a_worker_compile_is_a_cache_hit_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    salted = KERNEL.format(salt=hash(tmp_path) % 1000)  # never in another cache
    path = write_source(tmp_path / "sources", salted, prefix="k")
    fn = load_module(path, {}).triple_plus
    device = torch.device("cuda", torch.cuda.current_device())

    def warm() -> None:
        dtypes = [torch.float32, torch.float32]
        compile_pool.warm_up(fn, dtypes, 1, [("BLOCK", 128)], 4, 1, device.index or 0)

    compile_pool._close_all()  # workers started by earlier tests see another cache
    try:
        with config.scope(compile_workers=1):
            assert compile_pool.start(compile_pool.cuda_target(device)) == 1
            assert compile_pool.workers()[0].ready.wait(120)
            request = compile_pool.capture(fn, str(path), device.index or 0, warm)
            assert request is not None, "the jit's compile was not captured"
            assert not list((tmp_path / "cache").rglob("triple_plus.cubin"))  # not compiled
            session = compile_pool.CompileSession(threads=1)
            session.add(request, warm)  # after the worker's compile: a load
            session.close()
    finally:
        compile_pool._close_all()
    assert session.by_workers == 1
    cubins = list((tmp_path / "cache").rglob("triple_plus.cubin"))
    assert len(cubins) == 1, f"this process compiled again: {cubins}"
    x = torch.randn(1000, device=device)
    out = torch.empty_like(x)
    fn[(8,)](x, out, x.numel(), BLOCK=128)
    salt = hash(tmp_path) % 1000
    torch.testing.assert_close(out, x * 3 + salt)
