"""Bounded in-process state (ember.runtime.bounded): memos keep their most recently
used entries, and the compile records keep the last graphs' while positions still
count every graph."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.runtime import compiler, triton_kernels
from ember.runtime.bounded import LRUCache, RecentRecords
from ember.runtime.config import config


def test_an_lru_cache_drops_the_least_recently_used_entry() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache["c"] = 3
    assert "b" not in cache and cache.get("b") is None
    assert cache.items() == [("a", 1), ("c", 3)] and len(cache) == 2
    assert cache.setdefault("a", 9) == 1 and cache.setdefault("d", 4) == 4
    assert [k for k, _ in cache.items()] == ["a", "d"]
    with pytest.raises(KeyError):
        cache["c"]
    with pytest.raises(ValueError):
        LRUCache(0)


def test_the_memos_that_grow_with_user_graphs_are_bounded() -> None:
    assert isinstance(triton_kernels._chosen, LRUCache)
    assert triton_kernels._chosen.limit == triton_kernels.CHOSEN_LIMIT
    assert triton_kernels._grid_function.cache_info().maxsize is not None


def test_recent_records_keep_positions_while_dropping_old_records() -> None:
    log: RecentRecords[int] = RecentRecords(3)
    start = len(log)
    for n in range(5):
        log.append(n)
    assert len(log) == 5 and list(log) == [2, 3, 4]
    assert log[start:] == [2, 3, 4]  # what is still held of what came since
    assert log[3:] == [3, 4] and log[-1] == 4 and log[2] == 2
    with pytest.raises(IndexError):
        log[1]
    log.clear()
    assert len(log) == 0 and list(log) == []


def test_compile_records_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "compile_records", RecentRecords(2))
    graph = make_fx(lambda x: x * 2 + 1, tracing_mode="fake")(torch.randn(4))
    start = len(compiler.compile_records)
    with config.scope(kernels="extern", strict=True):
        for n in range(3):
            compiler.compile_graph(graph, name=f"bounded{n}")
    assert len(compiler.compile_records) - start == 3  # every graph counted
    held = compiler.compile_records[start:]
    assert [r.graph.split("_")[0] for r in held] == ["bounded1", "bounded2"]
