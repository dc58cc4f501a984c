"""Index checks on a CUDA GPU: a bad index stops ember's Triton kernel with a
device-side assert, as eager's indexing kernels do (the CUDA context is lost, so it
runs in a child process); good indices match eager; integer division by zero does not
trap. Run on the GPU machine with `python3 -m pytest -m cuda` (see README)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from ember.runtime import config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEVICE = "cuda"


def test_good_indices_and_zero_divisors_match_eager() -> None:
    w = torch.randn(10, 64, device=DEVICE)
    ids = torch.tensor([0, 9, 3], device=DEVICE)
    a = torch.tensor([7, -7, 9], device=DEVICE, dtype=torch.int32)
    b = torch.tensor([2, 0, -1], device=DEVICE, dtype=torch.int32)
    with config.scope(strict=True):
        emb = torch.compile(lambda i, w: F.embedding(i, w) * 2, backend="ember")
        torch.testing.assert_close(emb(ids, w), F.embedding(ids, w) * 2)
        div = torch.compile(lambda a, b: (a // b, torch.remainder(a, b)), backend="ember")
        quotient, remainder = div(a, b)
    # eager CUDA, int32: 7 // 2 = 3, -7 // 0 = -2 (all bits set, floored), 9 // -1 = -9
    assert quotient.tolist() == [3, -2, -9]
    assert remainder.tolist() == [1, -1, 0]


def test_bad_index_is_a_device_side_assert() -> None:
    script = textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F
        import ember.runtime
        from ember.runtime import config

        w = torch.randn(10, 64, device="cuda")
        with config.scope(strict=True):
            emb = torch.compile(lambda i, w: F.embedding(i, w) * 2, backend="ember")
            emb(torch.tensor([1, 2], device="cuda"), w)
            out = emb(torch.tensor([1, 10], device="cuda"), w)
            torch.cuda.synchronize()
        print("no assert", out.sum().item())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert "no assert" not in done.stdout, done.stdout
    assert "device-side assert" in done.stderr or "index out of bounds" in done.stderr, (
        done.returncode,
        done.stderr[-3000:],
    )
