"""Checks for tests and scripts that compile through ember: did ember really run?

A graph that fails to compile runs eagerly unless `EMBER_STRICT=1` (ember.runtime.compiler),
so a test comparing ember's numbers with eager's passes whether or not ember compiled
anything. `no_eager_fallback()` closes that gap:

    with no_eager_fallback() as graphs:
        out = torch.compile(model, backend="ember")(x)
        out.sum().backward()   # include the backward: it may compile at its first call
    torch.testing.assert_close(out, model(x))
    assert any(g.graph.startswith("backward") for g in graphs)

On leaving the block it fails (`AssertionError`) when no graph compiled at all, or
when any graph compiled inside the block ran eagerly, or ran its generated kernels as
ATen ops (`kernels=True`, the default), naming each graph and its reason. A block left
by an exception is not checked (the exception says more).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ember.runtime.compiler import CompileRecord, compile_records

__all__ = ["assert_no_eager_fallback", "no_eager_fallback"]


def assert_no_eager_fallback(records: Sequence[CompileRecord], *, kernels: bool = True) -> None:
    """Fail unless `records` holds at least one graph and each went through ember's
    pipeline: not run eagerly, and (with `kernels`) its generated kernels not
    replaced by ATen ops after a kernel compile failure."""
    if not records:
        raise AssertionError("ember compiled no graph: the code under test never reached it")
    problems = [f"{r.graph} ran eagerly: {r.ran_eagerly}" for r in records if r.ran_eagerly]
    if kernels:
        problems += [
            f"{r.graph} ran its kernels as ATen ops: {r.kernel_fallback}"
            for r in records
            if r.kernel_fallback
        ]
    if problems:
        raise AssertionError(
            f"{len(problems)} of {len(records)} graphs fell back:\n" + "\n".join(problems)
        )


@contextmanager
def no_eager_fallback(*, kernels: bool = True) -> Iterator[list[CompileRecord]]:
    """Check, on leaving the block, every graph ember compiled inside it
    (`assert_no_eager_fallback`). Yields a list that then holds their records."""
    start = len(compile_records)
    graphs: list[CompileRecord] = []
    yield graphs
    graphs.extend(compile_records[start:])
    assert_no_eager_fallback(graphs, kernels=kernels)
