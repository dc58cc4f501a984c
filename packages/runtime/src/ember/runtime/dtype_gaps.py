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
run once, eagerly, on stand-ins of the same dtypes and numbers of dimensions: ones,
each size cut to at most 8 (equal sizes stay equal, ones stay one), for a node of
floating-point tensors; zeros (valid as indices) at its own sizes, and only where
they are small, for a node with an integer or bool tensor (`_cut`). A factory call
(`arange(..., dtype=torch.bool)`) is asked as it is, where its output is small.
Where the stand-ins go is what keeps the probe from harming the process:

- a CPU node, on the CPU: its kernels check indices with exceptions;
- a CUDA node whose tensors are all floating point, on its GPU: no value of ones is
  out of any range, and only there does the GPU's own dtype support show (`igamma`
  takes bfloat16 on the CPU, not on CUDA);
- a CUDA node with an integer or bool tensor, on the CPU (zeros as LU pivots set off
  a device-side assert on the H100, which ends the CUDA context), except for ops
  whose integers are data and never indices (`_NO_INDICES`: matrix products,
  pooling, upsampling, convolutions), which CUDA refuses where the CPU does not and
  which are asked on the GPU. A CPU refusal counts for a CUDA node only if it is
  about its integers (it stays with the floating-point stand-ins in float32: the
  CPU refuses bfloat16 margin losses, CUDA runs them);
- never a node with integer tensors of LAPACK, sparse or `_unsafe` ops
  (`_UNCHECKED_INTEGERS`): LAPACK's pivots count from 1 unchecked, and zeros as
  `linalg.ldl_solve`'s pivots corrupted the CPU's heap.
- never anything but torch's own code (`_torchs_own`: no custom op, no
  `allow_in_graph` function, no higher-order operator such as a user's Triton kernel,
  which would run with its real grid on stand-ins), never a collective
  (`_communicates`: one rank would wait for the others), and never a graph with an
  autocast region (answers are keyed by the ambient autocast state).

Empty stand-ins, which no kernel reads, were tried and rejected: the CPU's flash
attention divides by their sizes (SIGFPE). Common floating-point ops that take every
floating dtype on both devices (`_FLOAT_OK`) are not asked, to spare the GPU loading
kernels ember never runs (a bfloat16 GPT-2's probe took 1.4 s on the H100 without
that list).

A `NotImplementedError` there is eager's refusal of that dtype; so is a RuntimeError
that names a dtype where the same stand-ins in float32 pass (torch 2.11 words some
of its dtype checks so). Errors of any other kind (a shape the stand-ins do not
satisfy, say) prove nothing and are ignored. Each (target, argument kinds) is asked
once per process, and the random number generators' states are restored afterwards.
`torch.export` programs are asked the same way, before decomposition, and one with
such a node is refused a package (`ember.runtime.aot`).

A graph with such a node runs eagerly, where that node raises eager's own error
(strict mode raises at compile time instead, naming the node). A false alarm only
costs speed: the graph then runs eagerly, correctly.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

# dtypes every ATen kernel of a floating-point op takes (no refusal seen in the OpInfo
# sweep on the CPU or CUDA); a node reading only these is not asked
_ALWAYS_SUPPORTED = frozenset({torch.float32, torch.float64})

# names of targets that take any dtype (shape, view and conversion ops, item access):
# not asked, to save the time
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


# names of ops that take every floating dtype on the CPU and CUDA (and are frequent in
# models): a node whose tensors are all floating point is not asked about them
_FLOAT_OK = frozenset(
    {
        "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "conv1d", "conv2d",
        "conv3d", "convolution", "layer_norm", "batch_norm", "rms_norm",
        "softmax", "log_softmax", "_softmax", "gelu", "silu", "relu", "relu_",
        "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow", "div", "truediv",
        "sub", "neg", "mean", "sum", "amax", "max", "min", "abs", "erf", "cos", "sin",
        "scaled_dot_product_attention", "embedding", "dropout", "adaptive_avg_pool2d",
        "avg_pool2d", "max_pool2d", "hardswish", "hardsigmoid", "softplus", "cumsum",
        "iadd", "imul", "floordiv", "square", "clamp", "maximum", "minimum", "tril",
        "triu", "mse_loss", "flip",
        "roll", "var", "std", "norm", "outer", "einsum", "logsumexp", "argmax",
    }
)  # fmt: skip


