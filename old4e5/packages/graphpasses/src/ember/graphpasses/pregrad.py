"""Attention on the Torch-level graph Dynamo hands a backend, before AOTAutograd.

The ATen patterns (`patterns/attention.py`) run on AOTAutograd's graphs, after forward
and backward are split. In training the forward graph saves the softmax output for the
backward, so there the attention pattern cannot fire and both directions run the
unfused math. This pass rewrites hand-written attention on the graph Dynamo captured,
before AOTAutograd traces it, into `torch.nn.functional.scaled_dot_product_attention`;
AOTAutograd then traces SDPA and SDPA's own backward (flash or memory-efficient
attention where ATen has them).

What is matched, in Dynamo's spellings (methods, `torch.*`, `operator.*`):

    [dropout that is a no-op](softmax_{dim=-1}(scale_s(q_s @ k_s^T) [+ mask])) @ v

- `@` is `operator.matmul`, `torch.matmul`, `torch.bmm` or the `matmul`/`bmm` methods;
- `k^T` is any op that swaps the last two dims: `transpose`/`swapaxes`/`swapdims` (method
  or function, any dim spelling), `permute` with the last two dims swapped, `.mT`;
- each `scale_*` is zero or more `* c` / `c *` / `/ c` with `c` a Python number, on the
  scores, on q, or on k (before or after its transpose); the factors multiply into
  SDPA's `scale` (no factor at all is `scale=1.0`, not SDPA's default);
- the optional mask is one additive tensor (either operand order) of q's dtype whose
  sum with the scores keeps the scores' shape; it becomes `attn_mask`;
- softmax is the method, `torch.softmax`, `torch.special.softmax` or `F.softmax`, over
  the last dim and without a `dtype`;
- between softmax and `@ v` an `F.dropout`/`torch.dropout` is looked through only
  when it is provably the identity (`training=False` or `p=0`). Active dropout is not
  rewritten: SDPA's own dropout draws other random numbers.

A match also needs q, k, v of one floating dtype, all 3-D or all 4-D, with equal batch
dims and consistent sizes (no broadcasting in either matmul), and no other user of any
intermediate (scores, scaled scores, masked scores, probabilities), and nothing that may
mutate a tensor between the first matched op and `@ v` (Dynamo graphs are not
functionalised; SDPA reads q, k and the mask where `@ v` was). Shapes and dtypes
come from Dynamo's `meta['example_value']`; a graph without them is left alone.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ember.graphpasses.fake import copy_debug_meta, same_shape, sizes_equal
from ember.graphpasses.passes import (
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    PassResult,
    named_pass,
)

log = logging.getLogger("ember.graphpasses")

_MISSING: Any = object()

_MATMUL_FUNCTIONS: frozenset[object] = frozenset(
    {operator.matmul, torch.matmul, torch.bmm, torch.Tensor.matmul, torch.Tensor.bmm}
)
_MATMUL_METHODS = frozenset({"matmul", "bmm", "__matmul__"})
_MUL_FUNCTIONS: frozenset[object] = frozenset({operator.mul, torch.mul, torch.Tensor.mul})
_MUL_METHODS = frozenset({"mul", "__mul__", "__rmul__"})
_DIV_FUNCTIONS: frozenset[object] = frozenset(
    {operator.truediv, torch.div, torch.true_divide, torch.Tensor.div}
)
_DIV_METHODS = frozenset({"div", "true_divide", "__truediv__"})
_ADD_FUNCTIONS: frozenset[object] = frozenset({operator.add, torch.add, torch.Tensor.add})
_ADD_METHODS = frozenset({"add", "__add__", "__radd__"})
_SWAP_FUNCTIONS: frozenset[object] = frozenset(
    {torch.transpose, torch.swapaxes, torch.swapdims, torch.Tensor.transpose}
)
_SWAP_METHODS = frozenset({"transpose", "swapaxes", "swapdims"})
_PERMUTE_FUNCTIONS: frozenset[object] = frozenset({torch.permute, torch.Tensor.permute})
_MT_FUNCTIONS: frozenset[object] = frozenset({torch.ops.aten.mT, torch.ops.aten.mT.default})
# softmax's `dtype` is positional argument 3 of F.softmax (after `_stacklevel`), 2 elsewhere.
_SOFTMAX_FUNCTIONS: dict[object, int] = {
    F.softmax: 3,
    torch.softmax: 2,
    torch.special.softmax: 2,
    torch.Tensor.softmax: 2,
}


def _is(node: Any, functions: frozenset[object], methods: frozenset[str]) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def _arg(node: torch.fx.Node, index: int, name: str, default: Any = _MISSING) -> Any:
    """Argument `index` (counting the tensor itself as 0 for methods too) or kwarg `name`."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _value(node: Any) -> torch.Tensor | None:
    """Dynamo's example value of a node, if it is a tensor."""
    if not isinstance(node, torch.fx.Node):
        return None
    value = node.meta.get("example_value")
    return value if isinstance(value, torch.Tensor) else None


