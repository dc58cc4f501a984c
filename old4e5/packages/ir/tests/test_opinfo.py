"""OpInfo-driven checks of lowering (loops on) + the interpreter against eager.

The default run checks a fixed subset of op_db (a few seconds); the full sweep is
marked slow (`pytest -m slow`) and asserts the issue's targets: at least 80% of op_db's
runnable ops pass in float32 with fallbacks disabled, and no wrong result with
fallbacks enabled. torch's op_db needs numpy and expecttest: without them these tests
skip.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy")
pytest.importorskip("expecttest")

from opinfo_check import summary, sweep  # type: ignore[import-not-found]  # tests/ is on sys.path

SUBSET = {
    "add", "mul", "div.floor_rounding", "remainder", "pow", "exp", "log1p", "sigmoid", "erf",
    "where", "clamp", "abs", "isnan", "eq", "logical_and", "bitwise_xor", "sum", "prod",
    "amax", "argmin", "mean", "var_mean", "std", "any", "cumsum", "softmax", "log_softmax",
    "cat", "stack", "nn.functional.pad.constant", "index_select", "gather", "take_along_dim",
    "scatter_add", "index_put", "index_add", "nn.functional.embedding", "arange", "full",
    "zeros_like", "reshape", "permute", "transpose", "expand", "narrow", "select", "squeeze",
    "unsqueeze", "as_strided", "unfold", "diagonal", "flip", "roll", "tril", "masked_fill",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.layer_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.interpolate.bilinear", "nn.functional.dropout",
    "rand_like", "randn", "matmul", "nn.functional.linear", "addmm",
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opinfo_subset_lowers_to_loops_and_matches_eager(dtype: torch.dtype) -> None:
    results = sweep(dtype, allow_fallback=False, names=SUBSET)
    assert len({r.name for r in results}) >= len(SUBSET) - 2  # the subset names exist
    bad = [f"{r.name}: {r.status} {r.detail}" for r in results if r.status in ("mismatch", "error")]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opinfo_full_sweep(dtype: torch.dtype) -> None:
    strict = sweep(dtype, allow_fallback=False)
    print(f"\n{dtype} fallbacks off: {summary(strict)}")
    counted = [r for r in strict if r.status != "skip"]
    if dtype == torch.float32:
        assert sum(r.status == "pass" for r in counted) >= 0.8 * len(counted)
    relaxed = sweep(dtype, allow_fallback=True)
    print(f"{dtype} fallbacks on:  {summary(relaxed)}")
    wrong = [f"{r.name}: {r.detail}" for r in relaxed if r.status == "mismatch"]
    assert not wrong, "\n".join(wrong)
