"""Ember's lean runtime (ember.runtime.lean_runtime): which graphs take it, and that
each of them gives the values, gradients, errors and memory behaviour that
AOTAutograd's runtime gives for the same compiled graphs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from ember.runtime import compile_records, config, lean_runtime
from ember.runtime.models import MLP
from ember.runtime.testing import no_eager_fallback

Step = Callable[[nn.Module, torch.Tensor], Any]


def _loss_step(model: nn.Module, x: torch.Tensor) -> Any:
    out = model(x)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum(o.float().square().mean() for o in outs if o.is_floating_point())
    loss.backward()
    return loss


def _run(
    model: nn.Module, x: torch.Tensor, autograd: str, step: Step = _loss_step, steps: int = 2
) -> tuple[list[Any], list[torch.Tensor | None], list[Any]]:
    """`steps` training steps of a copy of `model` compiled with EMBER_AUTOGRAD=autograd
    (backward compiled with the forward, so that CPU graphs can take the lean runtime);
    the losses, the parameters' gradients and the graphs' records."""
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    first = len(compile_records)
    compiled = torch.compile(
        twin, backend="ember", options={"autograd": autograd, "backward": "eager"}
    )
    losses = []
    for _ in range(steps):
        for p in twin.parameters():
            p.grad = None
        losses.append(step(compiled, x))
    return losses, [p.grad for p in twin.parameters()], list(compile_records[first:])


def _runtimes(records: list[Any]) -> list[str]:
    return [r.autograd for r in records if r.graph.startswith("forward")]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None
        else:
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_an_mlp_trains_through_the_lean_runtime_with_aots_exact_gradients() -> None:
    torch.manual_seed(0)
    model, x = MLP(16, 32, 4), torch.randn(8, 16)
    with no_eager_fallback():
        lean = _run(model, x, "lean")
        aot = _run(model, x, "aot")
    assert _runtimes(lean[2]) == ["ember"]
    assert _runtimes(aot[2]) == ["aot: EMBER_AUTOGRAD=aot"]
    _same(lean[0], aot[0])
    _same(lean[1], aot[1])
    # and eager's, under the accuracy rule
    ref = copy.deepcopy(model)
    _loss_step(ref, x)
    for p, q in zip(ref.parameters(), lean[1], strict=True):
        torch.testing.assert_close(q, p.grad)


class TwoHeads(nn.Module):
    """Two float outputs (one left out of the loss) and an integer one."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.a(x))
        logits = self.b(h)
        return h * 2, logits, logits.argmax(-1)


def _first_output_step(model: nn.Module, x: torch.Tensor) -> Any:
    _h, logits, index = model(x)
    assert not index.requires_grad and index.dtype == torch.int64
    loss = logits.gather(1, index[:, None]).sum()  # h's gradient is materialised as zeros
    loss.backward()
    return loss, index


def test_unused_and_integer_outputs_take_no_gradient() -> None:
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(5, 8)
    with no_eager_fallback():
        lean = _run(model, x, "lean", _first_output_step)
        aot = _run(model, x, "aot", _first_output_step)
    assert _runtimes(lean[2]) == ["ember"]
    _same([v for pair in lean[0] for v in pair], [v for pair in aot[0] for v in pair])
    _same(lean[1], aot[1])


def test_an_input_that_requires_grad_gets_its_gradient() -> None:
    torch.manual_seed(0)
    model = MLP(6, 12, 2)
    results = {}
    for autograd in ("lean", "aot"):
        x = torch.randn(4, 6, requires_grad=True)
        torch._dynamo.reset()
        compiled = torch.compile(
            copy.deepcopy(model),
            backend="ember",
            options={"autograd": autograd, "backward": "eager"},
        )
        torch.manual_seed(1)
        x = torch.randn(4, 6, requires_grad=True)
        compiled(x).sum().backward()
        results[autograd] = x.grad
    assert results["lean"] is not None
    _same([results["lean"]], [results["aot"]])