def _number(value: Any) -> float | None:
    """A Python number usable as a scale factor (not bool, finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _single_user(node: torch.fx.Node) -> bool:
    return len(node.users) == 1


def _strip_scale(node: Any) -> tuple[Any, float, list[torch.fx.Node]]:
    """Undo `x * c`, `c * x`, `x / c` (repeatedly): (x, product of factors, scale nodes)."""
    factor = 1.0
    chain: list[torch.fx.Node] = []
    while isinstance(node, torch.fx.Node):
        step = _scale_step(node)
        if step is None:
            break
        inner, c = step
        chain.append(node)
        factor *= c
        node = inner
    return node, factor, chain


def _scale_step(node: torch.fx.Node) -> tuple[torch.fx.Node, float] | None:
    if len(node.args) != 2:
        return None
    a, b = node.args
    if _is(node, _MUL_FUNCTIONS, _MUL_METHODS) and not node.kwargs:
        if isinstance(a, torch.fx.Node) and (c := _number(b)) is not None:
            return a, c
        if isinstance(b, torch.fx.Node) and (c := _number(a)) is not None:
            return b, c
        return None
    if _is(node, _DIV_FUNCTIONS, _DIV_METHODS):
        if any(key != "rounding_mode" or value is not None for key, value in node.kwargs.items()):
            return None
        c = _number(b)
        if isinstance(a, torch.fx.Node) and c is not None and c != 0.0:
            return a, 1.0 / c
    return None


def _last_two(dims: Any, rank: int) -> bool:
    """`dims` (two ints) name the last two dims of a rank-`rank` tensor, in either order."""
    if not isinstance(dims, tuple | list) or len(dims) != 2:
        return False
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return False
    if not all(-rank <= d < rank for d in dims):
        return False
    return {d % rank for d in dims} == {rank - 2, rank - 1}


def _untranspose(node: Any) -> torch.fx.Node | None:
    """If `node` swaps the last two dims of its input, that input."""
    if not isinstance(node, torch.fx.Node) or not node.args:
        return None
    source = node.args[0]
    value = _value(source)
    if not isinstance(source, torch.fx.Node) or value is None:
        return None
    rank = value.dim()
    if _is(node, _SWAP_FUNCTIONS, _SWAP_METHODS):
        first = _arg(node, 1, "dim0", _MISSING)
        second = _arg(node, 2, "dim1", _MISSING)
        if first is _MISSING:
            first = node.kwargs.get("axis0", _MISSING)
        if second is _MISSING:
            second = node.kwargs.get("axis1", _MISSING)
        return source if _last_two((first, second), rank) else None
    if _is(node, _PERMUTE_FUNCTIONS, frozenset({"permute"})):
        rest = node.args[1:]
        if len(rest) == 1 and isinstance(rest[0], tuple | list):
            dims = tuple(rest[0])
        elif rest:
            dims = tuple(rest)
        else:
            listed = node.kwargs.get("dims", ())
            if not isinstance(listed, tuple | list):
                return None
            dims = tuple(listed)
        if len(dims) != rank or not all(
            isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank for d in dims
        ):
            return None
        expected = (*range(rank - 2), rank - 1, rank - 2)
        return source if tuple(d % rank for d in dims) == expected else None
    if node.op == "call_function" and node.target in _MT_FUNCTIONS and len(node.args) == 1:
        return source
    if node.op == "call_function" and node.target is getattr and node.args[1:] == ("mT",):
        return source
    return None


def _is_matmul(node: Any) -> bool:
    return _is(node, _MATMUL_FUNCTIONS, _MATMUL_METHODS) and len(node.args) == 2 and not node.kwargs


def _softmax_input(node: Any) -> torch.fx.Node | None:
    """The input of a softmax over the last dim without a dtype, else None."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.op == "call_function" and node.target in _SOFTMAX_FUNCTIONS:
        dtype_index = _SOFTMAX_FUNCTIONS[node.target]
    elif node.op == "call_method" and node.target == "softmax":
        dtype_index = 2
    else:
        return None
    source = node.args[0] if node.args else None
    value = _value(source)
    if not isinstance(source, torch.fx.Node) or value is None:
        return None
    if _arg(node, dtype_index, "dtype", None) is not None:
        return None
    dim = _arg(node, 1, "dim", None)
    rank = value.dim()
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        return None
    return source if dim % rank == rank - 1 else None


