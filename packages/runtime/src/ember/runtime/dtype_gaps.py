"""Ops eager has no kernel for at the dtypes a graph gives them.

ATen kernels dispatch on dtype, and many refuse some: `silu` on int64, `argmax` on
bool, the special functions on bfloat16 on the CPU, `igamma` on bfloat16 on CUDA
(`NotImplementedError: "..." not implemented for 'Long'`). Ember lowers ops after
AOTAutograd has decomposed them into ops that accept every dtype, so a compiled graph
returned values where eager raised: 324 (op, dtype) pairs of the OpInfo database on
the CPU (torch 2.15; `python -m ember.runtime.opinfo --eager-errors`). Same answer as
eager, or the same error: a graph that eager cannot run must not run compiled.

Whether a kernel exists for a dtype is known only to the dispatcher, so each node of
Dynamo's graph whose tensor inputs include a dtype other than float32 and float64 is
run once, eagerly, on small stand-ins (same dtype, same number of dimensions, each
size cut to at most 8, on the same device: ones, and zeros for integers, valid as
indices); a factory call (`arange(..., dtype=torch.bool)`) is asked as it is, where
its output is small. A `NotImplementedError` there is eager's refusal of that dtype; so is a
RuntimeError that names a dtype where the same stand-ins in float32 pass (torch
2.11 words some of its dtype checks so). Errors of any other kind (a shape the
stand-ins do not satisfy, say) prove nothing and are ignored. Each (target,
argument kinds) is asked once per process. The random number generators' states
are restored afterwards, and random ops are not asked, so the probe leaves no trace
in what the program computes. `torch.export` programs are asked the same way,
before decomposition, and one with such a node is refused a package
(`ember.runtime.aot`).

A graph with such a node runs eagerly, where that node raises eager's own error
(strict mode raises at compile time instead, naming the node). A false alarm only
costs speed: the graph then runs eagerly, correctly.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

log = logging.getLogger(__name__)

# dtypes every ATen kernel of a floating-point op takes (no refusal seen in the OpInfo
# sweep on the CPU or CUDA); a node reading only these is not asked
_ALWAYS_SUPPORTED = frozenset({torch.float32, torch.float64})

# names of targets that take any dtype (shape, view and conversion ops, item access)
# or that draw random numbers: neither is asked
_NOT_ASKED = frozenset(
    {
        "getitem", "size", "stride", "dim", "numel", "view", "reshape", "permute",
        "transpose", "t", "expand", "expand_as", "contiguous", "to", "type", "type_as",
        "clone", "detach", "unsqueeze", "squeeze", "flatten", "unflatten", "narrow",
        "select", "split", "chunk", "unbind", "cat", "stack", "float", "half",
        "bfloat16", "double", "int", "long", "bool", "masked_fill", "where", "copy_",
        "zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones",
        "new_empty", "new_full", "zeros", "ones", "empty", "full",
        "_set_grad_enabled", "eq", "ne", "lt", "le", "gt", "ge", "add", "mul",
    }
)  # fmt: skip
_RANDOM_WORDS = (
    "rand", "dropout", "bernoulli", "multinomial", "normal", "poisson", "uniform",
    "exponential", "cauchy", "geometric", "random",
)  # fmt: skip


@dataclass(frozen=True)
class DtypeGap:
    """A node eager refuses at its input dtypes, and eager's message."""

    node: str
    target: str
    dtypes: tuple[str, ...]
    error: str

    def describe(self) -> str:
        return (
            f"node {self.node} ({self.target} on {', '.join(self.dtypes)}): eager has no "
            f"kernel for these dtypes ({self.error})"
        )


def first_gap(gm: torch.fx.GraphModule) -> DtypeGap | None:
    """The first node of Dynamo's graph `gm` that eager refuses at its input dtypes, or
    None. Nodes without fake values (`example_value`) or with inputs the probe cannot
    stand in for are not asked."""
    with _generators_kept():
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method"):
                continue
            name = _target_name(node)
            if name in _NOT_ASKED or _draws_random_numbers(name):
                continue
            dtypes = _asked_dtypes(node)
            if not dtypes or all(d in _ALWAYS_SUPPORTED for d in dtypes):
                continue
            key = _signature(node, name)
            if key is None:
                continue
            error = _refusal(node, key)
            if error is not None:
                names = tuple(str(d).removeprefix("torch.") for d in dtypes)
                return DtypeGap(node.name, name, names, error)
    return None


_SMALL_FACTORY = 4096  # elements: a factory call (no tensor input) asked at its own size


def _asked_dtypes(node: torch.fx.Node) -> list[torch.dtype]:
    """The dtypes a node is asked about: its tensor inputs', or for a factory call
    (`arange(..., dtype=torch.bool)`) the `dtype` it is given, where its output is
    small enough to make as it is."""
    tensors = [t for a in node.all_input_nodes if isinstance(t := _fake(a), torch.Tensor)]
    if tensors:
        return [t.dtype for t in tensors]
    dtype, out = node.kwargs.get("dtype"), _fake(node)
    if not isinstance(dtype, torch.dtype) or not isinstance(out, torch.Tensor):
        return []
    numel = 1
    for size in _sizes(out, most=None):
        numel *= size
    return [dtype] if numel <= _SMALL_FACTORY else []


