"""drop_training_running_statistics: a training step's batch norm backwards stop
taking the running statistics, so the forward keeps two fewer values per batch norm
for the backward, with the same gradients and running statistics as eager."""

from __future__ import annotations

from typing import Any

import torch
from graphpasses_helpers import aot_capture  # type: ignore[import-not-found]  # tests/ on sys.path
from torch import nn
from torch._functorch.partitioners import default_partition

from ember.graphpasses import drop_training_running_statistics

aten = torch.ops.aten


class Block(nn.Module):
    """conv-bn-relu twice with a residual (convolutions without bias: a batch norm
    makes a bias's gradient zero, compared as rounding noise)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + y)


def _dropping_first(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
    drop_training_running_statistics(joint)
    return default_partition(joint, inputs, **kwargs)


def _outputs(gm: torch.fx.GraphModule) -> int:
    return len(next(iter(gm.graph.find_nodes(op="output"))).args[0])


def _backwards(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    found = gm.graph.find_nodes(op="call_function", target=aten.native_batch_norm_backward.default)
    return list(found)


def test_training_backward_takes_no_running_statistics_and_saves_fewer_values() -> None:
    x = torch.randn(2, 3, 10, 10)
    torch.manual_seed(0)
    plain = aot_capture(Block().train(), x, train=True)
    torch.manual_seed(0)
    dropped = aot_capture(Block().train(), x, train=True, partition=_dropping_first)
    before, after = _backwards(plain.graph("backward")), _backwards(dropped.graph("backward"))
    assert len(before) == len(after) == 2
    assert all(n.args[3] is not None and n.args[4] is not None for n in before)
    assert all(n.args[3] is None and n.args[4] is None for n in after)
    # two values fewer cross from the forward to the backward per batch norm
    assert _outputs(dropped.graph("forward")) == _outputs(plain.graph("forward")) - 4


def test_gradients_and_running_statistics_match_eager() -> None:
    torch.manual_seed(0)
    eager, model = Block().train(), Block().train()
    model.load_state_dict(eager.state_dict())
    x = torch.randn(4, 3, 10, 10)
    weights = torch.randn(4, 8, 10, 10)
    (eager(x) * weights).sum().backward()
    compiled = torch.compile(model, backend=_backend(), fullgraph=True)
    (compiled(x) * weights).sum().backward()
    for (name, a), e in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, e.grad, rtol=1e-4, atol=1e-5, msg=name)
    for a, e in zip(model.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a, e)


def _backend() -> Any:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from ember.graphpasses import ember_decompositions

    def compiler(gm: torch.fx.GraphModule, example: Any) -> Any:
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    return aot_autograd(
        fw_compiler=compiler, bw_compiler=compiler,
        decompositions=ember_decompositions(), partition_fn=_dropping_first,
    )  # fmt: skip


def test_eval_mode_and_repeated_runs_are_left_alone() -> None:
    graph = torch.fx.Graph()
    names = ["dy", "x", "w", "rm", "rv", "sm", "si"]
    ph = [graph.placeholder(n) for n in names]
    bn = aten.native_batch_norm_backward.default
    train = graph.call_function(bn, (*ph, True, 1e-5, [True, True, True]))
    evaluation = graph.call_function(bn, (*ph, False, 1e-5, [True, True, True]))
    graph.output((train, evaluation))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert drop_training_running_statistics(gm) == 1
    assert train.args[3] is None and train.args[4] is None
    assert evaluation.args[3] is ph[3] and evaluation.args[4] is ph[4]  # eval reads them
    assert drop_training_running_statistics(gm) == 0
