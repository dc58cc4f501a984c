"""Comparison helpers: run a model eagerly and through ember, compare everything."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ember.runtime import compile_records, config
from ember.runtime.testing import assert_no_eager_fallback


def compiled_copy(model: nn.Module, **kwargs: Any) -> tuple[nn.Module, Callable[..., Any]]:
    twin = copy.deepcopy(model)
    return twin, torch.compile(twin, backend="ember", **kwargs)


def check_inference(
    model: nn.Module, inputs: Sequence[Any], *, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    model.eval()
    twin, compiled = compiled_copy(model)
    twin.eval()
    start = len(compile_records)
    with torch.no_grad():
        expected = model(*inputs)
        actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    assert_compiled_by_ember(start)


def check_training(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    loss: Callable[[Any], torch.Tensor] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    steps: int = 2,
) -> None:
    """Forward + backward, twice (so running statistics and state updates compound):
    outputs, every gradient and every buffer must match eager."""
    model.train()
    twin, compiled = compiled_copy(model)
    twin.train()
    loss_fn = loss or (lambda out: out.float().square().mean())
    start = len(compile_records)
    for _ in range(steps):
        for m in (model, twin):
            m.zero_grad(set_to_none=True)
        expected = model(*inputs)
        actual = compiled(*inputs)
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
        loss_fn(expected).backward()
        loss_fn(actual).backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=f"grad {name}")
        for (name, b), c in zip(model.named_buffers(), twin.buffers(), strict=True):
            torch.testing.assert_close(c, b, rtol=rtol, atol=atol, msg=f"buffer {name}")
    assert_compiled_by_ember(start, backward=True)


def assert_compiled_by_ember(start: int, *, backward: bool = False) -> None:
    """The graphs went through ember's pipeline (not an eager fallback)."""
    records = compile_records[start:]
    assert_no_eager_fallback(records)
    assert all(r.wrapper_path is not None and r.wrapper_path.exists() for r in records)
    if backward:
        assert any(r.graph.startswith("backward") for r in records)


class LastHiddenState(nn.Module):
    """A `transformers` model as a tensor -> tensor module (its last hidden state)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(input_ids=ids).last_hidden_state
        return out


def gpt2(transformers: Any, *, vocab: int, width: int) -> nn.Module:
    """A 2-layer GPT-2 with random weights and no dropout, built from a config."""
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=width, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return LastHiddenState(transformers.GPT2Model(config))


def train_batch_norm_with_dynamic_batch(device: str, batches: tuple[int, ...]) -> None:
    """A conv + batch norm block trained with `dynamic=True` over several batch sizes,
    compiled once, against eager: outputs, every gradient, the running statistics.
    Batch norm's unbiased variance scales by `n / (n - 1)` and its backward by `1 / n`,
    with `n` symbolic: both were held as integers (truncated to 1 and 0), and the C++
    codegen could not print the true divisions at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    ).to(device)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="ember", dynamic=True)
    start = len(compile_records)
    after_first_step = None
    with config.scope(strict=True):
        for batch in batches:
            x = torch.randn(batch, 3, 10, 10, device=device)
            outputs = []
            for run, module in ((model, model), (compiled, twin)):
                module.zero_grad(set_to_none=True)
                out = run(x)
                out.square().mean().backward()
                outputs.append(out.detach())
            torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
            for (name, b), c in zip(model.named_buffers(), twin.buffers(), strict=True):
                torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=name)
            after_first_step = after_first_step or len(compile_records)
    assert_compiled_by_ember(start, backward=True)
    assert len(compile_records) == after_first_step  # one compile serves every batch
    assert all(
        "sym_" in r.wrapper_path.read_text() for r in compile_records[start:] if r.wrapper_path
    )


