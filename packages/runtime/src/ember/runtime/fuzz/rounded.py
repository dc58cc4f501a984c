"""Eager, with every low-precision op computed in float32 and rounded once.

Ember computes float16 and bfloat16 ops in float32 and rounds each result to its dtype,
as eager does in principle. Some of eager's own CPU kernels are not correctly rounded:
its float16 `rsqrt(1.39453125)` is 0.84716796875, one ulp from 0.8466796875 (fuzzer
seed 120245). Later ops can amplify that ulp (a cosine, then a matmul) until ember,
the correctly rounded one, is further from the float64 reference than eager: a
mismatch that is eager's, not ember's.

`RoundedOps` is a dispatch mode that runs each ATen op whose tensor arguments include
float16 or bfloat16 on float32 copies and rounds its floating results to the dtypes
eager's op gives them (found on meta tensors). It is a second oracle for the fuzzer:
a result that misses eager's but matches this one, under the same accuracy rule, is
not a finding. In-place and view ops run as they are (a float32 copy would break
their aliasing), as do random ops (they would draw differently) and ops without a
meta kernel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_LOW = frozenset({torch.float16, torch.bfloat16})


def _is_low(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _LOW


class RoundedOps(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch stub
    """`with RoundedOps(): ...` runs low-precision ops in float32, rounding once."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        if (
            not any(_is_low(v) for v in tree_flatten((args, kwargs))[0])
            or schema.is_mutable
            or any(r.alias_info is not None for r in schema.returns)
            or torch.Tag.nondeterministic_seeded in func.tags
        ):
            return func(*args, **kwargs)
        try:
            meta_args, meta_kwargs = tree_map(
                lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (args, kwargs)
            )
            dtypes = func(*meta_args, **meta_kwargs)
        except Exception:  # no meta kernel: this op runs as eager runs it
            return func(*args, **kwargs)
        wide_args, wide_kwargs = tree_map(lambda v: v.float() if _is_low(v) else v, (args, kwargs))
        return _round(func(*wide_args, **wide_kwargs), dtypes)


def _round(value: Any, like: Any) -> Any:
    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor):
        return value.to(like.dtype) if value.dtype != like.dtype else value
    if isinstance(value, tuple | list) and isinstance(like, tuple | list):
        return type(value)(_round(v, w) for v, w in zip(value, like, strict=True))
    return value
