"""End-to-end under dynamic shapes: symbolic sizes (`dynamic=True`) through a real
model's training, and data-dependent sizes (nonzero, boolean masks, unique) bound at
run time. Strict mode is on, so a graph that fails to compile raises instead of
running eagerly and passing."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from helpers import assert_compiled_by_ember, train_batch_norm_with_dynamic_batch

from ember.runtime import compile_records, config


def test_gpt2_trains_under_dynamic_shapes() -> None:
    """GPT-2's causal LM (its loss path slices `hidden_states[:, -k:]` with `k` a
    SymInt, whose backward is a slice_scatter from a symbolic start) trained with an
    optimizer over batches of three shapes, compiled once. As many positions as
    tokens: the two embedding gradients are index_puts of one shape."""
    transformers = pytest.importorskip("transformers", reason="transformers is in the models group")
    config_ = transformers.GPT2Config(
        vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config_)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="ember", dynamic=True)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]
    start = len(compile_records)
    after_first_step = None
    with config.scope(strict=True):
        for batch, length in ((2, 8), (3, 12), (2, 10)):
            ids = torch.randint(0, 64, (batch, length))
            losses = []
            for run, optimizer in zip((model, compiled), optimizers, strict=True):
                optimizer.zero_grad(set_to_none=True)
                loss = run(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
            for optimizer in optimizers:
                optimizer.step()
            after_first_step = after_first_step or len(compile_records)
    assert_compiled_by_ember(start, backward=True)
    records = compile_records[start:]
    assert len(compile_records) == after_first_step, [r.graph for r in records]  # no recompile
    for record in records:
        assert record.wrapper_path is not None
        assert "sym_" in record.wrapper_path.read_text()  # sizes bound at run time


def _masked_sum_plus_count(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0].sum() + x.nonzero().shape[0]


def _cosine_times_distinct(x: torch.Tensor) -> torch.Tensor:
    return x.cos() * torch.unique((x * 2).round()).shape[0]


def _mean_of_positives(x: torch.Tensor) -> torch.Tensor:
    return torch.masked_select(x, x > 0).exp().sum() / max(x.nonzero().shape[0], 1)


@pytest.mark.parametrize(
    "fn",
    [_masked_sum_plus_count, _cosine_times_distinct, _mean_of_positives],
)
def test_data_dependent_sizes_are_bound_before_use(fn: Callable[..., torch.Tensor]) -> None:
    """A size that only the data decides is bound when the extern computing it
    returns. The first two fused a use of it into a kernel that ran earlier
    (UnboundLocalError: sym_u1); the third printed torch's Max, which the C++ codegen
    refused. Inputs include one where the mask selects nothing."""
    inputs = [torch.randn(8), torch.randn(13), -torch.rand(6), torch.randn(9)]
    compiled = torch.compile(fn, backend="ember")
    start = len(compile_records)
    with (
        config.scope(strict=True),
        torch._dynamo.config.patch(
            capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True
        ),
    ):
        for x in inputs:
            torch.testing.assert_close(compiled(x), fn(x))
    assert_compiled_by_ember(start)
    assert all(r.ran_eagerly is None for r in compile_records[start:])


def test_select_at_a_data_dependent_index_counts_negative_ones_from_the_end() -> None:
    """`x[:, i.item()]`: the index's sign is unknown when compiling. It was used as an
    offset as is, so a negative index read the wrong column (no error)."""

    def fn(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x.select(1, int(i.item())) * 2

    x = torch.randn(3, 8)
    compiled = torch.compile(fn, backend="ember")
    start = len(compile_records)
    with config.scope(strict=True), torch._dynamo.config.patch(capture_scalar_outputs=True):
        for i in (-2, 3, -8, 7):
            index = torch.tensor(i)
            torch.testing.assert_close(compiled(x, index), fn(x, index))
    assert_compiled_by_ember(start)


def test_batch_norm_trains_with_a_dynamic_batch() -> None:
    train_batch_norm_with_dynamic_batch("cpu", (4, 6, 3))
