"""Ember's runtime for compiled graphs, in place of AOTAutograd's runtime wrappers:
an `autograd.Function` around a training graph's compiled forward and backward, and
a direct call of an inference graph.

AOTAutograd traces and splits a training graph, and its runtime then runs the pair
through layers of generic wrappers: input mutations replayed, aliased outputs
regenerated, tensor subclasses unwrapped, effect tokens, functionalised RNG state,
tangents coerced, each a Python call per step whether the graph needs it or not. On
a small model they cost more than the kernels: the demo's MLP training step took
753 us with ember on AOTAutograd's runtime and 849 with eager on the H100 machine,
for 71-77 us of GPU work; on this runtime it takes 703 us.

Most graphs need none of that work: no input mutated outside the graph, no output
aliasing an input or another output, plain tensors, no tokens or functionalised
RNG. For those, `lean_training` returns a callable that runs the forward inside one
`autograd.Function`, saves what the backward reads and, at the backward, hands the
saved values and the gradients the backward takes to the compiled backward, and
`lean_inference` one that calls the compiled graph. What AOTAutograd's runtime
still does for such graphs, these do too:
- inputs the graph writes in place have their version counters bumped, so autograd
  sees the write;
- views among the saved tensors are saved detached (autograd must not see a view of
  an output it is returning);
- outputs that need no gradient are marked non-differentiable, and their gradients
  are not materialised;
- the compiled functions run with autocast off (the graph was traced under it);
- a backward that needs deterministic algorithms, after a forward compiled without,
  raises torch's error;
- saved tensors are released as the backward consumes them;
- a second differentiation raises (`once_differentiable`) rather than returning a
  silently wrong gradient.
A graph that needs more (`why_not_lean` says why; the graph's CompileRecord keeps it
in `autograd`), a call under compiled autograd or a functorch transform, and
`EMBER_AUTOGRAD=aot` take AOTAutograd's runtime, which is always built as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

_NON_ALIAS = "non_alias"
autocast_on = torch._C._is_any_autocast_enabled
no_autocast = torch._C._DisableAutocast
bump = torch.autograd.graph.increment_version


def why_not_lean(
    metadata: Any, example_inputs: Sequence[Any], backward_outputs: int | None
) -> str | None:
    """Why a graph needs AOTAutograd's runtime, or None where ember's lean one runs it
    as AOTAutograd's would. `backward_outputs`: the number of values a training
    graph's compiled backward returns; None for an inference graph."""
    if metadata is None:
        return "no AOTAutograd metadata"
    try:
        inputs = list(metadata.input_info)
        outputs = list(metadata.output_info)
        if metadata.num_mutated_inp_runtime_indices:
            return "an input is mutated outside the graph"
        if any(i.mutates_metadata for i in inputs):
            return "an input's metadata is mutated"
        if backward_outputs is not None and any(i.mutates_data and i.requires_grad for i in inputs):
            return "an input that requires grad is mutated"
        metadata.mutated_graph_handled_indices_seen_by_autograd  # noqa: B018
        if getattr(metadata, "dynamic_outputs", False) and _mark_dynamic() is None:
            return "outputs with dynamic dimensions to mark"
        if getattr(metadata, "grad_enabled_mutation", None) is not None:
            return "the graph switches grad mode"
        if metadata.num_intermediate_bases:
            return "an output aliases an intermediate"
        for out in outputs:
            if getattr(out.output_type, "name", None) != _NON_ALIAS:
                return f"an output is a view or alias ({out.output_type})"
            if not issubclass(out.raw_type, torch.Tensor | int | float | torch.SymInt):
                return f"an output of type {out.raw_type.__name__}"
        if metadata.is_rng_op_functionalized or getattr(metadata, "num_graphsafe_rng_states", 0):
            return "functionalised RNG state"
        if getattr(metadata, "tokens", None) or getattr(metadata, "num_backward_tokens", 0):
            return "effect tokens"
        if getattr(metadata, "indices_of_inputs_that_requires_grad_with_mutations_in_bw", None):
            return "the backward mutates an input"
        for field in ("subclass_inp_meta", "subclass_fw_graph_out_meta", "subclass_tangent_meta"):
            if any(
                type(m).__name__ == "SubclassCreationMeta" for m in getattr(metadata, field, ())
            ):
                return "tensor subclasses"
        if _slice_length(metadata, "opaque_objects_saved_for_backwards_slice"):
            return "opaque objects saved for the backward"
        if backward_outputs is not None:  # present in this torch's metadata
            metadata.tensors_saved_for_backwards_slice  # noqa: B018
            metadata.symints_saved_for_backwards_slice  # noqa: B018
            metadata.num_forward_returns  # noqa: B018
    except AttributeError as exc:  # another torch's metadata: take its own runtime
        return f"AOTAutograd metadata without {exc.name or exc}"
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                return f"an input of type {type(value).__name__}"
        elif not isinstance(value, int | float | torch.SymInt | torch.SymFloat):
            return f"an input of type {type(value).__name__}"
    if backward_outputs is not None and backward_outputs != len(example_inputs):
        return f"the backward returns {backward_outputs} values for {len(example_inputs)} inputs"
    if _inlined_saved_tensor_hooks():
        return "saved-tensor hooks were traced into the graph"
    return None


