"""CUDA graphs under backend="ember" (ember.runtime.cudagraphs), on a GPU: replays give
eager's values, results held across calls keep theirs, each reason not to record is
taken and said, sizes and parameters that change record again, seeded randomness is
the same graphed and not graphed, and a training loop with an optimizer ends where
the same loop without graphs ends."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.runtime import cudagraphs
from ember.runtime.compiler import CompileRecord, compile_records
from ember.runtime.config import config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path) -> Iterator[None]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    with config.scope(cache_dir=tmp_path / "cache", strict=True):
        yield
    torch._dynamo.reset()


def _records_of(run: Callable[[], Any]) -> list[CompileRecord]:
    start = len(compile_records)
    run()
    return compile_records[start:]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).cuda()


def test_inference_replays_with_eager_values_and_held_results_keep_theirs() -> None:
    model = _mlp().eval()
    compiled = torch.compile(model, backend="ember")
    inputs = [torch.randn(16, 64, device="cuda") for _ in range(5)]
    held = []
    with torch.no_grad():
        records = _records_of(lambda: held.extend(compiled(x) for x in inputs))
        expected = [model(x) for x in inputs]
    assert [r.cudagraphs for r in records] == ["recorded 1"]
    for got, want in zip(held, expected, strict=True):  # none overwritten by a later replay
        torch.testing.assert_close(got, want)
    assert len({t.data_ptr() for t in held}) == len(held)


def test_a_first_recording_in_a_fresh_process_warns_nothing() -> None:
    """The pool's keeper graph records a kernel: torch warns about empty recordings,
    and a user reads that warning as a fault of their own model."""
    script = (
        "import torch, ember.runtime\n"
        "m = torch.nn.Linear(8, 8).cuda().eval()\n"
        "c = torch.compile(m, backend='ember', mode='reduce-overhead')\n"
        "x = torch.randn(4, 8, device='cuda')\n"
        "with torch.no_grad():\n"
        "    for _ in range(3):\n"
        "        torch.testing.assert_close(c(x), m(x))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
    assert "CUDA Graph is empty" not in done.stderr


def test_inference_results_dropped_before_the_next_call_are_not_copied() -> None:
    """A caller that drops each result before the next call gets the recording's own
    memory every replay (lent, no copy out); one that keeps a result gets later
    results elsewhere, and the kept one keeps its values."""
    model = _mlp().eval()
    compiled = torch.compile(model, backend="ember", options={"cudagraphs": "on"})
    before = {id(g) for g in _graphed_calls()}
    x = torch.randn(16, 64, device="cuda")
    with torch.no_grad():
        want = model(x)
        pointers = []
        for _ in range(5):
            out = compiled(x)
            pointers.append(out.data_ptr())
            torch.testing.assert_close(out, want)
            del out
        kept = compiled(x * 2)
        kept_value = kept.clone()
        later = [compiled(x) for _ in range(3)]
    (call,) = [g for g in _graphed_calls() if id(g) not in before]
    (recording,) = call._recordings.values()
    assert recording.lent_storages and not recording.sources, "results were copied out"
    assert len(set(pointers[2:])) == 1  # replays 2..: the same lent memory each time
    assert {t.data_ptr() for t in later}.isdisjoint({kept.data_ptr()})
    torch.testing.assert_close(kept, kept_value, rtol=0, atol=0)
    for t in later:
        torch.testing.assert_close(t, want)


def test_each_reason_not_to_record_is_recorded_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def writes_input(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    def data_dependent(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2

    def on_cpu(x: torch.Tensor) -> torch.Tensor:
        return (x.cpu() * 2).sum()

    cases = {
        "writes input": writes_input,
        "data-dependent size": data_dependent,
        "CPU tensors": on_cpu,
    }
    dynamo = torch._dynamo.config
    with (
        caplog.at_level(logging.INFO, logger="ember.runtime"),
        dynamo.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True),
    ):
        for expected, fn in cases.items():
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="ember", fullgraph=True)
            x = torch.randn(8, device="cuda")
            start = len(compile_records)
            for _ in range(3):
                mine, theirs = x.clone(), x.clone()
                torch.testing.assert_close(compiled(mine), fn(theirs))
                torch.testing.assert_close(mine, theirs)
            records = compile_records[start:]
            states = [r.cudagraphs for r in records]
            assert states and all(expected in s for s in states), (expected, states)
            assert any(expected in m for m in caplog.messages), expected
    with config.scope(check="raise"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x.sin() + 1, backend="ember")
        records = _records_of(lambda: compiled(torch.randn(8, device="cuda")))
        assert "EMBER_CHECK" in records[0].cudagraphs


def test_mode_reduce_overhead_warns_where_it_cannot_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def writes_input(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1

    compiled = torch.compile(writes_input, backend="ember", mode="reduce-overhead")
    with caplog.at_level(logging.WARNING, logger="ember.runtime"):
        compiled(torch.randn(8, device="cuda"))
    assert any(
        r.levelno == logging.WARNING and "CUDA graphs off" in r.message for r in caplog.records
    )
    torch._dynamo.reset()
    off = torch.compile(lambda x: x.cos() * 3, backend="ember", options={"cudagraphs": "off"})
    records = _records_of(lambda: [off(torch.randn(8, device="cuda")) for _ in range(3)])
    assert [r.cudagraphs for r in records] == ["off"]


def test_a_buffer_written_in_place_is_graphed_and_updated_each_call() -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros((), device="cuda"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return x * self.calls

    model = Counter()
    # graphs on, not `auto`: auto's host-or-device measurement of so small a graph
    # says "device-bound" when another process keeps the GPU busy, and this test is
    # about the buffer's updates under a replay
    compiled = torch.compile(model, backend="ember", mode="reduce-overhead")
    x = torch.ones(4, device="cuda")
    with torch.no_grad():
        records = _records_of(lambda: [compiled(x) for _ in range(4)])
        out = compiled(x)
    assert records[0].cudagraphs == "recorded 1"
    assert model.calls.item() == 5
    torch.testing.assert_close(out, torch.full((4,), 5.0, device="cuda"))


def test_auto_leaves_a_device_bound_graph_plain() -> None:
    # four 8192^3 matmuls: milliseconds of device time against tens of microseconds
    # of launches, so a host hiccup cannot make the graph look host-bound
    def chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(((a @ b) @ b) @ b @ b * 1e-6)

    compiled = torch.compile(chain, backend="ember")
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    records = _records_of(lambda: [compiled(a, b) for _ in range(4)])
    assert records[0].cudagraphs.startswith("plain: device-bound"), records[0].cudagraphs
    torch.testing.assert_close(compiled(a, b), chain(a, b))
    torch._dynamo.reset()
    forced = torch.compile(lambda a, b: torch.relu(a @ b), backend="ember", mode="reduce-overhead")
    records = _records_of(lambda: [forced(a, b) for _ in range(3)])
    assert records[0].cudagraphs == "recorded 1"


def test_new_sizes_record_again_up_to_the_limit() -> None:
    # graphs forced on: under 'auto' a size whose timed call finds the device slower
    # than the host stays plain, and a tiny softmax can go either way on a fast host
    # (one run recorded 8 sizes of 10 and never reached the limit)
    compiled = torch.compile(
        lambda x: torch.softmax(x * 2, -1), backend="ember", dynamic=True, mode="reduce-overhead"
    )
    sizes = range(3, 3 + cudagraphs.MAX_RECORDINGS + 2)
    start = len(compile_records)
    for n in sizes:
        for _ in range(3):
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), torch.softmax(x * 2, -1))
    records = compile_records[start:]
    assert len(records) == 1
    assert records[0].cudagraphs.startswith(f"off: {cudagraphs.MAX_RECORDINGS} recordings")


def test_new_parameter_addresses_record_again() -> None:
    model = _mlp().eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        records = _records_of(lambda: [compiled(x) for _ in range(3)])
        for parameter in model.parameters():  # new storage, same values plus one
            parameter.data = parameter.data + 1
        got = [compiled(x) for _ in range(3)]
        want = model(x)
    for value in got:
        torch.testing.assert_close(value, want)
    assert records[0].cudagraphs == "recorded 2"


def test_seeded_dropout_is_the_same_graphed_and_not() -> None:
    def run(setting: str) -> list[torch.Tensor]:
        torch._dynamo.reset()
        model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5)).cuda()
        model.load_state_dict(state)
        compiled = torch.compile(model, backend="ember", options={"cudagraphs": setting})
        torch.manual_seed(123)
        x = torch.ones(8, 32, device="cuda")
        with torch.no_grad():
            return [compiled(x) for _ in range(4)]

    state = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5)).cuda().state_dict()
    graphed, plain = run("on"), run("off")
    for a, b in zip(graphed, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(graphed[2], graphed[3])  # each replay draws new numbers


def _train(setting: str, steps: int = 20) -> tuple[list[float], list[torch.Tensor]]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 10)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = torch.compile(model, backend="ember", options={"cudagraphs": setting})
    data = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda", generator=data)
        target = torch.randint(0, 10, (32,), device="cuda", generator=data)
        loss = nn.functional.cross_entropy(compiled(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def test_a_training_loop_ends_where_the_plain_loop_ends() -> None:
    start = len(compile_records)
    graphed_losses, graphed_params = _train("on")
    records = compile_records[start:]
    kinds = {r.graph.split("_")[0]: r.cudagraphs for r in records}
    assert kinds.get("forward", "").startswith("recorded"), kinds
    assert kinds.get("backward", "").startswith("recorded"), kinds
    assert len(cudagraphs._pools) == 1  # forward and backward share the device's pool
    plain_losses, plain_params = _train("off")
    torch.testing.assert_close(graphed_losses, plain_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(graphed_params, plain_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_inputs_with_other_strides_than_recorded_give_eager_values() -> None:
    """A recording copies inputs into buffers laid out as when it was recorded: an
    input of the same sizes but other strides is copied in as well, a broadcast one
    (stride 0, of which one slice is copied) only when it is broadcast the same way,
    and a result that is a view of an input is a view of the caller's tensor."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2 + 1, x[1]

    compiled = torch.compile(f, backend="ember", options={"cudagraphs": "on"})
    row = torch.randn(1, 32, device="cuda")
    calls = [row.expand(32, 32)] * 3 + [torch.randn(32, 32, device="cuda").t()]
    calls += [torch.randn(32, 32, device="cuda"), row.expand(32, 32)]
    for x in calls:
        got, view = compiled(x)
        torch.testing.assert_close(got, x * 2 + 1)
        assert view.data_ptr() == x[1].data_ptr()  # a view of the caller's tensor
        torch.testing.assert_close(view, x[1])