def test_retained_graph_backs_up_twice_and_double_backward_raises() -> None:
    torch.manual_seed(0)
    model, x = MLP(6, 12, 2), torch.randn(4, 6)
    compiled = torch.compile(copy.deepcopy(model), backend="ember", options={"backward": "eager"})
    first = len(compile_records)
    torch._dynamo.reset()
    out = compiled(x).square().sum()
    assert _runtimes(list(compile_records[first:])) == ["ember"]
    params = list(compiled.parameters())
    (g1,) = torch.autograd.grad(out, params[0], retain_graph=True)
    (g2,) = torch.autograd.grad(out, params[0], retain_graph=True)
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)
    (g,) = torch.autograd.grad(out, params[0], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_dynamic_sizes_save_their_symbols_for_the_backward() -> None:
    torch.manual_seed(0)
    model = MLP(6, 12, 2)
    grads = {}
    for autograd in ("lean", "aot"):
        torch._dynamo.reset()
        twin = copy.deepcopy(model)
        first = len(compile_records)
        compiled = torch.compile(
            twin,
            backend="ember",
            dynamic=True,
            options={"autograd": autograd, "backward": "eager"},
        )
        grads[autograd] = []
        for batch in (3, 7, 11):
            for p in twin.parameters():
                p.grad = None
            x = torch.randn(batch, 6, generator=torch.Generator().manual_seed(batch))
            compiled(x).square().mean().backward()
            grads[autograd] += [p.grad for p in twin.parameters()]
        forwards = [r for r in compile_records[first:] if r.graph.startswith("forward")]
        assert len(forwards) == 1  # one graph for every batch size
        if autograd == "aot":
            assert forwards[0].autograd == "aot: EMBER_AUTOGRAD=aot"
        elif lean_runtime._mark_dynamic() is None:  # a torch without the marking function
            assert forwards[0].autograd == "aot: outputs with dynamic dimensions to mark"
        else:  # outputs marked dynamic, as AOTAutograd's runtime marks them
            assert forwards[0].autograd == "ember"
            outputs = compiled(torch.randn(5, 6))
            assert getattr(outputs, "_dynamo_propagated_dynamic_indices", None) == {0}
    _same(grads["lean"], grads["aot"])


def test_autocast_graphs_run_their_traced_casts_once() -> None:
    torch.manual_seed(0)
    model, x = MLP(16, 32, 4), torch.randn(8, 16)

    def step(m: nn.Module, inp: torch.Tensor) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(inp)
        assert out.dtype == torch.bfloat16
        loss = out.float().square().mean()
        loss.backward()
        return loss

    with no_eager_fallback():
        lean = _run(model, x, "lean", step)
        aot = _run(model, x, "aot", step)
    assert _runtimes(lean[2]) == ["ember"]
    _same(lean[0], aot[0])
    _same(lean[1], aot[1])


class ReturnsAView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x.view(-1)


class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x)


def test_graphs_that_need_aots_runtime_keep_it_and_say_why() -> None:
    torch.manual_seed(0)
    model, x = ReturnsAView(), torch.randn(3, 4)
    with no_eager_fallback():
        _losses, grads, records = _run(model, x, "lean")
        ref = _run(model, x, "aot")
    (runtime,) = _runtimes(records)
    assert runtime.startswith("aot: an output is a view or alias")
    _same(grads, ref[1])


def test_a_buffer_written_in_the_graph_counts_and_bumps_its_version() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    results = {}
    for autograd in ("lean", "aot"):
        model = CountsCalls()
        torch._dynamo.reset()
        first = len(compile_records)
        compiled = torch.compile(
            model, backend="ember", options={"autograd": autograd, "backward": "eager"}
        )
        versions = [model.calls._version]
        for _ in range(3):
            compiled(x).sum().backward()
            versions.append(model.calls._version)
        results[autograd] = (int(model.calls), versions, _runtimes(list(compile_records[first:])))
    calls, versions, runtimes = results["lean"]
    assert runtimes == ["ember"]
    assert calls == 3
    assert versions == sorted(set(versions))  # every step wrote it where autograd sees
    assert results["aot"][:2] == (calls, versions)


def _inference_runtimes(records: list[Any]) -> list[str]:
    return [r.autograd for r in records if r.graph.startswith("inference")]