def _through_noop_dropout(node: Any) -> tuple[Any, list[torch.fx.Node]]:
    """Look through dropouts that are the identity; ([input], [dropout nodes])."""
    chain: list[torch.fx.Node] = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is F.dropout:
            p = _arg(node, 1, "p", 0.5)
            training = _arg(node, 2, "training", True)
        elif node.target is torch.dropout:
            p = _arg(node, 1, "p", _MISSING)
            training = _arg(node, 2, "train", _MISSING)
        else:
            break
        if not (training is False or (_number(p) == 0.0)):
            break
        chain.append(node)
        node = node.args[0]
    return node, chain


@dataclass
class _Attention:
    """One matched attention block and the nodes it replaces."""

    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    mask: torch.fx.Node | None
    scale: float
    output: torch.fx.Node
    # Nodes that become dead, from the output backwards; erased in that order.
    chain: list[torch.fx.Node] = field(default_factory=list)
    # Nodes on q's and k's side that die only if nothing else uses them.
    maybe_dead: list[torch.fx.Node] = field(default_factory=list)


def _match(output: torch.fx.Node) -> _Attention | None:
    """Match `... @ v` ending at `output`, or None."""
    if not _is_matmul(output):
        return None
    probs_arg, v = output.args
    probs, dropouts = _through_noop_dropout(probs_arg)
    logits = _softmax_input(probs)
    if logits is None or not isinstance(v, torch.fx.Node):
        return None
    assert isinstance(probs, torch.fx.Node)
    chain = [*dropouts, probs]

    # The additive mask: the operand that does not lead to the scores matmul.
    mask: torch.fx.Node | None = None
    scaled: Any = logits
    if _is(logits, _ADD_FUNCTIONS, _ADD_METHODS) and len(logits.args) == 2:
        if any(key != "alpha" or value != 1 for key, value in logits.kwargs.items()):
            return None
        a, b = logits.args
        for scores_side, other in ((a, b), (b, a)):
            if _is_matmul(_strip_scale(scores_side)[0]) and isinstance(other, torch.fx.Node):
                chain.append(logits)
                scaled, mask = scores_side, other
                break
        else:
            return None
    scores, score_factor, score_scales = _strip_scale(scaled)
    if not _is_matmul(scores):
        return None
    chain += [*score_scales, scores]

    q_scaled, kt_scaled = scores.args
    q, q_factor, q_scales = _strip_scale(q_scaled)
    kt, kt_factor, kt_scales = _strip_scale(kt_scaled)
    k_scaled = _untranspose(kt)
    if k_scaled is None:
        return None
    k, k_factor, k_scales = _strip_scale(k_scaled)
    if not isinstance(q, torch.fx.Node) or not isinstance(k, torch.fx.Node):
        return None
    assert isinstance(kt, torch.fx.Node)
    maybe_dead = [*q_scales, *kt_scales, kt, *k_scales]

    if not all(_single_user(node) for node in chain):
        return None
    if _mutation_between([output, *chain, *maybe_dead], output):
        return None
    found = _Attention(
        q=q,
        k=k,
        v=v,
        mask=mask,
        scale=score_factor * q_factor * kt_factor * k_factor,
        output=output,
        chain=[output, *chain],
        maybe_dead=maybe_dead,
    )
    return found if _values_fit(found, logits) else None


_INPLACE_FUNCTIONS: frozenset[object] = frozenset(
    {
        operator.setitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.imatmul,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
    }
)


def _may_mutate(node: torch.fx.Node) -> bool:
    """A conservative guess: Dynamo graphs are not functionalised."""
    if "out" in node.kwargs:
        return True
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.startswith("__")
    if node.op != "call_function":
        return node.op == "call_module"
    if node.target in _INPLACE_FUNCTIONS:
        return True
    name = getattr(node.target, "__name__", "")
    if name.endswith("_") and not name.startswith("__"):
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and bool(getattr(schema, "is_mutable", False))


def _mutation_between(matched: list[torch.fx.Node], output: torch.fx.Node) -> bool:
    """Anything from the first matched node up to `output` may mutate a tensor.

    SDPA reads q, k and the mask where `@ v` was, later than the scores' matmul did.
    """
    pending = set(matched)
    node: torch.fx.Node = output
    while pending:
        pending.discard(node)
        if not pending:
            break
        node = node.prev
        if node.op in ("root", "placeholder"):
            return True  # not all matched nodes found before the output: be safe
        if node not in pending and _may_mutate(node):
            return True
    return False


