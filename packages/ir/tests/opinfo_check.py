"""OpInfo-driven check of lowering + the reference interpreter against eager.

For each op of torch's `op_db` (first sample input, CPU): trace with make_fx
(functionalized, ember's decomposition table), lower with `loops=True`, verify, run
with the interpreter and compare every output (and every mutated input) with eager.
bfloat16 results are compared with a float32 reference at bfloat16 tolerance, or with
eager bfloat16 itself at a tight one (some ops round differently in float32).
Random ops are compared by shape and dtype and checked deterministic per seed; ops
whose values PyTorch leaves unspecified (empty*) by shape and dtype only.

Used by test_opinfo.py (a fixed subset by default, the whole op_db when slow tests
run) and as a script that prints the figures:
    python packages/ir/tests/opinfo_check.py [--dtype bfloat16] [--fallback] [-v]
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringError, LoweringOptions, lower_graph, run_program, verify

TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # (rtol, atol)
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}
UNSPECIFIED = (
    "empty",
    "new_empty",
    "empty_like",
    "empty_strided",
    "new_empty_strided",
    "empty_permuted",
)

# Ops that leave the order of equal values unspecified (an unstable sort, topk): op
# name -> where `dim` sits among the positional arguments after the input. Their index
# outputs are judged by the input values they pick, not by the positions.
TIE_ORDERED = {"sort": 0, "argsort": 0, "topk": 1}


def _picked(name: str, sample: Any, x: Any, leaves: list[Any]) -> list[Any]:
    """`leaves` (the op's flat outputs) with the index output replaced by the values of
    `x` it picks, for a TIE_ORDERED op that is not a stable sort."""
    args, kwargs = tuple(sample.args), dict(sample.kwargs)
    if name not in TIE_ORDERED or kwargs.get("stable") or not isinstance(x, torch.Tensor):
        return leaves
    if x.dim() == 0:
        return leaves
    at = TIE_ORDERED[name]
    dim = args[at] if len(args) > at else kwargs.get("dim", -1)
    k = len(leaves) - 1  # the indices come last
    return [*leaves[:k], x.gather(dim, leaves[k])]


@dataclass
class Outcome:
    name: str
    status: str  # pass | mismatch | error | skip
    detail: str = ""
    externs: int = 0


def op_key(info: Any) -> str:
    return str(info.name) + (f".{info.variant_test_name}" if info.variant_test_name else "")


def _call(info: Any, flat: list[Any], spec: Any, idx: list[int]) -> Any:
    def fn(*tensors: torch.Tensor) -> Any:
        items = list(flat)
        for i, t in zip(idx, tensors, strict=True):
            items[i] = t
        inp, args, kwargs = pytree.tree_unflatten(items, spec)
        return info.op(inp, *args, **kwargs)

    return fn


def _clone(tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        c = t.detach().clone()
        if dtype is not None and c.dtype in (torch.bfloat16, torch.float16):
            c = c.to(dtype)
        out.append(c)
    return out


def _close(actual: Any, expected: Any, dtype: torch.dtype) -> str:
    """'' when equal enough, else why not."""
    try:
        return str(_compare(actual, expected, dtype))
    except Exception as e:
        return f"cannot compare: {type(e).__name__}"


def _compare(actual: Any, expected: Any, dtype: torch.dtype) -> str:
    if not isinstance(expected, torch.Tensor):
        return "" if actual == expected else f"value {actual!r} != {expected!r}"
    if not isinstance(actual, torch.Tensor):
        return f"got {type(actual).__name__}, expected a tensor"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if expected.is_floating_point() or expected.is_complex():
        rtol, atol = TOLERANCE.get(dtype, (1e-5, 1e-5))
        ok = torch.allclose(
            actual.to(expected.dtype), expected, rtol=rtol, atol=atol, equal_nan=True
        )
        return (
            ""
            if ok
            else f"max abs diff {(actual.double() - expected.double()).abs().nan_to_num().max():.3g}"  # noqa: E501
        )
    return "" if torch.equal(actual.to(expected.dtype), expected) else "integer values differ"


def check(info: Any, dtype: torch.dtype, allow_fallback: bool) -> Outcome:
    key = op_key(info)
    try:
        sample = next(iter(info.sample_inputs("cpu", dtype, requires_grad=False)))
    except Exception as e:
        return Outcome(key, "skip", f"no sample: {type(e).__name__}")
    flat, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    tensors = [flat[i] for i in idx]
    fn = _call(info, flat, spec, idx)
    try:
        torch.manual_seed(0)
        eager_inputs = _clone(tensors)
        expected = fn(*eager_inputs)
        torch.manual_seed(1)
        again = fn(*_clone(tensors))
    except Exception as e:
        return Outcome(key, "skip", f"eager: {type(e).__name__}")
    exp_flat = pytree.tree_leaves(expected)
    random = any(
        _close(a, b, torch.float64)
        for a, b in zip(pytree.tree_leaves(again), exp_flat, strict=False)
    )
    unspecified = info.name.split(".")[-1] in UNSPECIFIED or random
    try:
        table: Any = ember_decompositions()
        gm = make_fx(torch.func.functionalize(fn), decomposition_table=table)(*_clone(tensors))
    except Exception as e:
        return Outcome(key, "error", f"trace: {type(e).__name__}: {str(e)[:80]}")
    random = random or any(
        torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
        for n in gm.graph.nodes
        if n.op == "call_function"
    )
    unspecified = unspecified or random
    try:
        program = lower_graph(
            gm, name="op", options=LoweringOptions(loops=True, allow_fallback=allow_fallback)
        )
        verify(program)
    except LoweringError as e:
        return Outcome(key, "error", f"lower: {str(e)[:160]}")
    except Exception as e:
        return Outcome(key, "error", f"lower/verify: {type(e).__name__}: {str(e)[:120]}")
    externs = sum(1 for n in program.extern_kernels() if not n.is_view)
    ours_inputs = _clone(tensors)
    try:
        actual = run_program(program, ours_inputs, seed=0)
        if unspecified and program.rng_seed is not None:
            repeat = run_program(program, _clone(tensors), seed=0)
            if any(_close(a, b, torch.float64) for a, b in zip(repeat, actual, strict=True)):
                return Outcome(key, "mismatch", "random op not deterministic per seed", externs)
    except Exception as e:
        return Outcome(key, "error", f"run: {type(e).__name__}: {str(e)[:120]}", externs)
    act_flat = pytree.tree_leaves(actual)
    if len(act_flat) != len(exp_flat):
        return Outcome(
            key, "mismatch", f"{len(act_flat)} outputs, expected {len(exp_flat)}", externs
        )
    if unspecified:
        for got, want in zip(act_flat, exp_flat, strict=True):
            if isinstance(want, torch.Tensor) and (
                not isinstance(got, torch.Tensor)
                or got.shape != want.shape
                or got.dtype != want.dtype
            ):
                return Outcome(key, "mismatch", "shape/dtype of an unspecified output", externs)
        return Outcome(key, "pass", "shape-only (random or unspecified values)", externs)
    reference = exp_flat
    ref_inputs = eager_inputs
    if dtype in (torch.bfloat16, torch.float16):
        try:
            torch.manual_seed(0)
            ref_inputs = _clone(tensors, torch.float32)
            reference = pytree.tree_leaves(fn(*ref_inputs))
        except Exception:
            reference, ref_inputs = exp_flat, eager_inputs
    name = info.name.split(".")[-1]
    act_flat = _picked(name, sample, eager_inputs[0] if eager_inputs else None, act_flat)
    exp_flat = _picked(name, sample, eager_inputs[0] if eager_inputs else None, exp_flat)
    reference = _picked(name, sample, ref_inputs[0] if ref_inputs else None, reference)
    for k, (got, want, ref) in enumerate(zip(act_flat, exp_flat, reference, strict=True)):
        why = _close(got, ref, dtype)
        if (
            isinstance(want, torch.Tensor)
            and isinstance(got, torch.Tensor)
            and got.dtype != want.dtype
        ):
            why = f"dtype {got.dtype} != {want.dtype}"
        if why and (
            why.startswith("dtype")
            or _close(got, want, torch.float32 if dtype != torch.float32 else dtype)
        ):
            if _graph_differs(gm, tensors, exp_flat, dtype):
                return Outcome(
                    key, "error", f"decomposed graph itself differs from eager: {why}", externs
                )
            return Outcome(key, "mismatch", f"output {k}: {why}", externs)
    for k, (got, want) in enumerate(zip(ours_inputs, eager_inputs, strict=True)):
        why = _close(got, want, dtype)
        if why:
            return Outcome(key, "mismatch", f"mutated input {k}: {why}", externs)
    return Outcome(key, "pass", "", externs)


def _graph_differs(
    gm: Any, tensors: list[torch.Tensor], expected: list[Any], dtype: torch.dtype
) -> bool:
    """True when the traced graph, run by torch itself, already disagrees with eager
    (a decomposition bug upstream of ember.ir)."""
    try:
        torch.manual_seed(0)
        traced = pytree.tree_leaves(gm(*_clone(tensors)))
    except Exception:
        return False
    return len(traced) != len(expected) or any(
        _close(t, e, dtype) for t, e in zip(traced, expected, strict=True)
    )


def sweep(dtype: torch.dtype, allow_fallback: bool, names: set[str] | None = None) -> list[Outcome]:
    from torch.testing._internal.common_methods_invocations import op_db

    warnings.filterwarnings("ignore")
    results = []
    for info in op_db:
        if names is not None and op_key(info) not in names:
            continue
        if dtype not in info.supported_dtypes("cpu"):  # type: ignore[no-untyped-call]  # untyped in torch
            results.append(Outcome(op_key(info), "skip", "dtype not supported by eager"))
            continue
        results.append(check(info, dtype, allow_fallback))
    return results


def summary(results: list[Outcome]) -> str:
    counts = collections.Counter(r.status for r in results)
    counted = counts["pass"] + counts["mismatch"] + counts["error"]
    rate = 100.0 * counts["pass"] / max(counted, 1)
    loops_only = sum(1 for r in results if r.status == "pass" and r.externs == 0)
    return (
        f"pass {counts['pass']} / mismatch {counts['mismatch']} / error {counts['error']} / "
        f"skip {counts['skip']}  ({rate:.1f}% of {counted} runnable; "
        f"{loops_only} passes use no extern)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--fallback", action="store_true", help="allow extern fallbacks")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--only", nargs="*")
    ns = parser.parse_args()
    start = time.perf_counter()
    results = sweep(getattr(torch, ns.dtype), ns.fallback, set(ns.only) if ns.only else None)
    for r in results:
        if ns.verbose and r.status != "pass":
            print(f"{r.status:8} {r.name:40} {r.detail}")
    print(f"{ns.dtype} fallback={'on' if ns.fallback else 'off'}: {summary(results)} "
          f"in {time.perf_counter() - start:.0f}s")  # fmt: skip


if __name__ == "__main__":
    main()