def _graphed_calls() -> list[cudagraphs.GraphedCall]:
    import gc

    return [o for o in gc.get_objects() if type(o) is cudagraphs.GraphedCall]


def test_a_training_forward_lends_its_saved_tensors_to_its_backward() -> None:
    """In a training loop, the forward's replays hand the tensors saved for the
    backward out of the recording's memory (no copy), the backward reads them and the
    saved parameters in place (no copy in), and every step after the recordings
    replays both."""
    before = {id(g) for g in _graphed_calls()}
    _train("on", steps=8)
    calls = [g for g in _graphed_calls() if id(g) not in before]
    recordings = [r for g in calls for r in g._recordings.values()]
    assert any(r.lent_storages for r in recordings), "the forward lent nothing"
    assert any(r.lent_indices for r in recordings), "the backward copied its saved inputs"
    # the weights the forward saved (torch marks no input of a backward static) are
    # read in place too, as the forward reads them
    backward = [r for r in recordings if r.lent_indices]
    assert all(r.static_indices for r in backward), "the backward copied the saved weights"
    # and the backward lends its gradients: autograd moves them into `.grad` uncopied
    assert all(r.lent_storages and not r.sources for r in backward), "gradients were copied"
    # steps 1 and 2 run plainly (warm, then recorded and replayed at step 2 under 'on'):
    # both graphs replay from step 2 on, none fell back to a plain call
    assert sorted(g.replays for g in calls) == [7, 7], [g.replays for g in calls]


