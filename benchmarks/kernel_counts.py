"""Kernel counts: ember's schedule beside Inductor's generated kernels, same graphs.

For each end-to-end test model and mode, compile once with ember and once with
Inductor (the comparator; benchmarks may import torch._inductor) and print:
ember's generated (fused) kernels, its extern calls that launch a kernel, its total,
Inductor's generated kernel count, the memory plan's planned peak, and on CUDA the
measured peak of eager and ember. Run: `uv run python benchmarks/kernel_counts.py
[--device cuda]`.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch
from torch import nn

import ember.runtime
from ember.runtime.models import MLP, TransformerBlock
from ember.runtime.table import format_table


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


class TextModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(self.embed(tokens).mean(1)))
        return out.log_softmax(-1)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[str], torch.Tensor]]] = {
    "transformer_block": (
        lambda: TransformerBlock(64, 4, 256),
        lambda d: torch.randn(8, 32, 64, device=d),
    ),
    "mlp": (lambda: MLP(256, 512, 64), lambda d: torch.randn(64, 256, device=d)),
    "cnn_bn": (cnn, lambda d: torch.randn(8, 3, 32, 32, device=d)),
    "text": (TextModel, lambda d: torch.randint(0, 1000, (16, 24), device=d)),
}


def run(model: Callable[..., torch.Tensor], x: torch.Tensor, train: bool) -> None:
    if train:
        getattr(model, "train", lambda: None)()
        model(x).float().square().mean().backward()
    else:
        getattr(model, "eval", lambda: None)()
        with torch.no_grad():
            model(x)


def ember_counts(model: nn.Module, x: torch.Tensor, train: bool) -> tuple[int, int, int, int]:
    torch._dynamo.reset()
    start = len(ember.runtime.compile_records)
    run(torch.compile(model, backend="ember"), x, train)
    records = ember.runtime.compile_records[start:]
    fused = sum(r.fused_kernels for r in records)
    total = sum(r.kernels for r in records)
    peak = max((r.planned_peak_bytes for r in records), default=0)
    return fused, total - fused, total, peak


def inductor_count(model: nn.Module, x: torch.Tensor, train: bool) -> int:
    from torch._inductor import metrics

    torch._dynamo.reset()
    metrics.reset()
    run(torch.compile(model, backend="inductor"), x, train)
    return int(metrics.generated_kernel_count)


def measured_peak(
    model: Callable[..., torch.Tensor], x: torch.Tensor, train: bool, device: str
) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run(model, x, train)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rows = []
    for name, (make, data) in MODELS.items():
        for train in (False, True):
            torch.manual_seed(0)
            model, x = make().to(args.device), data(args.device)
            fused, externs, total, planned = ember_counts(copy.deepcopy(model), x, train)
            inductor = inductor_count(copy.deepcopy(model), x, train)
            eager_peak = measured_peak(copy.deepcopy(model), x, train, args.device)
            compiled = torch.compile(copy.deepcopy(model), backend="ember")
            run(compiled, x, train)
            ember_peak = measured_peak(compiled, x, train, args.device)
            mb = lambda v: "-" if v is None else f"{v / 2**20:.2f}"  # noqa: E731
            rows.append([
                name, "train" if train else "inference", str(fused), str(externs), str(total),
                str(inductor), mb(planned), mb(eager_peak), mb(ember_peak),
            ])  # fmt: skip
            print(f"done {name} {'train' if train else 'inference'}", flush=True)
    headers = [
        "model", "mode", "ember fused", "ember extern", "ember total", "inductor",
        "planned peak MiB", "eager peak MiB", "ember peak MiB",
    ]  # fmt: skip
    print(f"\nkernel counts on {args.device} (torch {torch.__version__})")
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