def check_batch_norm_backward(
    device: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    train: bool,
    channels_last: bool = False,
    weight: bool = True,
    mask: tuple[bool, bool, bool] = (True, True, True),
    param_dtype: torch.dtype | None = None,
) -> None:
    """`aten.native_batch_norm_backward` compiled by ember (lowered, not an ATen call:
    fallbacks off) against the eager op: each asked-for gradient equal, with eager's
    dtype, the strides the op's meta function promises, and None where `mask` asks for
    none. Half-precision inputs are computed in float32 and rounded once, as eager
    does, so they compare at their own precision. `param_dtype` (default `dtype`) is
    that of the weight and statistics: float32 with a bfloat16 input is the mixed form
    eager's CPU kernel takes."""
    g = torch.Generator().manual_seed(0)
    channels = shape[1]
    param_dtype = param_dtype or dtype

    def make(size: tuple[int, ...], scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (torch.randn(size, generator=g) * scale + shift).to(device)

    x = make(shape, 2.0, 0.5).to(dtype)
    dy = make(shape).to(dtype)
    if channels_last:
        memory_format = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x, dy = (
            x.contiguous(memory_format=memory_format),
            dy.contiguous(memory_format=memory_format),
        )
    dims = [0, *range(2, len(shape))]
    mean = x.float().mean(dims)
    invstd = (x.float().var(dims, unbiased=False) + 1e-5).rsqrt()
    w = make((channels,)).to(param_dtype) if weight else None
    running_mean = make((channels,), 0.5).to(param_dtype)
    running_var = (make((channels,)).abs() + 0.5).to(param_dtype)
    if device == "cpu":
        saved = (mean.to(param_dtype), invstd.to(param_dtype)) if train else (None, None)
    else:
        # eager's CUDA kernel takes the statistics the CUDA forward saves: float32
        # whatever the input's dtype, and defined (empty) in eval mode
        empty = torch.empty(0, device=device)
        saved = (mean, invstd) if train else (empty, empty)

    def backward(*args: Any) -> Any:
        dy, x, w, rm, rv, sm, si = args
        return torch.ops.aten.native_batch_norm_backward.default(
            dy, x, w, rm, rv, sm, si, train, 1e-5, list(mask)
        )

    args = (dy, x, w, running_mean, running_var, *saved)
    expected = backward(*args)
    start = len(compile_records)
    with config.scope(strict=True, fallback=False):
        actual = torch.compile(backward, backend="ember", fullgraph=True)(*args)
    assert_compiled_by_ember(start)
    assert all(not r.fallback_ops for r in compile_records[start:])
    # torch.compile promises the strides of the op's meta function, which eager's CPU
    # kernel follows; eager's CUDA kernel in eval mode returns a contiguous input
    # gradient for a channels-last input, so strides compare against the meta
    promised = backward(*(a.to("meta") if a is not None else None for a in args))
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert (a is None) == (e is None) == (not mask[k]), k
        if a is None:
            continue
        assert a.dtype == e.dtype and a.stride() == promised[k].stride(), (
            k,
            a.stride(),
            promised[k].stride(),
        )
        # a half type: at most one unit in the last place apart (both round the same
        # float32 value once; only the order of the float32 sums differs)
        half = e.dtype in (torch.bfloat16, torch.float16)
        rtol = torch.finfo(e.dtype).eps if half else 1e-4
        torch.testing.assert_close(a, e, rtol=rtol, atol=1e-5, msg=f"output {k}")


def check_batch_norm_gradients(device: str, shape: tuple[int, ...], *, train: bool) -> None:
    """Gradients of the input, weight and bias of `F.batch_norm` in training or eval
    mode, compiled by ember (the backward graph holds `native_batch_norm_backward`,
    lowered) against eager, with a loss that weighs every element differently."""
    g = torch.Generator().manual_seed(1)
    channels = shape[1]
    leaves = [
        torch.randn(shape, generator=g) * 3 + 1,
        torch.randn(channels, generator=g),
        torch.randn(channels, generator=g),
    ]
    stats = [torch.randn(channels, generator=g), torch.rand(channels, generator=g) + 0.5]
    scale = torch.randn(shape, generator=g).to(device)

    def step(
        x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor
    ) -> torch.Tensor:
        out = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=train, momentum=0.1)
        # a smooth activation: under a ReLU, an output within an ulp of 0 in one run
        # and across it in the other changes that element's gradient by its scale
        return (torch.nn.functional.silu(out) * scale).sum()

    results = []
    start = len(compile_records)
    runs: list[Callable[..., torch.Tensor]] = [step, torch.compile(step, backend="ember")]
    for fn in runs:
        params = [t.to(device, copy=True).requires_grad_() for t in leaves]
        running = [t.to(device, copy=True) for t in stats]
        with config.scope(strict=True, fallback=False):
            fn(*params, *running).backward()  # type: ignore[no-untyped-call]  # torch stub
        results.append(([p.grad for p in params], running))
    assert_compiled_by_ember(start, backward=True)
    (expected, expected_running), (actual, actual_running) = results
    for name, a, e in zip(("input", "weight", "bias"), actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(actual_running, expected_running)
