"""The direct launch path's guard: it may bypass Triton's jit only while no launch
hook (a profiler's) is registered. Triton 3.6+ keeps each hook as a HookChain that is
never None; an empty one must count as no hook (before this was understood, every
launch took the slow jit path), a non-empty one must send launches through the jit.
"""

from __future__ import annotations

import pytest
import triton

from ember.runtime.triton_kernels import _hooks_active


def test_empty_hook_chains_are_no_hooks() -> None:
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        pytest.skip(f"triton {triton.__version__} has no knobs.runtime (the guard says None)")
    assert _hooks_active() is False
    chain = runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton's launch hook is not a HookChain")

    def hook(*args: object) -> None:
        pass

    chain.add(hook)
    try:
        assert _hooks_active() is True
    finally:
        chain.remove(hook)
    assert _hooks_active() is False
