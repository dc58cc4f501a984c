"""Index checks and integer division in Triton kernels, in Triton's interpreter.

A kernel with index checks asserts on the device (`tl.device_assert`, compiled in by
Triton's `debug` option, which the launcher passes); in the interpreter a failed
check must raise `IndexOutOfBounds` naming the op, while good indices (negative ones
where eager wraps them) give eager's values. Integer division by zero never raises on
a GPU (eager CUDA neither): it gives all bits set (-1), with eager's floor and
remainder corrections, and MIN // -1 gives MIN.

`TRITON_INTERPRET=1` must be set before kernels are defined and must not leak into
other tests, so the cases run in a subprocess (`python test_triton_index_checks.py`),
which prints one JSON line per case, as test_triton_kernels.py does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

T = torch.tensor
W = torch.arange(40.0).view(10, 4)
X = torch.arange(10.0)
M = torch.randn(3, 70, generator=torch.Generator().manual_seed(0))

# name -> (fn, good args, bad args or None)
INDEX_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[Any, ...]]] = {
    "embedding": (lambda i, w: F.embedding(i, w) * 2, (T([1, 9, 0]), W), (T([1, 10, 0]), W)),
    "embedding_negative": (lambda i, w: F.embedding(i, w) * 2, (T([3]), W), (T([-1]), W)),
    "embedding_bag": (
        lambda i, o, w: F.embedding_bag(i, w, o, mode="sum") * 2,
        (T([1, 9, 0]), T([0, 2]), W),
        (T([1, 10, 0]), T([0, 2]), W),
    ),
    "embedding_bag_offsets": (
        lambda i, o, w: F.embedding_bag(i, w, o, mode="max") * 2,
        (T([1, 9, 0]), T([0, 2]), W),
        (T([1, 9, 0]), T([1, 2]), W),
    ),
    "gather_last_dim": (
        lambda x, i: torch.gather(x, 1, i) + 1,
        (M, T([[0, 69], [5, 6], [68, 1]])),
        (M, T([[0, 69], [5, 70], [68, 1]])),
    ),
    "index_select": (lambda m, i: m.index_select(1, i) * 3, (M, T([69, 0])), (M, T([70, 0]))),
    "index_wraps": (lambda x, i: x[i] + 1, (X, T([0, -10, 9])), (X, T([0, -11, 9]))),
    "index_put": (
        lambda x, i: x.index_put((i,), T([7.0, 8.0]), accumulate=True),
        (X, T([-1, 2])),
        (X, T([10, 2])),
    ),
    "scatter_add": (
        lambda x, i: x.scatter_add(0, i, torch.ones(2)) + 1,
        (X, T([2, 2])),
        (X, T([2, -1])),
    ),
}


def _division_cases() -> dict[
    str, tuple[Callable[..., Any], torch.Tensor, torch.Tensor, list[int]]
]:
    """(fn, a, b, expected): zero divisors give eager CUDA's int32 values (all bits
    set, then the floor corrections); MIN // -1 gives MIN, its remainders 0."""
    cases = {}
    ops: dict[str, Callable[..., Any]] = {
        "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        "remainder": torch.remainder,
        "fmod": torch.fmod,
    }
    by_zero = {"floor": [-1, -2, -1, 3], "trunc": [-1, -1, -1, 3], "remainder": [-1, -1, -1, 1]}
    by_zero["fmod"] = [-1, -1, -1, 1]
    for dtype in (torch.int32, torch.int64):
        low = torch.iinfo(dtype).min
        for name, fn in ops.items():
            a = T([7, -7, 0, 7], dtype=dtype)
            b = T([0, 0, 0, 2], dtype=dtype)
            cases[f"{name}_by_zero_{dtype}"] = (fn, a, b, by_zero[name])
            minimum = [low, 3] if name in ("floor", "trunc") else [0, 0]
            cases[f"{name}_min_{dtype}"] = (
                fn,
                T([low, -3], dtype=dtype),
                T([-1, -1], dtype=dtype),
                minimum,
            )
    return cases


DIVISION_CASES = _division_cases()


def run_case(name: str, cache: Path) -> dict[str, Any]:
    from triton_harness import lower_for_triton as _lower
    from triton_harness import run_with_triton

    from ember.ir import IndexOutOfBounds

    if name in DIVISION_CASES:
        fn, a, b, expected = DIVISION_CASES[name]
        program, schedule = _lower(fn, [a, T([1] * len(b), dtype=b.dtype)], False)
        (actual,), _ = run_with_triton(program, schedule, [a, b], seed=0, cache_dir=cache)
        return {"case": name, "ok": actual.tolist() == expected, "got": actual.tolist()}
    fn, good, bad = INDEX_CASES[name]
    program, schedule = _lower(fn, list(good), False)
    actual, _ = run_with_triton(
        program, schedule, [a.clone() for a in good], seed=0, cache_dir=cache
    )
    torch.testing.assert_close(actual[0], fn(*good))
    try:
        run_with_triton(program, schedule, [a.clone() for a in bad], seed=0, cache_dir=cache)
    except IndexOutOfBounds as error:
        return {"case": name, "ok": "aten." in str(error), "error": str(error)}
    return {"case": name, "ok": False, "error": "no error for a bad index"}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    records = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["case"]] = record
    if not records:
        pytest.fail(
            f"the interpreter run produced nothing (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return records


@pytest.mark.parametrize("case", [*INDEX_CASES, *DIVISION_CASES])
def test_in_interpreter(case: str, results: dict[str, dict[str, Any]]) -> None:
    record = results.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record


def test_checked_kernels_ask_for_triton_debug() -> None:
    from triton_harness import lower_for_triton as _lower

    from ember.codegen.triton import render_kernel

    _program, schedule = _lower(
        INDEX_CASES["embedding"][0], list(INDEX_CASES["embedding"][1]), False
    )
    (kernel,) = [render_kernel(k) for k in schedule.kernels]
    assert "tl.device_assert(" in kernel.source
    assert dict(kernel.launch_options) == {"debug": True, "sanitize_overflow": False}
    assert kernel.index_checks == (("aten.embedding (graph node 'embedding')", 0),)
    _program, schedule = _lower(lambda x: x * 2, [X], False)
    (plain,) = [render_kernel(k) for k in schedule.kernels]
    assert plain.launch_options == () and "device_assert" not in plain.source


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        for case in [*INDEX_CASES, *DIVISION_CASES]:
            try:
                record = run_case(case, Path(directory))
            except Exception:
                record = {"case": case, "ok": False, "error": traceback.format_exc()[-3000:]}
            print(json.dumps(record), flush=True)