def test_two_forwards_before_one_backward_give_the_plain_results() -> None:
    """Gradient accumulation over two forwards: the first forward's lent tensors are
    still held when the second runs, so the second runs plainly into memory of its
    own; the gradients equal those of the same loop without graphs."""

    def accumulate(setting: str) -> list[torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda()
        compiled = torch.compile(model, backend="ember", options={"cudagraphs": setting})
        data = torch.Generator(device="cuda").manual_seed(2)
        for _ in range(6):
            a, b = (torch.randn(16, 64, device="cuda", generator=data) for _ in range(2))
            loss = compiled(a).square().mean() + compiled(b).abs().mean()
            loss.backward()
        return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    graphed, plain = accumulate("on"), accumulate("off")
    assert len(graphed) == len(plain) == 4
    for a, b in zip(graphed, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gradients_kept_across_steps_still_give_the_plain_results() -> None:
    """`zero_grad(set_to_none=False)` keeps `.grad` alive across steps and the
    backward's replays add into it: the parameters end where the loop without graphs
    ends."""

    def run(setting: str) -> list[torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        compiled = torch.compile(model, backend="ember", options={"cudagraphs": setting})
        data = torch.Generator(device="cuda").manual_seed(3)
        for _ in range(6):
            x = torch.randn(16, 64, device="cuda", generator=data)
            optimizer.zero_grad(set_to_none=False)
            compiled(x).square().mean().backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    before = {id(g) for g in _graphed_calls()}
    graphed = run("on")
    calls = [g for g in _graphed_calls() if id(g) not in before]
    for a, b in zip(graphed, run("off"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the first step ran plainly, every later one replayed both graphs
    assert sorted(g.replays for g in calls) == [5, 5], [g.replays for g in calls]


def test_a_gradient_the_user_keeps_is_not_overwritten() -> None:
    """A reference to last step's gradient kept past `zero_grad()` keeps its values
    while later backwards replay."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda()
    compiled = torch.compile(model, backend="ember", options={"cudagraphs": "on"})
    before = {id(g) for g in _graphed_calls()}
    kept = []
    for step in range(5):
        x = torch.full((16, 64), float(step + 1), device="cuda")
        model.zero_grad()
        compiled(x).sum().backward()
        grad = model[0].weight.grad
        assert grad is not None
        kept.append((grad, grad.clone()))
    for held, value in kept:
        torch.testing.assert_close(held, value, rtol=0, atol=0)
    # step 2's gradients, lent and kept, leave the lending recording unusable: from
    # step 3 on the backward replays a second recording that copies its results out
    calls = [g for g in _graphed_calls() if id(g) not in before]
    backward = [g for g in calls if g._copying]
    assert len(backward) == 1, [(g._name, g.replays) for g in calls]
    assert sorted(g.replays for g in calls) == [4, 4], [g.replays for g in calls]


def test_a_kept_gradient_outlives_its_recording() -> None:
    """A gradient lent by a backward's replay and kept by the caller keeps its memory
    when the recordings are dropped (`torch._dynamo.reset()`): new recordings into
    the device's pool do not write over it."""
    import gc

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda()
    compiled = torch.compile(model, backend="ember", options={"cudagraphs": "on"})
    x = torch.randn(16, 64, device="cuda")
    for _ in range(3):
        model.zero_grad()
        compiled(x).sum().backward()
    kept = [p.grad for p in model.parameters()]
    assert all(g is not None for g in kept)
    values = [g.clone() for g in kept if g is not None]
    del compiled
    torch._dynamo.reset()
    gc.collect()
    # other graphs of the same sizes, recorded into the same pool, write other values
    other = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda()
    again = torch.compile(other, backend="ember", options={"cudagraphs": "on"})
    for step in range(3):
        other.zero_grad()
        (again(x * (step + 2.0)).sum() * 7.0).backward()
    for held, value in zip(kept, values, strict=True):
        torch.testing.assert_close(held, value, rtol=0, atol=0)
