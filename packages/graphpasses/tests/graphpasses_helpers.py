"""Shared test helpers: real models and the graphs AOTAutograd and torch.export make of them.

A distinct module name (not conftest) so that the layers' test suites can run together."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd

from ember.graphpasses import ember_decompositions


class Captured:
    """The graphs AOTAutograd produced for one model and the real inputs of each."""

    def __init__(self) -> None:
        self.graphs: dict[str, torch.fx.GraphModule] = {}
        self.inputs: dict[str, list[Any]] = {}

    def graph(self, kind: str) -> torch.fx.GraphModule:
        """A private copy (passes edit graphs in place); fake values are shared."""
        gm = self.graphs[kind]
        return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def aot_capture(
    model: Callable[..., Any],
    *inputs: Any,
    dynamic: bool = False,
    train: bool = False,
    partition: Callable[..., Any] | None = None,
) -> Captured:
    """Run `torch.compile(model)` with ember's table and keep the ATen graphs
    (training graphs split by `partition`, AOTAutograd's default if None)."""
    captured = Captured()

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
            captured.graphs[kind] = gm

            def run(args: list[Any]) -> Any:
                captured.inputs.setdefault(
                    kind,
                    [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args],
                )
                result = gm(*args)
                args.clear()
                return result

            run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd's calling convention
            return run

        return compile_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=ember_decompositions(),
        keep_inference_input_mutations=True,
        **({"partition_fn": partition} if partition is not None else {}),
    )
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=True)
    if train:
        compiled(*inputs).sum().backward()
    else:
        with torch.no_grad():
            compiled(*inputs)
    return captured


def export_aten(model: torch.nn.Module, *inputs: Any) -> torch.export.ExportedProgram:
    return torch.export.export(model, inputs).run_decompositions(ember_decompositions())


def count(gm: torch.fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


# -- models ------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(self.conv2(x), 2)
        return self.fc(x.mean(dim=(2, 3)))


class Attention(torch.nn.Module):
    """Hand-written multi-head attention; `spelling` picks how the scale is written."""

    def __init__(
        self, d: int = 32, heads: int = 4, spelling: str = "div", mask: str = "none"
    ) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.heads = heads
        self.spelling = spelling
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        e = d // self.heads
        if self.spelling == "div":
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(e)
        elif self.spelling == "mul":
            scores = torch.matmul(q, k.transpose(-1, -2)) * (e**-0.5)
        elif self.spelling == "scaled_q":
            scores = (q * e**-0.5) @ k.transpose(-2, -1)
        else:
            scores = q @ k.transpose(-2, -1)
        if self.mask == "causal_add":
            causal = torch.triu(torch.full((s, s), float("-inf"), device=x.device), 1)
            scores = scores + causal
        elif self.mask == "mask_first":
            causal = torch.triu(torch.full((s, s), float("-inf"), device=x.device), 1)
            scores = causal + scores
        elif self.mask == "bool":
            keep = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        weights = scores.softmax(dim=-1)
        if self.mask == "dropout":
            weights = torch.nn.functional.dropout(weights, 0.5, training=True)
        y = (weights @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


class TransformerBlock(torch.nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = Attention(d, heads, spelling="div", mask="causal_add")
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = MLP(d)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))
