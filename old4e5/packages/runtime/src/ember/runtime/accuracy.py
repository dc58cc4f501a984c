"""The accuracy rule: when is a compiled result "the same" as eager's?

One rule, used by check mode (`EMBER_CHECK`), `ember bench`, the OpInfo sweep and the
differential fuzzer, so that "matches eager" means the same thing everywhere:

1. Metadata first: the compiled tensor must have eager's dtype and sizes (strides are
   compared by check mode, which sees the graph-level contract; see `ember.runtime.check`).
2. Integers and booleans must be equal. NaNs must sit where eager's are, infinities
   where eager's are, with the same sign.
3. Floating values pass when every element is within the per-dtype tolerance of
   eager's: ``|compiled - eager| <= atol + rtol * |eager|`` (`TOLERANCES`; float32 is
   looser than `torch.testing`'s default because a compiler may reorder a reduction).
4. Where eager itself is imprecise (a low-precision dtype, a long reduction), a float64
   reference helps: when given, a result that fails (3) still passes if it is no
   further from the float64 reference than `REFERENCE_FACTOR` times eager's own distance
   (plus atol). The reference is the same computation on inputs upcast to float64 (the
   OpInfo sweep and the fuzzer compute it; Inductor's OpInfo tests compute bfloat16
   references in float32 for the same reason).

`compare` returns a `Comparison` (never raises) so callers decide whether a miss is an
error (check mode), a table cell (bench) or an outcome (sweep, fuzzer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# dtype -> (rtol, atol) against eager.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
# Compiled may be this many times further from float64 than eager is.
REFERENCE_FACTOR = 3.0
_DEFAULT_TOLERANCE = (1e-4, 1e-5)  # float8 and other rare floating dtypes


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results of `dtype`; integers and bools need exact equality."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return (0.0, 0.0)
    return TOLERANCES.get(dtype, _DEFAULT_TOLERANCE)


@dataclass(frozen=True)
class Comparison:
    """The verdict on one tensor: `ok`, the largest error, and why it failed."""

    ok: bool
    max_abs_err: float = 0.0
    reason: str = ""
    where: tuple[int, ...] | None = None  # index of the worst element, when values differ
    used_reference: bool = False

    def describe(self) -> str:
        at = f" at index {list(self.where)}" if self.where is not None else ""
        return f"{self.reason}{at} (max abs error {self.max_abs_err:.3g})"


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _worst(diff: torch.Tensor, shape: Sequence[int]) -> tuple[int, ...]:
    flat = int(torch.argmax(diff.reshape(-1).to(torch.float64)).item())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape)))


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |actual - expected| over the elements both hold finite (0 for empty)."""
    if actual.numel() == 0 or actual.shape != expected.shape:
        return 0.0 if actual.shape == expected.shape else math.inf
    a = _as_real(actual.detach()).to(torch.float64)
    e = _as_real(expected.detach()).to(torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(e)
    if not bool(finite.any()):
        return 0.0
    return float((a - e).abs()[finite].max())


def compare(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    reference: torch.Tensor | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> Comparison:
    """Apply the accuracy rule to one compiled tensor against eager's (and float64's)."""
    if actual.dtype != expected.dtype:
        return Comparison(False, math.inf, f"dtype {actual.dtype} != eager's {expected.dtype}")
    if actual.shape != expected.shape:
        return Comparison(
            False, math.inf, f"sizes {list(actual.shape)} != eager's {list(expected.shape)}"
        )
    if actual.numel() == 0:
        return Comparison(True)
    default_rtol, default_atol = tolerance(expected.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    a = _as_real(actual.detach()).cpu().to(torch.float64)
    e = _as_real(expected.detach()).cpu().to(torch.float64)
    shape = a.shape
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    if not torch.equal(a_nan, e_nan):
        return Comparison(
            False, math.inf, "NaN where eager has none or vice versa", _worst(a_nan ^ e_nan, shape)
        )
    a_inf, e_inf = torch.isinf(a), torch.isinf(e)
    inf_differs = (a_inf != e_inf) | (a_inf & e_inf & (torch.sign(a) != torch.sign(e)))
    if bool(inf_differs.any()):
        return Comparison(
            False, math.inf, "infinity where eager differs", _worst(inf_differs, shape)
        )
    finite = ~(a_nan | a_inf)
    diff = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    err = float(diff.max())
    allowed = torch.where(finite, atol + rtol * e.abs(), torch.zeros_like(e))
    if bool((diff <= allowed).all()):
        return Comparison(True, err)
    where = _worst(diff - allowed, shape)
    if reference is not None and reference.shape == expected.shape:
        ref = _as_real(reference.detach()).cpu().to(torch.float64)
        ref_finite = finite & torch.isfinite(ref)
        compiled_dist = float(torch.where(ref_finite, (a - ref).abs(), 0.0).max())
        eager_dist = float(torch.where(ref_finite, (e - ref).abs(), 0.0).max())
        if compiled_dist <= REFERENCE_FACTOR * eager_dist + atol:
            return Comparison(True, err, used_reference=True)
        return Comparison(
            False,
            err,
            f"differs from eager beyond rtol={rtol:g}, atol={atol:g}, and is "
            f"{compiled_dist:.3g} from float64 where eager is {eager_dist:.3g}",
            where,
            used_reference=True,
        )
    return Comparison(False, err, f"differs from eager beyond rtol={rtol:g}, atol={atol:g}", where)


def flatten_tensors(value: Any) -> list[tuple[str, Any]]:
    """(path, leaf) pairs of a nested output: tuples, lists, dicts and model outputs."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, bool)):
        return [("", value)]
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = [(f"[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    elif hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return flatten_tensors(value.to_tuple())
    else:
        return [("", value)]
    return [(key + sub, leaf) for key, v in items for sub, leaf in flatten_tensors(v)]


def compare_outputs(
    actual: Any, expected: Any, *, reference: Any = None
) -> tuple[Comparison, str] | None:
    """The first failing leaf of two nested outputs as (verdict, path), or None if all pass."""
    got, want = flatten_tensors(actual), flatten_tensors(expected)
    if [p for p, _ in got] != [p for p, _ in want]:
        return Comparison(False, math.inf, "output structure differs from eager's"), ""
    refs = flatten_tensors(reference) if reference is not None else []
    ref_by_path = dict(refs) if [p for p, _ in refs] == [p for p, _ in want] else {}
    for path, a in got:
        e = dict(want)[path]
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return Comparison(False, math.inf, f"not a tensor: {type(a).__name__}"), path
            ref = ref_by_path.get(path)
            verdict = compare(a, e, reference=ref if isinstance(ref, torch.Tensor) else None)
            if not verdict.ok:
                return verdict, path
        elif isinstance(e, float) and isinstance(a, (int, float)):
            if not math.isclose(a, e, rel_tol=1e-6, abs_tol=1e-9) and not (
                math.isnan(a) and math.isnan(e)
            ):
                return Comparison(False, abs(a - e), f"{a!r} != eager's {e!r}"), path
        elif type(a) is not type(e) or (isinstance(e, (int, bool, str)) and a != e):
            return Comparison(False, math.inf, f"{_short(a)} != eager's {_short(e)}"), path
    return None


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of sizes {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def largest_error(actual: Any, expected: Any) -> float:
    """Max abs error over all floating leaves of two nested outputs (for tables)."""
    want = dict(flatten_tensors(expected))
    errs = [
        max_abs_err(a, want[p])
        for p, a in flatten_tensors(actual)
        if isinstance(a, torch.Tensor) and isinstance(want.get(p), torch.Tensor)
    ]
    return max(errs, default=0.0)
