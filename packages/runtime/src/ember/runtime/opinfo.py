"""The OpInfo sweep: every op of torch's `op_db` through `torch.compile(backend="ember")`.

For each OpInfo entry and dtype, the first sample input runs eagerly and compiled, and
the results are judged by the accuracy rule (`ember.runtime.accuracy`), with the same
sample upcast to float64 as the precise reference. One outcome per (op, dtype):

- pass: the compiled result matches eager;
- mismatch: wrong values, dtype or sizes (with fallbacks enabled there must be none);
- error: compiling or running the compiled function raised (ember runs strict here, so a
  compile failure is an error, not a silent eager fallback);
- skip: nothing to compare: the dtype is unsupported, eager raises, the op is random or
  returns uninitialised memory, or Dynamo sent no graph to ember.

With `--eager-errors` the sweep turns to the dtypes each op does *not* support on the
device: where eager raises on the first sample, ember must raise too (pass), never
return values (mismatch): same answer as eager, or the same error. A dtype eager runs
after all is a skip.

`python -m ember.runtime.opinfo` runs the sweep, prints one summary line per dtype and
writes JSON; with `--no-fallback` (EMBER_FALLBACK=0 + EMBER_STRICT=1) the pass count is
ember's lowering coverage. The op database lives in `torch.testing._internal`, which
needs the `expecttest` package; it is imported only when the sweep runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.runtime.accuracy import compare_outputs, largest_error
from ember.runtime.compiler import compile_records
from ember.runtime.config import config
from ember.runtime.dtype_gaps import first_line

OUTCOMES = ("pass", "mismatch", "error", "skip")
# Ops whose outputs are uninitialised memory: no value to compare.
UNINITIALISED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided"}
UNINITIALISED_PREFIXES = ("empty_permuted",)
# Outputs of ops that are uninitialised memory where the sample draws no random
# numbers (with dropout the op is random, and skipped): the attention kernels' RNG
# state (seed and offset: `at::empty` without dropout) and the flash kernel's unused
# output and debug mask. Their sizes and dtypes are compared, not their values.
UNINITIALISED_OUTPUTS = {
    "_flash_attention_forward": (2, 3, 4),
    "_efficient_attention_forward": (2, 3),
}
# Ops that leave the order of equal values unspecified (an unstable sort orders ties as
# it likes, eager's own CPU kernel differently past a few dozen elements; topk picks
# among equal values as it likes): op name -> where `dim` sits in the positional
# arguments after the input. Their index outputs are judged by the input values they
# pick, not by the positions themselves.
TIE_ORDERED = {"sort": 0, "argsort": 0, "topk": 1}


@dataclass
class OpOutcome:
    """One (op, dtype) result of the sweep."""

    op: str
    dtype: str
    outcome: str
    detail: str = ""
    max_abs_err: float | None = None
    graphs: int = 0


def load_op_db() -> list[Any]:
    """torch's OpInfo database (imported lazily: it is large and needs expecttest)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def op_label(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else str(op.name)