def _draws_random_numbers(name: str) -> bool:
    """By its name: dropout and its kin; a backward (dropout's) draws none."""
    lowered = name.lower()
    return "backward" not in lowered and any(w in lowered for w in _RANDOM_WORDS)


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):  # an ATen graph (torch.export's)
        return str(target.overloadpacket.__name__)
    return str(getattr(target, "__name__", target))


def _fake(value: Any) -> Any:
    return (
        value.meta.get("example_value", value.meta.get("val"))
        if isinstance(value, torch.fx.Node)
        else value
    )


def _signature(node: torch.fx.Node, name: str) -> tuple[Any, ...] | None:
    """The probe's cache key: the target and each argument's kind (a tensor by dtype,
    stand-in sizes and device; a constant by value), or None where an argument is
    something the probe cannot stand in for."""
    parts: list[Any] = [node.op, node.target if node.op == "call_function" else name]
    try:
        flat = torch.fx.node.map_aggregate((node.args, node.kwargs), _describe)
    except _Unprobable:
        return None
    parts.append(repr(flat))
    return tuple(parts)


class _Unprobable(Exception):
    pass


def _describe(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        fake = _fake(value)
        if isinstance(fake, torch.Tensor):
            return ("tensor", fake.dtype, _sizes(fake), fake.device)
        if isinstance(fake, (torch.SymInt, int, torch.SymFloat, float, torch.SymBool, bool)):
            return ("number", type(_stand_in(fake)).__name__)
        raise _Unprobable
    return value


_MOST = 8  # the stand-ins' largest size in any dimension


def _sizes(fake: torch.Tensor, most: int | None = _MOST) -> tuple[int, ...]:
    """A fake tensor's sizes cut to at most `most`; a symbolic size by its hint, read
    without a guard (1 where it has none)."""
    sizes = []
    for size in fake.shape:
        if not isinstance(size, int):
            hint = getattr(size.node, "hint", None)
            size = hint if isinstance(hint, int) else 1
        sizes.append(size if most is None else min(size, most))
    return tuple(sizes)


def _stand_in(value: Any) -> Any:
    """Small stand-ins for a fake value: a tensor of ones (zeros for integers, valid
    as indices) of `_sizes`, a number 1. Cutting every size the same way keeps equal
    sizes equal (a matrix product's inner sizes, a grid's batch) and ones one
    (broadcasting), and leaves room for the windows of pooling, unfolding and topk."""
    if isinstance(value, torch.Tensor):
        fill = 0 if not (value.is_floating_point() or value.is_complex()) else 1
        return torch.full(_sizes(value), fill, dtype=value.dtype, device=value.device)
    if isinstance(value, (torch.SymBool, bool)):
        return True
    if isinstance(value, (torch.SymFloat, float)):
        return 1.0
    if isinstance(value, (torch.SymInt, int)):
        return 1
    raise _Unprobable


# (target, argument kinds) -> eager's refusal or None: asked once per process
_ANSWERS: dict[tuple[Any, ...], str | None] = {}


def _refusal(node: torch.fx.Node, key: tuple[Any, ...]) -> str | None:
    if key not in _ANSWERS:
        _ANSWERS[key] = _ask(node)
    return _ANSWERS[key]


def _ask(node: torch.fx.Node) -> str | None:
    try:
        args, kwargs = torch.fx.node.map_aggregate(
            (node.args, node.kwargs),
            lambda a: _stand_in(_fake(a)) if isinstance(a, torch.fx.Node) else a,
        )
    except _Unprobable:
        return None
    error = _raised(node, args, kwargs)
    if error is None:
        return None
    if isinstance(error, NotImplementedError):
        return _one_line(error)
    # A check of eager's own that names a dtype, written as a RuntimeError (torch 2.11:
    # relu and argmax of bool, bool subtraction); believed only where the same
    # stand-ins in float32 pass, so that a shape or a value (an integer division by
    # the stand-ins' zeros) is never taken for a dtype.
    if isinstance(error, RuntimeError) and _NAMES_A_DTYPE.search(str(error)):
        in_float = torch.fx.node.map_aggregate((args, kwargs), _in_float32)
        if _raised(node, *in_float) is None:
            return _one_line(error)
    return None


_NAMES_A_DTYPE = re.compile(
    r"\b(bool|boolean|Bool|Byte|Char|Short|Int|Long|Half|BFloat16|integer|Integer)\b"
)


def _raised(node: torch.fx.Node, args: Any, kwargs: Any) -> Exception | None:
    """What calling `node`'s target on `args` raised, or None."""
    try:
        with torch.no_grad():
            if node.op == "call_method":
                self_arg, *rest = args
                getattr(self_arg, str(node.target))(*rest, **kwargs)
            else:
                node.target(*args, **kwargs)  # type: ignore[operator]  # a callable target
    except Exception as exc:
        return exc
    return None


def _in_float32(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) else value


def _one_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


@contextmanager
def _generators_kept() -> Iterator[None]:
    """The CPU's and each initialised CUDA device's random number generator states
    restored after the probes, whatever they ran."""
    cpu = torch.get_rng_state()
    initialised = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # torch stub
    cuda = torch.cuda.get_rng_state_all() if initialised else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
