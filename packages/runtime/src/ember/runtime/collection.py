"""CPython's full garbage collections held back while ember compiles a graph.

A full (generation 2) collection walks every object the collector tracks. Compiling
creates and keeps a great many of them (FX nodes and their fake values, SymNodes,
sympy expressions, ember's IR), and CPython starts a full collection every ten
generation-1 collections once the heap has grown by a quarter since the last one, so
a heap that grows through a compile is walked again and again. Each walk holds the
GIL, so the compile workers' feeder threads, the Triton set-up thread and everything
else in the process wait too.

While a graph compiles, the generation-2 threshold is raised (`_FULL_EVERY` instead
of CPython's 10). The young generations still collect, so short-lived cycles are
freed as before; full collections are deferred, not skipped: the count keeps growing,
so one follows soon after the compile. Newer torch releases do the same around
Dynamo's own compile; ember's hold covers what runs outside it (a lazily compiled
backward, AOTAutograd's tracing on older torch, ahead-of-time packaging).

The setting is process-wide, so a lock and a depth count make nested and concurrent
compiles share one change, undone when the last one ends; a threshold the program
set higher is never lowered. Free-threaded builds have no generations and are left
alone.
"""

from __future__ import annotations

import contextlib
import gc
import sysconfig
import threading
from collections.abc import Iterator

_FULL_EVERY = 1000  # generation-1 collections between full ones while compiling

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, ...] | None = None
_GENERATIONAL = sysconfig.get_config_var("Py_GIL_DISABLED") != 1


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Defer full garbage collections for the duration (reentrant, thread-safe)."""
    global _depth, _saved
    if not _GENERATIONAL:
        yield
        return
    with _lock:
        if _depth == 0:
            thresholds = gc.get_threshold()
            if len(thresholds) >= 3 and thresholds[0] > 0 and thresholds[2] < _FULL_EVERY:
                _saved = thresholds
                gc.set_threshold(thresholds[0], thresholds[1], _FULL_EVERY)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                now = gc.get_threshold()
                if now[2] == _FULL_EVERY:  # unless the program changed it meanwhile
                    gc.set_threshold(*_saved)
                _saved = None
