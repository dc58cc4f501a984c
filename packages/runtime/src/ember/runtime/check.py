"""Check mode (`EMBER_CHECK=1`, `config.scope(check=True)`): is a wrong answer ember's fault?

With check mode on, each compiled graph also runs eagerly (its ATen graph, op by op)
on copies of the same inputs, and ember compares, output by output:
- metadata, as torch's fake-vs-real crossref checks do: dtype, sizes, and strides
  (only of dimensions longer than one, where a stride can matter);
- values, with the accuracy rule of `ember.runtime.accuracy`;
- inputs the graph mutates in place (copy_ epilogues, batch-norm statistics): the
  compiled run's inputs afterwards must equal the eager run's copies afterwards.

On the first divergence ember raises `EmberCheckError` (the default, `EMBER_CHECK=1` or
`raise`), or warns once per graph with `EmberCheckWarning` and goes on (`warn`). The
message names the graph, the output, the error and the tolerance, and where the graph's
debug dump is: `EMBER_DEBUG_DIR/<run>/<graph>` when set, otherwise a small dump (the ATen graph
as Python and the wrapper's path) is written to `<cache_dir>/check/<graph>`.

Caveats, by design: inputs are copied before the compiled call because the compiled
wrapper empties the boxed argument list and may write into inputs; the copies do not
alias each other, so a graph whose inputs alias each other is checked as if they did
not. Graphs with random ops (dropout, rand) replay the same generator state for the
eager run, but fused random numbers need not match eager's, so only their metadata is
checked. Check mode roughly doubles the time of each call: it is a debugging tool.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ember.runtime.accuracy import Comparison, compare, tolerance
from ember.runtime.config import cache_directory, config
from ember.runtime.debug import run_directory
from ember.runtime.store import secure_directory

log = logging.getLogger("ember.runtime.check")


class EmberCheckError(RuntimeError):
    """A compiled graph's result differs from running the same graph eagerly."""


class EmberCheckWarning(UserWarning):
    """The warning issued in `EMBER_CHECK=warn` mode."""


def has_random_ops(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph draws random numbers (ops tagged nondeterministic_seeded)."""
    return any(
        isinstance(node.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in node.target.tags
        for node in gm.graph.nodes
    )


def metadata_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why two tensors' dtype, sizes or strides differ, or None when they agree."""
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, eager {expected.dtype}"
    if actual.shape != expected.shape:
        return f"sizes {list(actual.shape)}, eager {list(expected.shape)}"
    for dim, size in enumerate(expected.shape):
        if size > 1 and actual.stride(dim) != expected.stride(dim):
            return f"strides {list(actual.stride())}, eager {list(expected.stride())}"
    return None


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.preserve_format)
    return value


def _rng_states() -> tuple[torch.Tensor, list[torch.Tensor]]:
    initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # torch stub
    cuda = torch.cuda.get_rng_state_all() if initialized else []
    return torch.get_rng_state(), cuda


def _set_rng_states(states: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    torch.set_rng_state(states[0])
    if states[1]:
        torch.cuda.set_rng_state_all(states[1])


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def first_divergence(
    actual: list[Any], expected: list[Any], *, values: bool = True
) -> tuple[int, str, Comparison | None] | None:
    """(index, what differs, value verdict) of the first differing tensor, or None."""
    if len(actual) != len(expected):
        return -1, f"{len(actual)} outputs, eager has {len(expected)}", None
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if not isinstance(e, torch.Tensor):
            if isinstance(a, torch.Tensor) or a != e:
                return index, f"value {a!r}, eager {e!r}", None
            continue
        if not isinstance(a, torch.Tensor):
            return index, f"a {type(a).__name__}, eager a tensor", None
        meta = metadata_mismatch(a, e)
        if meta is not None:
            return index, meta, None
        if values:
            verdict = compare(a, e)
            if not verdict.ok:
                return index, verdict.describe(), verdict
    return None


def _dump_location(
    graph: str,
    eager_gm: torch.fx.GraphModule,
    wrapper: Path | None,
    debug_dir: Path | None,
    cache_dir: Callable[[], Path],
) -> Path:
    """Where a divergence is dumped: the graph's debug directory where it exists,
    else a private one in the cache (`cache_dir`, made only when needed)."""
    directory = run_directory(debug_dir) / graph if debug_dir is not None else None
    if directory is not None and directory.exists():
        return directory
    directory = secure_directory(cache_dir() / "check") / graph  # made 0700, as the cache
    directory.mkdir(exist_ok=True)
    (directory / "graph.py").write_text(eager_gm.code)
    (directory / "wrapper_path.txt").write_text(f"{wrapper}\n")
    return directory


def checked(
    call: Callable[[list[Any]], Any],
    eager_gm: torch.fx.GraphModule,
    graph: str,
    wrapper: Path | None = None,
) -> Callable[[list[Any]], Any]:
    """Wrap a compiled boxed callable so each call is also run eagerly and compared.
    The settings are the compile's (read here), not those in force at each call."""
    random = has_random_ops(eager_gm)
    warned = False
    mode, debug_dir = config.check, config.debug_dir
    cache, directory = config.cache, config.get("cache_dir")

    def cache_of() -> Path:
        return cache_directory(cache, directory)

    def run(args: list[Any]) -> Any:
        nonlocal warned
        inputs = list(args)  # the compiled call empties `args`
        eager_inputs = [_copy(a) for a in inputs]
        before = _rng_states()
        outputs = call(args)
        after = _rng_states()
        _set_rng_states(before)
        with torch.no_grad():
            expected = eager_gm(*eager_inputs)
        _set_rng_states(after)
        found = first_divergence(_as_list(outputs), _as_list(expected), values=not random)
        what = "output"
        if found is None:
            found = first_divergence(inputs, eager_inputs, values=not random)
            what = "input (mutated in place)"
        if found is None:
            return outputs
        index, detail, verdict = found
        dtype = getattr(_as_list(expected)[index] if what == "output" else None, "dtype", None)
        tol = f" (rtol, atol = {tolerance(dtype)})" if verdict is not None and dtype else ""
        dump = _dump_location(graph, eager_gm, wrapper, debug_dir, cache_of)
        message = (
            f"EMBER_CHECK: graph {graph!r} diverges from eager at {what} {index}: "
            f"{detail}{tol}. Debug dump: {dump}. "
            "(EMBER_DEBUG_DIR=<dir> dumps every stage of each graph.)"
        )
        if mode == "warn":
            if not warned:
                warned = True
                warnings.warn(message, EmberCheckWarning, stacklevel=2)
            return outputs
        raise EmberCheckError(message)

    return run