def _mark_dynamic() -> Callable[[torch.Tensor, set[int]], None] | None:
    """Torch's marking of an output's dimensions as dynamic for the graphs Dynamo
    traces after this one (AOTAutograd's runtime marks them), where this torch has it."""
    from torch._functorch._aot_autograd import runtime_wrappers

    mark = getattr(runtime_wrappers, "mark_dynamo_propagated_dynamic_indices", None)
    return mark if callable(mark) else None


def _output_marker(metadata: Any) -> Callable[[list[Any]], None] | None:
    """What marks a call's outputs dynamic as AOTAutograd's runtime marks them (their
    dynamic dimensions, for the graphs Dynamo traces after this one); None where
    there is nothing to mark. `why_not_lean` refuses graphs with dynamic outputs
    where this torch has no marking function."""
    mark = _mark_dynamic()
    if mark is None or not getattr(metadata, "dynamic_outputs", False):
        return None
    marks = [
        (i, out.dynamic_dims)
        for i, out in enumerate(metadata.output_info)
        if getattr(out, "dynamic_dims", None) is not None
    ]

    def mark_outputs(outs: list[Any]) -> None:
        for i, dims in marks:
            mark(outs[i], dims)

    return mark_outputs if marks else None


def _called(compiled: Callable[[list[Any]], Any], args: list[Any]) -> Any:
    """`compiled(args)` with autocast off where it is on: the graph was traced under it,
    and its ATen calls must not cast again (AOTAutograd's runtime does the same)."""
    if autocast_on():
        with no_autocast():
            return compiled(args)
    return compiled(args)


def _slice_length(metadata: Any, name: str) -> int:
    part = getattr(metadata, name, None)
    if part is None:
        return 0
    start, stop, _ = part.indices(1 << 30)
    return max(int(stop) - int(start), 0)


def _inlined_saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks active at compile time were traced into the graph,
    which AOTAutograd's runtime then disables around the call."""
    utils = getattr(torch._functorch._aot_autograd, "utils", None)
    top = getattr(utils, "top_saved_tensors_hooks", None)
    inlineable = getattr(utils, "saved_tensors_hooks_are_inlineable", None)
    if top is None or inlineable is None:
        return False
    return bool(inlineable(top()))