# the floating dtypes _FLOAT_OK speaks for (not float8, which many of its ops refuse)
_ORDINARY_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


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
    if any("autocast" in _target_name(n) for n in gm.graph.nodes if n.op == "call_function"):
        return None  # eager runs those nodes under autocast, which the probe does not
    with _generators_kept():
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method"):
                continue
            name = _target_name(node)
            if name in _NOT_ASKED or not _torchs_own(node) or _communicates(node):
                continue
            dtypes = _asked_dtypes(node)
            if not dtypes or all(d in _ALWAYS_SUPPORTED for d in dtypes):
                continue
            if name in _FLOAT_OK and all(d in _ORDINARY_FLOATS for d in dtypes):
                continue
            key = _signature(node, name)
            if key is None or not _small_enough(node):
                continue
            error = _refusal(node, key)
            if error is not None:
                names = tuple(str(d).removeprefix("torch.") for d in dtypes)
                return DtypeGap(node.name, name, names, error)
    return None


_SMALL_FACTORY = 4096  # elements: a factory call (no tensor input) asked at its own size


def _tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The fake values of `node`'s tensor inputs."""
    return [t for a in node.all_input_nodes if isinstance(t := _fake(a), torch.Tensor)]


def _asked_dtypes(node: torch.fx.Node) -> list[torch.dtype]:
    """The dtypes a node is asked about: its tensor inputs', or for a factory call
    (`arange(..., dtype=torch.bool)`) the `dtype` it is given, where its output is
    small enough to make as it is."""
    tensors = _tensors(node)
    if tensors:
        return [t.dtype for t in tensors]
    dtype, out = node.kwargs.get("dtype"), _fake(node)
    if not isinstance(dtype, torch.dtype) or not isinstance(out, torch.Tensor):
        return []
    return [dtype] if _numel_hint(out) <= _SMALL_FACTORY else []


def _numel_hint(fake: torch.Tensor) -> int:
    numel = 1
    for size in fake.shape:
        hint = size if isinstance(size, int) else getattr(size.node, "hint", None)
        numel *= hint if isinstance(hint, int) else _SMALL_FACTORY + 1
    return numel


# namespaces of ATen-level ops that talk to other processes
_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "c10d", "_dtensor"})


