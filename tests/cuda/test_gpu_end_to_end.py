"""End-to-end on a CUDA GPU: the same models as the CPU stack tests, on the device,
in float32 and bfloat16, inference and training. Run on the GPU machine with
`python3 -m pytest -m cuda` (see README)."""

from __future__ import annotations

import pytest
import torch
from helpers import check_inference, check_training, gpt2, train_batch_norm_with_dynamic_batch
from torch import nn

from ember.runtime.cli import main
from ember.runtime.models import MLP, TransformerBlock
from ember.runtime.testing import no_eager_fallback

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEVICE = "cuda"


def test_transformer_block_float32() -> None:
    # TF32 is off by default for matmuls, so ember (ATen kernels) should match closely.
    check_inference(
        TransformerBlock(64, 4, 256).to(DEVICE), [torch.randn(4, 32, 64, device=DEVICE)]
    )


def test_transformer_block_bfloat16() -> None:
    model = TransformerBlock(64, 4, 256).to(DEVICE, torch.bfloat16)
    x = torch.randn(4, 32, 64, device=DEVICE, dtype=torch.bfloat16)
    check_inference(model, [x], rtol=1.6e-2, atol=1e-2)


def test_transformer_block_training() -> None:
    check_training(TransformerBlock(64, 4, 256).to(DEVICE), [torch.randn(4, 32, 64, device=DEVICE)])


def test_cnn_training_with_batch_norm() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).to(DEVICE)
    check_training(model, [torch.randn(8, 3, 32, 32, device=DEVICE)], rtol=1e-3, atol=1e-4)


def test_dynamic_batch_on_gpu() -> None:
    model = MLP(64, 128, 16).to(DEVICE).eval()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    with torch.no_grad(), no_eager_fallback() as graphs:
        for batch in (3, 17, 64):
            x = torch.randn(batch, 64, device=DEVICE)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 1, [g.graph for g in graphs]  # one graph for every batch size


def test_gpt2_from_config_on_gpu() -> None:
    transformers = pytest.importorskip("transformers")
    model = gpt2(transformers, vocab=256, width=64).to(DEVICE)
    tokens = torch.randint(0, 256, (2, 32), device=DEVICE)
    check_inference(model, [tokens], rtol=1e-4, atol=1e-4)
    check_training(model, [tokens], rtol=1e-3, atol=1e-4, steps=1)


def test_demo_on_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    print(out)  # the table, for the log of the GPU run
    rows = [line for line in out.splitlines() if line.startswith(("transformer_block", "mlp"))]
    assert len(rows) == 4 and all(row.rstrip().endswith("yes") for row in rows)


def test_batch_norm_trains_with_a_dynamic_batch_on_gpu() -> None:
    """The Triton printer's float size expressions (`n / (n - 1)`, `1 / n`)."""
    train_batch_norm_with_dynamic_batch(DEVICE, (4, 6, 3))


@pytest.mark.parametrize(
    ("name", "fn", "make"),
    [
        ("roll", lambda x: torch.roll(x * 2, 1, 0), lambda: torch.randn(0, 3, device=DEVICE)),
        ("pad", lambda x: torch.nn.functional.pad(x + 1, (1, 2), mode="circular"),
         lambda: torch.randn(0, 3, 3, device=DEVICE)),
        ("linspace", lambda x: torch.linspace(0, 1, x.shape[0], device=DEVICE) + x,
         lambda: torch.randn(0, device=DEVICE)),
    ],
)  # fmt: skip
def test_empty_results_launch_nothing(name: str, fn: object, make: object) -> None:
    # A kernel over no elements has a grid of no programs, which the driver refuses
    # ('invalid argument'); ember returns eager's empty result instead.
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="ember")
    x = make()  # type: ignore[operator]
    with no_eager_fallback() as graphs:
        got = compiled(x)
        got_again = compiled(x)
    assert graphs, name
    expected = fn(x)  # type: ignore[operator]
    assert got.shape == expected.shape == got_again.shape
    assert got.numel() == 0