def lean_training(
    compiled_forward: Callable[[list[Any]], Any],
    compiled_backward: Callable[[list[Any]], Any],
    metadata: Any,
    fallback: Callable[..., Any],
    graph: str = "training graph",
) -> Callable[..., Any]:
    """The lean runtime for a training graph that `why_not_lean` accepts (see the
    module docstring): a callable taking the forward's inputs and returning its
    outputs, recorded for autograd.

    `metadata` is AOTAutograd's view-and-mutation metadata of the forward and
    `fallback` AOTAutograd's runtime for the same pair, which runs the calls this one
    does not take (under compiled autograd, a functorch transform or no_grad)."""
    returned = metadata.num_forward_returns
    saved_tensors = metadata.tensors_saved_for_backwards_slice
    saved_symbols = metadata.symints_saved_for_backwards_slice
    outputs = list(metadata.output_info)
    non_differentiable = [i for i, out in enumerate(outputs) if not out.requires_grad]
    # the outputs whose gradients the backward takes, in order
    wanted = [
        i
        for i, out in enumerate(outputs)
        if issubclass(out.raw_type, torch.Tensor)
        and getattr(out, "requires_grad_for_backward", out.requires_grad)
    ]
    nondeterministic = getattr(metadata, "deterministic", None) is False
    written = list(metadata.mutated_graph_handled_indices_seen_by_autograd)
    mark_outputs = _output_marker(metadata)
    interpreters = torch._C._functorch.peek_interpreter_stack
    from torch._dynamo import compiled_autograd

    class CompiledTrainingGraph(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            outs = _called(compiled_forward, list(args))
            ctx.save_for_backward(*[x.detach() if x._is_view() else x for x in outs[saved_tensors]])
            ctx.symints = outs[saved_symbols]
            results = tuple(outs[:returned])
            if non_differentiable:
                ctx.mark_non_differentiable(
                    *[
                        results[i]
                        for i in non_differentiable
                        if isinstance(results[i], torch.Tensor)
                    ]
                )
            ctx._materialize_non_diff_grads = False
            return results

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, *grads: Any) -> Any:
            if nondeterministic and torch.are_deterministic_algorithms_enabled():
                raise RuntimeError(
                    f"{graph}: this compiled backward runs with "
                    "torch.use_deterministic_algorithms(True), but its forward was "
                    "compiled while deterministic algorithms were off; compile again "
                    "with the setting the backward runs under"
                )
            tangents = [grads[i] for i in wanted]
            for i, tangent in zip(wanted, tangents, strict=True):
                if type(tangent) is not torch.Tensor:
                    raise TypeError(
                        f"{graph}: the gradient of output {i} is a "
                        f"{type(tangent).__name__}; the compiled backward takes plain tensors"
                    )
            args = [*ctx.symints, *ctx.saved_tensors, *tangents]
            del tangents, grads
            clear = getattr(ctx, "maybe_clear_saved_tensors", None)
            if clear is not None:
                clear()  # the backward frees each saved value as it is done with it
            return tuple(_called(compiled_backward, args))

    apply = CompiledTrainingGraph.apply

    def run(*args: Any) -> Any:
        if (
            not torch.is_grad_enabled()
            or compiled_autograd.compiled_autograd_enabled
            or compiled_autograd.in_compiled_autograd_region
            or interpreters() is not None
        ):
            return fallback(*args)
        if written:
            bump([args[i] for i in written])
        outs = list(apply(*args))
        if mark_outputs is not None:
            mark_outputs(outs)
        return outs

    return run


def lean_inference(
    compiled: Callable[[list[Any]], Any], metadata: Any, fallback: Callable[..., Any]
) -> Callable[..., Any]:
    """The lean runtime for an inference graph that `why_not_lean` accepts: a callable
    taking the graph's inputs and returning its outputs. `fallback` (AOTAutograd's
    runtime) runs calls under a functorch transform."""
    written = list(metadata.mutated_graph_handled_indices_seen_by_autograd)
    mark_outputs = _output_marker(metadata)
    interpreters = torch._C._functorch.peek_interpreter_stack

    def run(*args: Any) -> Any:
        if interpreters() is not None:
            return fallback(*args)
        if written:
            bump([args[i] for i in written])
        outs = _called(compiled, list(args))
        if mark_outputs is not None:
            mark_outputs(outs)
        return outs

    return run
