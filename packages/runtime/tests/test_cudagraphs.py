"""What decides whether a graph is recorded as a CUDA graph, checked without a GPU:
`graph_blocker` on graphs traced with fake CUDA tensors, and torch.compile's `mode`
and `options` as ember settings. The recordings themselves are tested on the GPU
(tests/cuda/test_graph_replays.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from ember.runtime import cudagraphs
from ember.runtime.backend import call_settings
from ember.runtime.compiler import compile_records
from ember.runtime.config import EmberConfigError, config


def _traced(fn: Callable[..., Any], *shapes: tuple[int, ...], device: str = "cuda") -> Any:
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = [torch.empty(shape, device=device) for shape in shapes]
        return make_fx(fn)(*inputs)


def test_a_pure_cuda_graph_can_be_recorded() -> None:
    gm = _traced(lambda x, w: torch.relu(x @ w), (4, 4), (4, 4))
    assert cudagraphs.graph_blocker(gm, [], "off") is None


def test_writing_an_input_blocks_unless_it_is_static() -> None:
    def writes_a_view(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x[1:].mul_(2)
        return x @ w

    gm = _traced(writes_a_view, (4, 4), (4, 4))
    assert "writes input x_1" in str(cudagraphs.graph_blocker(gm, [1], "off"))
    assert cudagraphs.graph_blocker(gm, [0], "off") is None  # a buffer: written in place


def test_cpu_tensors_syncs_and_check_block() -> None:
    cpu = _traced(lambda x: x * 2, (4,), device="cpu")
    assert cudagraphs.graph_blocker(cpu, [], "off") == "the graph has CPU tensors"
    mixed = _traced(lambda x: x.cpu() * 2, (4,))
    assert cudagraphs.graph_blocker(mixed, [], "off") == "the graph has CPU tensors"
    syncs = _traced(lambda x: x.sum(), (4,))
    (total,) = [n for n in syncs.graph.nodes if n.op == "call_function"]
    with syncs.graph.inserting_after(total):
        syncs.graph.call_function(torch.ops.aten._local_scalar_dense.default, (total,))
    assert "waits for the device" in str(cudagraphs.graph_blocker(syncs, [], "off"))
    fine = _traced(lambda x: x * 2, (4,))
    assert "EMBER_CHECK" in str(cudagraphs.graph_blocker(fine, [], "raise"))


def test_a_collective_blocks() -> None:
    gm = _traced(lambda x: x * 2, (4,))
    (double,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    with gm.graph.inserting_after(double):
        reduce = torch.ops._c10d_functional.all_reduce.default
        gm.graph.call_function(reduce, (double, "sum", "0"))
    assert "is a collective" in str(cudagraphs.graph_blocker(gm, [], "off"))


def test_a_graph_of_views_launches_nothing() -> None:
    views = _traced(lambda x: (x.t()[1:], x.view(16).unsqueeze(0)), (4, 4))
    assert cudagraphs.launches_nothing(views)
    assert not cudagraphs.launches_nothing(_traced(lambda x: x.t() * 2, (4, 4)))
    # an in-place op returns an alias of its input, but writes it
    assert not cudagraphs.launches_nothing(_traced(lambda x: x.mul_(2), (4, 4)))
    # the compile path leaves such a graph plain, under `on` too, and says why
    from ember.runtime.compiler import CompileRecord, _graphed

    def call(args: list[Any]) -> Any:
        return args

    record = CompileRecord(graph="views")
    with config.scope(cudagraphs="on"):
        assert _graphed(call, views, record, []) is call
    assert record.cudagraphs == "off: the graph launches nothing (views only)"


def test_mode_and_options_become_settings() -> None:
    assert call_settings(None, None)["cudagraphs"] == config.cudagraphs
    assert call_settings("reduce-overhead", None)["cudagraphs"] == "on"
    assert call_settings("max-autotune-no-cudagraphs", None)["cudagraphs"] == "off"
    settings = call_settings("reduce-overhead", {"cudagraphs": "off", "strict": True})
    assert settings["cudagraphs"] == "off" and settings["strict"] is True
    with pytest.raises(EmberConfigError, match=r"torch.compile\(mode='fastest'\)"):
        call_settings("fastest", None)
    with pytest.raises(EmberConfigError, match=r"options=\{'cuda_graphs'"):
        call_settings(None, {"cuda_graphs": "on"})
    with pytest.raises(EmberConfigError, match="EMBER_CUDAGRAPHS"):
        call_settings(None, {"cudagraphs": "sometimes"})


def test_options_reach_the_compile_and_a_bad_mode_is_an_error() -> None:
    start = len(compile_records)
    compiled = torch.compile(lambda x: x.exp() + 1, backend="ember", options={"kernels": "extern"})
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), x.exp() + 1)
    (record,) = compile_records[start:]
    assert record.fused_kernels == 0  # 'extern': ATen kernels only
    assert record.cudagraphs == "no CUDA tensors"
    torch._dynamo.reset()
    bad = torch.compile(lambda x: x + 1, backend="ember", mode="fastest")
    with pytest.raises(Exception, match="mode='fastest'"):
        bad(x)


def test_recorded_addresses_leave_with_their_recordings() -> None:
    # The lent and static address sets hold what live recordings use: an address
    # stays while any recording that registered it lives, and leaves with the last.
    import gc

    from ember.runtime.cudagraphs import _Addresses

    class Owner:
        pass

    addresses = _Addresses()
    first, second = Owner(), Owner()
    addresses.register(first, [16, 32])
    addresses.register(second, [32])
    assert 16 in addresses and 32 in addresses and len(addresses) == 2
    del first
    gc.collect()
    assert 16 not in addresses and 32 in addresses
    del second
    gc.collect()
    assert 32 not in addresses and len(addresses) == 0
