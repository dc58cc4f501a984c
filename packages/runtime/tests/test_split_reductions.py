"""Split reductions (ember.scheduler.split) run by the C++ kernels and end to end: the
results still equal the IR interpreter and eager.

Small thresholds force the split on test-sized tensors; one end-to-end case uses the
C++ codegen's own choices on a full sum long enough to split on any machine with two
or more threads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cpp_harness import Case, run_compiled, trace

from ember.ir import run_program
from ember.runtime.cpp_kernels import compile_cpp_kernels
from ember.scheduler import DeviceChoices

SMALL = DeviceChoices(split_workers=16, split_column_width=4, split_min_chunk=8)


def _norm_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
    # a layer norm's weight and bias gradients and the input-side product
    return (g * x).sum(0), g.sum(0), g * w


def _batch_norm_train(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> Any:
    mean, var = mean.clone(), var.clone()
    y = torch.nn.functional.batch_norm(x, mean, var, training=True, momentum=0.1)
    return y, mean, var


CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "sum_cols": (lambda x: x.sum(0), (torch.randn(96, 24),)),  # 6 column workers: 2 chunks
    "sum_rows": (lambda x: x.sum(-1), (torch.randn(3, 320),)),
    "sum_all_mean": (lambda x: (x.sum(), x.mean(0)), (torch.randn(40, 24),)),
    "max_min": (lambda x: (x.amax(0) + 1, x.amin(-1)), (torch.randn(64, 12),)),
    "prod": (lambda x: (1 + 0.01 * x).prod(0), (torch.randn(64, 8),)),
    "any_all": (lambda x: ((x > 2).any(0), (x > -2.5).all(-1)), (torch.randn(96, 8),)),
    "norm_backward": (
        _norm_backward,
        (torch.randn(64, 12), torch.randn(64, 12), torch.randn(12)),
    ),
    "bf16_cols": (lambda x: x.sum(0), (torch.randn(128, 24).to(torch.bfloat16),)),
    # a batch norm's training statistics: the split Welford's pair folds into the
    # per-channel epilogue and the normalisation
    "batch_norm_stats": (
        _batch_norm_train,
        (torch.randn(32, 6, 4, 4) * 3.0 + 5.0, torch.randn(6), torch.rand(6) + 0.5),
    ),
}


@pytest.fixture(scope="module")
def traced() -> dict[str, Case]:
    return {
        name: trace(f"split_{name}", fn, args, choices=SMALL) for name, (fn, args) in CASES.items()
    }


@pytest.fixture(scope="module")
def compiled(traced: dict[str, Case], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    kernels = [k for case in traced.values() for k in case.kernels]
    return compile_cpp_kernels(kernels, cache_dir=tmp_path_factory.mktemp("cpp-split"))


def _leaves(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_cpp_kernels_match_interpreter_and_eager(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    partials = [n for n in case.schedule.program.nodes if n.name.endswith("_partial")]
    assert partials, "the case should split"
    if name == "batch_norm_stats":  # the pair was folded away: its name is gone
        names = {n.name for n in case.schedule.program.nodes}
        assert all(p.name.removesuffix("_partial") not in names for p in partials)
    got = _leaves(run_compiled(case, compiled, case.args))
    oracle = _leaves(run_program(case.program, [a.clone() for a in case.args]))
    eager = _leaves(case.fn(*[a.clone() for a in case.args]))
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if name.startswith("bf16") else {}
    for g, o, e in zip(got, oracle, eager, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, o, **tolerance)
        torch.testing.assert_close(g, e, **tolerance)


def test_compiled_graph_with_cpu_choices_splits_and_matches_eager(tmp_path: Path) -> None:
    from ember.codegen.cpp import CPP_CHOICES
    from ember.runtime.devices import device_records
    from ember.runtime.kernels import scheduling_choices

    assert scheduling_choices(device_records({torch.device("cpu")})) is CPP_CHOICES
    x = torch.randn(1 << 16)
    case = trace("split_cpu_choices", lambda t: (t * 2).sum(), (x,), choices=CPP_CHOICES)
    if CPP_CHOICES.split_workers >= 2:
        assert len(case.kernels) == 2  # partial sums per thread, then their total
    compiled = compile_cpp_kernels(case.kernels, cache_dir=tmp_path)
    (got,) = run_compiled(case, compiled, (x,))
    torch.testing.assert_close(got, (x * 2).sum(), rtol=1e-5, atol=1e-4)