def _values_fit(found: _Attention, logits: torch.fx.Node) -> bool:
    """Dtypes and shapes allow SDPA to compute exactly what the matched ops compute."""
    q, k, v = _value(found.q), _value(found.k), _value(found.v)
    out, logits_value = _value(found.output), _value(logits)
    if q is None or k is None or v is None or out is None or logits_value is None:
        return False
    if not q.is_floating_point() or not (q.dtype == k.dtype == v.dtype == out.dtype):
        return False
    if q.dim() not in (3, 4) or not (q.dim() == k.dim() == v.dim()):
        return False
    if not (sizes_equal(q.shape[:-2], k.shape[:-2]) and sizes_equal(q.shape[:-2], v.shape[:-2])):
        return False
    if not (
        sizes_equal(q.shape[-1:], k.shape[-1:]) and sizes_equal(k.shape[-2:-1], v.shape[-2:-1])
    ):
        return False
    if not sizes_equal(out.shape, (*q.shape[:-1], v.shape[-1])):
        return False
    if not sizes_equal(logits_value.shape, (*q.shape[:-1], k.shape[-2])):
        return False
    if found.mask is not None:
        mask = _value(found.mask)
        if mask is None or mask.dtype != q.dtype or mask.dim() > q.dim():
            return False
        if mask.device != q.device:
            return False
    return True


def _replace(gm: torch.fx.GraphModule, found: _Attention, example_value: Any) -> None:
    graph = gm.graph
    with graph.inserting_before(found.output):
        sdpa = graph.call_function(
            F.scaled_dot_product_attention, (found.q, found.k, found.v), _sdpa_kwargs(found)
        )
    copy_debug_meta(found.output, sdpa)
    sdpa.meta["source_fn_stack"] = [(sdpa.name, F.scaled_dot_product_attention)]
    sdpa.meta["example_value"] = example_value
    found.output.replace_all_uses_with(sdpa)
    for node in found.chain:
        graph.erase_node(node)
    for node in found.maybe_dead:  # q == k may share a scale node: erase it once
        if not getattr(node, "_erased", False) and not node.users:
            graph.erase_node(node)


def _sdpa_kwargs(found: _Attention) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if found.mask is not None:
        kwargs["attn_mask"] = found.mask
    kwargs["scale"] = found.scale
    return kwargs


def _example_value(found: _Attention) -> Any:
    """SDPA run on Dynamo's fake values; None if that fails or disagrees with the match.

    Without a fake mode (real example values), the matmul's value stands in: SDPA's
    result has its shape, dtype and device.
    """
    q, k, v = _value(found.q), _value(found.k), _value(found.v)
    expected = _value(found.output)
    if not isinstance(q, FakeTensor):
        return expected
    kwargs = _sdpa_kwargs(found)
    if found.mask is not None:
        kwargs["attn_mask"] = _value(found.mask)
    try:
        with q.fake_mode:
            value = F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    except Exception as exc:  # an input SDPA rejects: leave the attention as written
        log.debug("attention_pregrad: SDPA rejects %s: %s", found.output.name, exc)
        return None
    if expected is None or not same_shape(value, expected) or value.dtype != expected.dtype:
        return None
    return value


def _count_and_rewrite(gm: torch.fx.GraphModule) -> int:
    rewritten = 0
    for node in list(gm.graph.nodes):
        if getattr(node, "_erased", False) or node.op not in ("call_function", "call_method"):
            continue
        found = _match(node)
        if found is None:
            continue
        example_value = _example_value(found)
        if example_value is None:
            continue
        _replace(gm, found, example_value)
        rewritten += 1
    return rewritten


@named_pass("attention_pregrad", (PRESERVES_NO_MUTATION, PRESERVES_VALUES, PRESERVES_RANDOMNESS))
def rewrite_attention_pregrad(gm: torch.fx.GraphModule) -> PassResult:
    """Rewrite hand-written attention in a Dynamo graph into SDPA, in place.

    Stats: `{"attention_pregrad": number of attention blocks rewritten}`.
    """
    rewritten = _count_and_rewrite(gm)
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    log.info(
        "attention_pregrad: rewrote %d hand-written attention block(s) into "
        "scaled_dot_product_attention before AOTAutograd",
        rewritten,
    )
    return PassResult(gm, rewritten > 0, {"attention_pregrad": rewritten})