def _parts(sample: Any, convert: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """(input, args, kwargs) of a SampleInput with `convert` applied to every tensor."""

    def each(v: Any) -> Any:
        return convert(v) if isinstance(v, torch.Tensor) else v

    return tree_map(each, (sample.input, tuple(sample.args), dict(sample.kwargs)))


def _clone(sample: Any) -> Any:
    return _parts(sample, lambda t: t.clone())


def _upcast(sample: Any) -> Any:
    return _parts(sample, lambda t: t.detach().double() if t.is_floating_point() else t)


def _call(op: Any, parts: Any) -> Any:
    x, args, kwargs = parts
    return op(x, *args, **kwargs)


def picked_values(op_name: str, parts: Any, result: Any) -> Any:
    """`result` of a TIE_ORDERED op with each index output replaced by the input values
    it picks along the op's dim (unchanged for a stable sort, whose ties are ordered)."""
    x, args, kwargs = parts
    if op_name not in TIE_ORDERED or kwargs.get("stable") or x.dim() == 0:
        return result
    at = TIE_ORDERED[op_name]
    dim = args[at] if len(args) > at else kwargs.get("dim", -1)
    if op_name == "argsort":
        return x.gather(dim, result)
    values, indices = result
    return values, x.gather(dim, indices)


def defined_outputs(op_name: str, result: Any) -> Any:
    """`result` with each UNINITIALISED_OUTPUTS tensor replaced by zeros of its size and
    dtype."""
    positions = UNINITIALISED_OUTPUTS.get(op_name.rsplit(".", 1)[-1], ())
    if not positions or not isinstance(result, (tuple, list)):
        return result
    return tuple(
        torch.zeros(r.shape, dtype=r.dtype) if i in positions and isinstance(r, torch.Tensor) else r
        for i, r in enumerate(result)
    )


def _is_random(op: Any, sample: Any) -> bool:
    """Two eager runs under different seeds differ: the op draws random numbers."""
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        results.append(_call(op, _clone(sample)))
    return compare_outputs(results[0], results[1]) is not None


def check_op(op: Any, dtype: torch.dtype, device: str = "cpu") -> OpOutcome:
    """Run the first sample of `op` at `dtype` eagerly and through ember; judge it."""
    label, name = op_label(op), str(dtype).removeprefix("torch.")
    if dtype not in op.supported_dtypes(device):
        return OpOutcome(label, name, "skip", "dtype not supported")
    if op.name in UNINITIALISED or op.name.startswith(UNINITIALISED_PREFIXES):
        return OpOutcome(label, name, "skip", "output is uninitialised memory")
    try:
        sample = next(iter(op.sample_inputs(device, dtype, requires_grad=False)), None)
        if sample is None:
            return OpOutcome(label, name, "skip", "no sample input")
        torch.manual_seed(0)
        expected = _call(op, _clone(sample))
        if _is_random(op, sample):
            return OpOutcome(label, name, "skip", "random op")
    except Exception as exc:
        return OpOutcome(label, name, "skip", f"eager fails: {type(exc).__name__}: {exc}"[:300])
    try:
        reference = _call(op, _upcast(sample)) if dtype != torch.float64 else None
    except Exception:
        reference = None  # some ops have no float64 kernel; compare with eager alone

    def fn(x: Any, *args: Any, **kwargs: Any) -> Any:
        return op(x, *args, **kwargs)

    torch._dynamo.reset()
    first = len(compile_records)
    try:
        torch.manual_seed(0)
        compiled = torch.compile(fn, backend="ember")
        x, args, kwargs = _clone(sample)
        actual = compiled(x, *args, **kwargs)
    except Exception as exc:
        lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
        detail = " ".join(lines[:2])[:400]  # Dynamo's wrapper line, then the cause
        return OpOutcome(label, name, "error", detail, graphs=len(compile_records) - first)
    graphs = len(compile_records) - first
    if graphs == 0:
        return OpOutcome(label, name, "skip", "Dynamo ran it eagerly (no graph for ember)")
    actual = defined_outputs(op.name, picked_values(op.name, _clone(sample), actual))
    expected = defined_outputs(op.name, picked_values(op.name, _clone(sample), expected))
    if reference is not None:
        reference = defined_outputs(op.name, picked_values(op.name, _upcast(sample), reference))
    err = largest_error(actual, expected)
    verdict = compare_outputs(actual, expected, reference=reference)
    if verdict is not None:
        comparison, path = verdict
        detail = f"output{path}: {comparison.describe()}"
        return OpOutcome(label, name, "mismatch", detail, err, graphs)
    return OpOutcome(label, name, "pass", "", err, graphs)


def check_eager_error(op: Any, dtype: torch.dtype, device: str = "cpu") -> OpOutcome:
    """For a dtype `op` does not support on `device`: eager's first sample raises, and
    so must ember's compiled call (pass); values from ember are a mismatch."""
    label, name = op_label(op), str(dtype).removeprefix("torch.")
    if dtype in op.supported_dtypes(device):
        return OpOutcome(label, name, "skip", "dtype supported")
    try:
        sample = next(iter(op.sample_inputs(device, dtype, requires_grad=False)), None)
    except Exception as exc:
        return OpOutcome(label, name, "skip", f"no sample input: {type(exc).__name__}")
    if sample is None:
        return OpOutcome(label, name, "skip", "no sample input")
    try:
        _call(op, _clone(sample))
    except Exception as exc:
        eager_error = first_line(exc, 160)
    else:
        return OpOutcome(label, name, "skip", "eager runs this dtype")

    def fn(x: Any, *args: Any, **kwargs: Any) -> Any:
        return op(x, *args, **kwargs)

    torch._dynamo.reset()
    first = len(compile_records)
    try:
        x, args, kwargs = _clone(sample)
        torch.compile(fn, backend="ember")(x, *args, **kwargs)
    except Exception as exc:
        detail = f"both raise; eager: {eager_error}; ember: {first_line(exc, 160)}"
        return OpOutcome(label, name, "pass", detail[:400], graphs=len(compile_records) - first)
    graphs = len(compile_records) - first
    detail = f"eager raises ({eager_error}); ember returned values"
    return OpOutcome(label, name, "mismatch", detail[:400], graphs=graphs)


def run_sweep(
    ops: Sequence[Any],
    dtypes: Sequence[torch.dtype],
    *,
    device: str = "cpu",
    fallback: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
    eager_errors: bool = False,
) -> list[OpOutcome]:
    """Check each op at each dtype, ember in strict mode (compile failures are errors);
    with `eager_errors`, the dtypes the ops do not support (`check_eager_error`)."""
    results: list[OpOutcome] = []
    total = len(ops) * len(dtypes)
    check = check_eager_error if eager_errors else check_op
    with config.scope(fallback=fallback, strict=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in dtypes:
            for op in ops:
                if progress is not None:
                    progress(len(results), total, op_label(op))
                results.append(check(op, dtype, device))
    torch._dynamo.reset()
    return results


def summary_line(results: Sequence[OpOutcome], dtype: str, fallback: bool) -> str:
    counts = Counter(r.outcome for r in results if r.dtype == dtype)
    total = sum(counts.values())
    parts = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
    return f"opinfo {dtype} fallback={'on' if fallback else 'off'}: {total} ops: {parts}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.runtime.opinfo", description=__doc__)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-fallback", action="store_true", help="EMBER_FALLBACK=0: coverage")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--every", type=int, default=1, help="take every n-th op (sampling)")
    parser.add_argument(
        "--shard", default="0/1", help="K/N: the K-th of N interleaved shares of the ops"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes here")
    parser.add_argument("--show", default="mismatch,error", help="outcomes to list in full")
    parser.add_argument(
        "--eager-errors",
        action="store_true",
        help="the dtypes each op does not support: where eager raises, ember must raise",
    )
    args = parser.parse_args(argv)
    ops = load_op_db()
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [op for op in ops if op.name in wanted or op_label(op) in wanted]
    ops = ops[:: args.every]
    shard, shards = (int(part) for part in args.shard.split("/"))
    if not 0 <= shard < shards:
        parser.error(f"--shard {args.shard}: K must be in 0..N-1")
    ops = ops[shard::shards]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]

    def progress(done: int, total: int, label: str) -> None:
        if sys.stderr.isatty() or done % 100 == 0:
            print(f"\r[{done}/{total}] {label:<40}", end="", file=sys.stderr, flush=True)

    results = run_sweep(ops, dtypes, device=args.device, fallback=not args.no_fallback,
                        progress=progress, eager_errors=args.eager_errors)  # fmt: skip
    print(file=sys.stderr)
    shown = set(args.show.split(","))
    for r in results:
        if r.outcome in shown:
            print(f"{r.outcome:<8} {r.op} {r.dtype}: {r.detail}")
    for dtype in args.dtypes.split(","):
        print(summary_line(results, dtype, not args.no_fallback))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    must_match = not args.no_fallback or args.eager_errors
    return 1 if any(r.outcome == "mismatch" for r in results) and must_match else 0


if __name__ == "__main__":
    sys.exit(main())
