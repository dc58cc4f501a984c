"""Large CPU outputs of compiled graphs are marked for transparent huge pages
(ember.runtime.hugepages): the mapping holding them carries the kernel's `hg` flag
(MADV_HUGEPAGE), their values are right, and small buffers are left alone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ember.runtime.hugepages as hugepages
from ember.runtime.hugepages import HUGE_MIN, advise_huge_pages


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (from smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            low, high = (int(v, 16) for v in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise, smaps")


@linux_only
def test_large_buffer_is_advised() -> None:
    t = advise_huge_pages(torch.empty(HUGE_MIN // 4 + 1024))
    assert "hg" in _vm_flags(t.data_ptr() + HUGE_MIN // 2)


def test_small_buffer_is_not_advised(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []

    def record() -> Callable[[int, int, int], int]:
        return lambda *a: calls.append(a) or 0

    monkeypatch.setattr(hugepages, "_madvise", record)
    small = torch.empty(1000)
    assert advise_huge_pages(small) is small
    assert calls == []
    large = torch.empty(HUGE_MIN // 4)
    assert advise_huge_pages(large) is large
    ((start, length, advice),) = calls
    assert start % 4096 == 0 and start >= large.data_ptr() and advice == 14
    assert start + length <= large.data_ptr() + HUGE_MIN


@linux_only
def test_compiled_large_output_is_advised_and_right() -> None:
    import ember.runtime  # noqa: F401  (registers the backend)

    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend="ember")
    x = torch.randn(4100, 2048)
    out = fn(x)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x) * 2, rtol=1e-4, atol=1e-5)
    assert "hg" in _vm_flags(out.data_ptr() + out.numel() * 2)
    y = torch.randn(64, 64)  # a second graph, below the threshold
    torch.testing.assert_close(fn(y), torch.nn.functional.gelu(y) * 2, rtol=1e-4, atol=1e-5)
