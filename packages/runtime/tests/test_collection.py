"""Full garbage collections deferred while a graph compiles (ember.runtime.collection)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import torch

from ember.runtime import collection
from ember.runtime.collection import full_collections_deferred


@pytest.fixture(autouse=True)
def _thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_raised_while_compiling_and_restored_after() -> None:
    with full_collections_deferred():
        assert gc.get_threshold() == (700, 10, collection._FULL_EVERY)
        with full_collections_deferred():  # nested: one change, undone by the outer
            assert gc.get_threshold()[2] == collection._FULL_EVERY
        assert gc.get_threshold()[2] == collection._FULL_EVERY
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_when_the_compile_raises() -> None:
    with pytest.raises(RuntimeError), full_collections_deferred():
        raise RuntimeError("lowering failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_and_a_change_made_meanwhile_are_kept() -> None:
    gc.set_threshold(700, 10, 5000)
    with full_collections_deferred():
        assert gc.get_threshold()[2] == 5000
    assert gc.get_threshold() == (700, 10, 5000)
    gc.set_threshold(700, 10, 10)
    with full_collections_deferred():
        gc.set_threshold(500, 5, 20)  # the program's own choice, made during a compile
    assert gc.get_threshold() == (500, 5, 20)


def test_overlapping_compiles_in_two_threads_share_one_change() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with full_collections_deferred():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with full_collections_deferred():
        thread.start()
        assert inside.wait(10)
    # this thread's compile ended first: the other's is still running
    assert gc.get_threshold()[2] == collection._FULL_EVERY
    release.set()
    thread.join(10)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_backend_compiles_under_it() -> None:
    seen: list[int] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    original = collection.full_collections_deferred

    def recording() -> object:
        seen.append(1)
        return original()

    import ember.runtime.backend as backend

    backend_original = backend.full_collections_deferred
    backend.full_collections_deferred = recording  # type: ignore[assignment]
    try:
        torch._dynamo.reset()
        out = torch.compile(probe, backend="ember")(torch.randn(8))
    finally:
        backend.full_collections_deferred = backend_original
    assert out.shape == (8,)
    assert seen  # the backend call and its graph's compile
    assert gc.get_threshold() == (700, 10, 10)
