"""Export passes on programs from torch.export.export with torch.library custom ops."""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

import pytest
import torch
import torch.export._trace as export_trace
from graphpasses_helpers import count
from torch._export.passes.collect_tracepoints_pass import CollectTracepointsPass
from torch.export.exported_program import ConstantArgument, TensorArgument

from ember.graphpasses import (
    PassManager,
    collect_custom_op_profiles,
    collect_module_call_signatures,
    eliminate_dead_code,
    ember_decompositions,
    insert_custom_op_guards,
    remove_runtime_assertions,
)
from ember.graphpasses.export import Constant, TensorProfile

aten = torch.ops.aten
GUARD = aten._assert_tensor_metadata.default


@torch.library.custom_op("embertest::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("embertest::pair", mutates_args=())
def pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x - y


@pair.register_fake
def _(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


class UsesCustomOps(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        a, b = torch.ops.embertest.pair(self.lin(x), x)
        half = torch.ops.embertest.scale(b.double(), 0.5)
        return torch.ops.embertest.scale(a, 2.0) + half.sum() + n.float().sum()


def exported() -> torch.export.ExportedProgram:
    args = (torch.randn(2, 4), torch.arange(3))
    return torch.export.export(UsesCustomOps(), args).run_decompositions(ember_decompositions())


def flat_inputs(ep: torch.export.ExportedProgram, *user: Any) -> list[Any]:
    return [*ep.state_dict.values(), *user]


def test_guards_inserted_before_chosen_op_only() -> None:
    ep = exported()
    gm = ep.graph_module
    existing = {n for n in gm.graph.nodes if n.target is GUARD}  # export adds some itself
    manager = PassManager([insert_custom_op_guards(["embertest::scale"])], check=True)
    gm, report = manager.run(gm)
    assert report.records[0].stats == {"guards": 2}
    guards = [n for n in gm.graph.nodes if n.target is GUARD and n not in existing]
    for guard in guards:
        user = guard.next
        assert user.target is torch.ops.embertest.scale.default
        assert guard.meta.get("stack_trace") == user.meta.get("stack_trace")
        assert guard.meta["stack_trace"]
    dtypes = sorted(str(g.kwargs["dtype"]) for g in guards)
    assert dtypes == ["torch.float32", "torch.float64"]
    assert all(g.kwargs["device"] == torch.device("cpu") for g in guards)
    assert all(g.kwargs["layout"] == torch.strided for g in guards)
    # running it still works, and the guards survive dead code elimination
    gm(*flat_inputs(ep, torch.randn(2, 4), torch.arange(3)))
    gm, _ = PassManager([eliminate_dead_code]).run(gm)
    assert count(gm, GUARD) == len(existing) + 2


def test_guards_fire_on_wrong_dtype_and_are_idempotent() -> None:
    ep = exported()
    gm = ep.graph_module
    existing = count(gm, GUARD)
    guard_pass = insert_custom_op_guards([torch.ops.embertest.pair])
    gm, _ = PassManager([guard_pass, guard_pass]).run(gm)
    assert count(gm, GUARD) == existing + 2  # x and lin(x), once each
    params = list(ep.state_dict.values())
    with pytest.raises(RuntimeError):
        gm(*params, torch.randn(2, 4, dtype=torch.float64), torch.arange(3))


def test_custom_op_profiles() -> None:
    profiles = collect_custom_op_profiles(exported().graph_module)
    assert set(profiles) == {"embertest::scale.default", "embertest::pair.default"}
    f32 = TensorProfile(2, torch.float32, torch.device("cpu"), torch.strided)
    f64 = TensorProfile(2, torch.float64, torch.device("cpu"), torch.strided)
    scale_profiles = profiles["embertest::scale.default"]
    assert {(p.args, p.outputs) for p in scale_profiles} == {
        ((f32, None), (f32,)),
        ((f64, None), (f64,)),
    }
    (pair_profile,) = profiles["embertest::pair.default"]
    assert pair_profile.args == (f32, f32) and pair_profile.outputs == (f32, f32)


# -- module call signatures ----------------------------------------------------------


class Sub(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x) + y, x.relu()


class Aliased(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Sub()
        self.b = self.a  # one module, two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, z = self.a(x, x)
        w, _ = self.b(y, z)
        return w * 2


class CalledTwice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Sub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, z = self.sub(x, x)
        w, _ = self.sub(y, z)
        return w


def export_with_tracepoints(
    model: torch.nn.Module, preserve: tuple[str, ...]
) -> tuple[torch.fx.GraphModule, torch.export.ExportedProgram]:
    """The graph as torch.export has it before it collects tracepoints itself."""
    seen: list[torch.fx.GraphModule] = []

    class Capture:
        def __init__(self, specs: Any, sig: Any) -> None:
            self.real = CollectTracepointsPass(specs, sig)

        def __call__(self, gm: torch.fx.GraphModule) -> Any:
            seen.append(copy.deepcopy(gm))
            return self.real(gm)

    with mock.patch.object(export_trace, "CollectTracepointsPass", Capture):
        ep = torch.export.export(
            model, (torch.randn(2, 4),), preserve_module_call_signature=preserve
        )
    return seen[0], ep


def _torch_names(args: list[Any]) -> list[object]:
    return [
        a.name if isinstance(a, TensorArgument) else Constant(a.value)
        for a in args
        if isinstance(a, TensorArgument | ConstantArgument)
    ]


@pytest.mark.parametrize(
    ("model", "preserve"), [(Aliased(), ("a", "b")), (CalledTwice(), ("sub",))]
)
def test_module_call_signatures_match_torch_export(
    model: torch.nn.Module, preserve: tuple[str, ...]
) -> None:
    gm, ep = export_with_tracepoints(model, preserve)
    tracepoints = [n for n in gm.graph.nodes if "tracepoint" in str(n.target)]
    assert len(tracepoints) >= 4
    found = collect_module_call_signatures(gm)
    assert not [n for n in gm.graph.nodes if "tracepoint" in str(n.target)]
    expected = {
        entry.fqn: entry.signature
        for entry in ep.module_call_graph
        if entry.signature is not None and entry.fqn
    }
    assert set(found.calls) == set(expected)
    for path, signature in expected.items():
        assert found.calls[path].inputs == _torch_names(signature.inputs), path
        assert found.calls[path].outputs == _torch_names(signature.outputs), path
    x = torch.randn(2, 4)
    params = [p for _, p in ep.named_parameters()]
    torch.testing.assert_close(gm(*params, x)[0], model(x))


def test_aliased_submodule_records_the_name_each_call_used() -> None:
    gm, _ = export_with_tracepoints(Aliased(), ("a", "b"))
    found = collect_module_call_signatures(gm)
    assert found.calls["a"].inputs == ["x", "x"]
    # b's inputs are a's outputs: the tracepoints between them are gone.
    assert found.calls["b"].inputs == found.calls["a"].outputs
    assert found.renamed  # getitems that were rewired, for updating a graph signature


# -- runtime assertions --------------------------------------------------------------


class Checked(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.sum().item()
        torch._check(n < 1e6)
        return x * 2 + n


def test_runtime_assertions_removed_only_when_asked() -> None:
    ep = torch.export.export(Checked(), (torch.ones(3),)).run_decompositions(ember_decompositions())
    gm = ep.graph_module
    asserts = count(gm, aten._assert_scalar.default)
    assert asserts >= 1
    gm, _ = PassManager([eliminate_dead_code]).run(gm)  # DCE must keep them
    assert count(gm, aten._assert_scalar.default) == asserts
    gm, _ = PassManager([insert_custom_op_guards([aten.mul.Tensor])]).run(gm)
    guards = count(gm, GUARD)
    gm, report = PassManager([remove_runtime_assertions()], check=True).run(gm)
    assert count(gm, aten._assert_scalar.default) == 0
    assert count(gm, GUARD) == guards >= 1  # guards stay unless asked
    assert report.records[0].stats["removed"] == asserts
    gm, _ = PassManager([remove_runtime_assertions(include_metadata_guards=True)]).run(gm)
    assert count(gm, GUARD) == 0
    torch.testing.assert_close(gm(torch.ones(3))[0], Checked()(torch.ones(3)))


class CheckedTwice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.sum().item()
        torch._check(n < 1e6)
        torch._check(n > -1e6)
        return x * 2 + n


def test_runtime_assertions_removed_only_where_selected() -> None:
    ep = torch.export.export(CheckedTwice(), (torch.ones(3),))
    gm = ep.run_decompositions(ember_decompositions()).graph_module
    asserts = [n for n in gm.graph.nodes if n.target is aten._assert_scalar.default]
    assert len(asserts) >= 2
    kept = asserts[-1].name
    gm, report = PassManager(
        [remove_runtime_assertions(only=lambda node: node.name != kept)], check=True
    ).run(gm)
    left = [n.name for n in gm.graph.nodes if n.target is aten._assert_scalar.default]
    assert left == [kept]
    assert report.records[0].stats["removed"] == len(asserts) - 1
    torch.testing.assert_close(gm(torch.ones(3))[0], CheckedTwice()(torch.ones(3)))