@pytest.mark.parametrize("model_kind", ["mlp", "view-output", "counter"])
def test_inference_graphs_call_the_compiled_graph_directly(model_kind: str) -> None:
    torch.manual_seed(0)
    make = {"mlp": lambda: MLP(8, 16, 4), "view-output": ReturnsAView, "counter": CountsCalls}
    x = torch.randn(3, 8 if model_kind == "mlp" else 4)
    outs, runtimes, counts = {}, {}, {}
    for autograd in ("lean", "aot"):
        torch.manual_seed(0)
        model = make[model_kind]().eval()
        torch._dynamo.reset()
        first = len(compile_records)
        compiled = torch.compile(model, backend="ember", options={"autograd": autograd})
        with torch.no_grad(), no_eager_fallback():
            outs[autograd] = [compiled(x), compiled(x)]
        runtimes[autograd] = _inference_runtimes(list(compile_records[first:]))
        counts[autograd] = int(getattr(model, "calls", 0))
    expected = "aot: an output is a view or alias" if model_kind == "view-output" else "ember"
    assert len(runtimes["lean"]) == 1 and runtimes["lean"][0].startswith(expected)
    assert runtimes["aot"] == ["aot: EMBER_AUTOGRAD=aot"]
    flat = [o for pair in outs["lean"] for o in (pair if isinstance(pair, tuple) else (pair,))]
    ref = [o for pair in outs["aot"] for o in (pair if isinstance(pair, tuple) else (pair,))]
    _same(flat, ref)
    assert counts["lean"] == counts["aot"] == (2 if model_kind == "counter" else 0)


def test_a_lazily_compiled_backward_runs_on_the_lean_runtime_too() -> None:
    torch.manual_seed(0)
    model, x = MLP(6, 12, 2), torch.randn(4, 6)
    grads = {}
    for autograd in ("lean", "aot"):
        twin = copy.deepcopy(model)
        torch._dynamo.reset()
        first = len(compile_records)
        with config.scope(backward="lazy", autograd=autograd):
            out = torch.compile(twin, backend="ember")(x)
            before = [r.graph.split("_")[0] for r in compile_records[first:]]
            assert before == ["forward"]  # nothing compiled for the backward yet
        out.sum().backward()  # compiles it now, outside the scope, with its settings
        records = list(compile_records[first:])
        assert [r.graph.split("_")[0] for r in records] == ["forward", "backward"]
        expected = "ember" if autograd == "lean" else "aot: EMBER_AUTOGRAD=aot"
        assert _runtimes(records) == [expected]
        grads[autograd] = [p.grad for p in twin.parameters()]
    _same(grads["lean"], grads["aot"])


def test_saved_activations_are_released_after_the_backward() -> None:
    torch.manual_seed(0)
    model, x = MLP(16, 32, 4), torch.randn(8, 16)
    compiled = torch.compile(copy.deepcopy(model), backend="ember", options={"backward": "eager"})
    torch._dynamo.reset()
    out = compiled(x)
    node = out.grad_fn
    assert type(node).__name__ == "CompiledTrainingGraphBackward"
    out.sum().backward()
    with pytest.raises(RuntimeError, match=r"freed|after they have already been freed"):
        out.sum().backward()


@pytest.mark.cuda
def test_cuda_graphed_training_on_the_lean_runtime_matches_aots() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    model = MLP(64, 128, 16).cuda()
    x = torch.randn(32, 64, device="cuda")
    results = {}
    for autograd in ("lean", "aot"):
        twin = copy.deepcopy(model)
        torch._dynamo.reset()
        first = len(compile_records)
        compiled = torch.compile(
            twin, backend="ember", options={"autograd": autograd, "cudagraphs": "on"}
        )
        optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
        losses = []
        for _ in range(5):
            optimizer.zero_grad(set_to_none=True)
            loss = compiled(x).square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
        records = list(compile_records[first:])
        assert all(r.cudagraphs.startswith("recorded") for r in records)
        results[autograd] = (losses, [p.detach().clone() for p in twin.parameters()], records)
    assert _runtimes(results["lean"][2]) == ["ember"]
    # the lean runtime holds nothing the graphs lend past the next replay: one recording
    # each (AOTAutograd's runtime, torch 2.11, still held a lent gradient at the
    # backward's next replay, which then recorded a second, copying graph)
    lean, aot = ([r.cudagraphs for r in results[k][2]] for k in ("lean", "aot"))
    assert lean == ["recorded 1", "recorded 1"]
    assert len(aot) == 2 and all(state.startswith("recorded") for state in aot)
    _same(results["lean"][0], results["aot"][0])
    _same(results["lean"][1], results["aot"][1])