def _namespace(target: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> str:
    """An op's namespace ("aten"); a packet takes any unknown attribute for an overload
    name, so its namespace is read off its qualified name."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target.namespace)
    return str(target._qualified_op_name).split("::", 1)[0]


def _torchs_own(node: torch.fx.Node) -> bool:
    """Whether `node` calls torch's own code: a tensor method, an ATen or prims op, a
    function of a `torch` module or of `operator`. Anything else (a custom op, a
    function under `allow_in_graph`) is the user's code, which the probe must not run
    a second time (it may count, log or write); where it refuses a dtype, it is an
    ATen-level call of ember's too and raises eager's error itself."""
    target = node.target
    if node.op == "call_method":
        return True
    if isinstance(target, torch._ops.HigherOrderOperator):
        return False  # a user's Triton kernel, a print, a wrapped subgraph: not run
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return _namespace(target) in ("aten", "prims")
    module = str(getattr(target, "__module__", "") or "")
    return module == "_operator" or module == "torch" or module.startswith("torch.")


def _communicates(node: torch.fx.Node) -> bool:
    """Whether `node` is a collective or other call to other processes (an all-reduce,
    an all-gather of bfloat16 shards under FSDP, a wait): run by this process alone on
    stand-ins, it would wait for ranks that never join it. Never asked."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return _namespace(target) in _COLLECTIVE_NAMESPACES
    module = str(getattr(target, "__module__", "") or "")
    return module.startswith("torch.distributed")


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
        cut = _cut(node)
        flat = torch.fx.node.map_aggregate((node.args, node.kwargs), lambda v: _describe(v, cut))
    except _Unprobable:
        return None
    parts.append(repr(flat))
    parts.append(_asked_on(node))
    parts.append(_autocast_state())  # autocast changes the dtypes ops see
    return tuple(parts)


def _autocast_state() -> tuple[Any, ...]:
    return tuple(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")
    )


def _integral(node: torch.fx.Node) -> bool:
    return any(not (t.is_floating_point() or t.is_complex()) for t in _tensors(node))


def _cut(node: torch.fx.Node) -> bool:
    """Whether `node`'s stand-ins have their sizes cut: not where it has an integer
    tensor, whose size may be tied to another's in ways a cut breaks (a flat index
    into a tensor, an index list as long as a dimension), which an op without checks
    of its own would then follow out of bounds. Such nodes are asked at their own
    sizes, and only where those are small (`_small_enough`)."""
    return not _integral(node)


def _small_enough(node: torch.fx.Node) -> bool:
    """Whether `node` may be asked: a floating-point node whose cut stand-ins are
    small (8 per dimension is still large in many dimensions); a node with an integer
    tensor where all its tensors are small and its name holds none of
    _UNCHECKED_INTEGERS."""
    if _cut(node):
        return all(math.prod(_sizes(t)) <= _MOST_EXACT for t in _tensors(node))
    name = _target_name(node).lower()
    if any(word in name for word in _UNCHECKED_INTEGERS):
        return False
    return all(_numel_hint(t) <= _MOST_EXACT for t in _tensors(node))


def _asked_on(node: torch.fx.Node) -> torch.device | None:
    """Where `node`'s stand-ins go: its own device, except the CPU for a CUDA node with
    an integer or bool tensor (see the module's docstring); None to leave each
    stand-in on its own tensor's device."""
    on_gpu = any(t.device.type == "cuda" for t in _tensors(node))
    if not (on_gpu and _integral(node)) or _target_name(node) in _NO_INDICES:
        return None
    return torch.device("cpu")


# ops whose integer tensors are data, never indices, offsets or pivots: no value of
# theirs is out of range for a GPU kernel, so CUDA nodes of theirs are asked on the
# GPU (CUDA refuses integer matrix products, upsampling of bytes and dropout's
# backward of integers, which the CPU takes; OpInfo sweep, H100, torch 2.11)
_NO_INDICES = frozenset(
    {
        "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "dot", "vdot", "mv",
        "inner", "outer", "bilinear", "linear", "einsum", "tensordot", "addmm",
        "addmv", "baddbmm", "addbmm", "interpolate", "upsample_bilinear",
        "upsample_nearest", "native_dropout_backward", "max_pool1d", "max_pool2d",
        "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "conv1d", "conv2d",
        "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
        "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d",
        "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
    }
)  # fmt: skip

# words in the names of ops whose integer tensors no value makes safe: LAPACK's
# pivots count from 1 and are not checked (zeros as `linalg.ldl_solve`'s pivots
# corrupted the CPU's heap, `double free or corruption`, GPU machine, torch 2.11),
# and sparse tensors' index arrays are not checked either. A node with an integer
# tensor and one of these words in its name is not asked.
_UNCHECKED_INTEGERS = ("linalg", "lu_", "ldl", "lapack", "cholesky", "sparse", "_unsafe")


class _Unprobable(Exception):
    pass


def _describe(value: Any, cut: bool) -> Any:
    if isinstance(value, torch.fx.Node):
        fake = _fake(value)
        if isinstance(fake, torch.Tensor):
            return ("tensor", fake.dtype, _sizes(fake, cut), fake.device.type)
        if isinstance(fake, (torch.SymInt, int, torch.SymFloat, float, torch.SymBool, bool)):
            return ("number", type(_stand_in(fake)).__name__)
        raise _Unprobable
    return value


_MOST = 8  # a floating-point stand-in's largest size in any dimension
_MOST_EXACT = 1 << 16  # elements: the largest tensor of a node with integers asked


def _sizes(fake: torch.Tensor, cut: bool = True) -> tuple[int, ...]:
    """A fake tensor's sizes, cut to at most _MOST where `cut`; a symbolic size by its
    hint, read without a guard (1 where it has none)."""
    sizes = []
    for size in fake.shape:
        if not isinstance(size, int):
            hint = getattr(size.node, "hint", None)
            size = hint if isinstance(hint, int) else 1
        sizes.append(min(size, _MOST) if cut else size)
    return tuple(sizes)


def _stand_in(value: Any, device: torch.device | None = None, cut: bool = True) -> Any:
    """A stand-in for a fake value: a tensor of ones (zeros for integers) of `_sizes`
    on `device` (its own where None), a number 1."""
    if isinstance(value, torch.Tensor):
        fill = 1 if value.is_floating_point() or value.is_complex() else 0
        where = device if device is not None else value.device
        return torch.full(_sizes(value, cut), fill, dtype=value.dtype, device=where)
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
    device, cut = _asked_on(node), _cut(node)
    kw = {"device": device} if device is not None and "device" in node.kwargs else {}
    try:
        args, kwargs = torch.fx.node.map_aggregate(
            (node.args, {**node.kwargs, **kw}),
            lambda a: _stand_in(_fake(a), device, cut) if isinstance(a, torch.fx.Node) else a,
        )
    except Exception:  # a dtype torch cannot fill (float4, bits8), no memory: no answer
        return None
    error = _raised(node, args, kwargs)
    if error is None:
        return None
    if device is not None:
        # asked on the CPU for a CUDA node: only a refusal naming a dtype is the
        # CPU's word on dtypes ("Could not run 'aten::X' with arguments from the 'CPU'
        # backend" is an op the CPU lacks, as int4 matrix products)
        if not _NAMES_A_DTYPE.search(str(error)):
            return None
        # the CPU speaks for a CUDA node's integers only: a refusal that goes away
        # with its floating-point stand-ins in float32 was about those, which the
        # GPU may take (multi_margin_loss in bfloat16: CUDA yes, the CPU no)
        floats_widened = torch.fx.node.map_aggregate((args, kwargs), _floats_in_float32)
        if _raised(node, *floats_widened) is None:
            return None
    if isinstance(error, NotImplementedError):
        return first_line(error)
    # A check of eager's own that names a dtype, written as a RuntimeError (torch 2.11:
    # relu and argmax of bool, bool subtraction); believed only where the same
    # stand-ins in float32 pass, so that a shape or a value (an integer division by
    # the stand-ins' zeros) is never taken for a dtype.
    if isinstance(error, RuntimeError) and _NAMES_A_DTYPE.search(str(error)):
        in_float = torch.fx.node.map_aggregate((args, kwargs), _in_float32)
        if _raised(node, *in_float) is None:
            return first_line(error)
    return None


_NAMES_A_DTYPE = re.compile(
    r"\b(bool|[Bb]oolean|Bool|Byte|Char|Short|Int|Long|Half|BFloat16|[Ii]nteger)\b"
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


def _floats_in_float32(value: Any) -> Any:
    floating = isinstance(value, torch.Tensor) and value.is_floating_point()
    return value.float() if floating else value


def first_line(error: BaseException, limit: int = 200) -> str:
    """`error` as its type and the first non-blank line of its message, at most
    `limit` characters (for logs and reports)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:limit]


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
