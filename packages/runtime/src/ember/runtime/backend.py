"""The `torch.compile` backend: `torch.compile(model, backend="ember")`.

Dynamo hands ember a Torch-level FX graph; hand-written attention in it becomes
`scaled_dot_product_attention` (`rewrite_attention_pregrad`), then AOTAutograd traces
it to ATen with ember's decomposition table, splits forward and backward for training,
and ember compiles each of the resulting graphs with `compile_graph`. Dynamo finds the
backend through the `torch_dynamo_backends` entry point of ember-runtime where that is
installed; where it is not (the packages only on PYTHONPATH), the import of
`ember.runtime` registers it (ember.runtime.registration).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified

from ember.graphpasses import (
    aot_decompositions,
    channels_last_training,
    drop_training_running_statistics,
    merge_common_subexpressions,
    rewrite_attention_pregrad,
)
from ember.graphpasses.graph_edit import output_node
from ember.runtime import compile_cache, compile_pool, dtype_gaps, lean_runtime
from ember.runtime.collection import full_collections_deferred
from ember.runtime.compiler import EmberCompileError, compile_graph, record_eager_graph
from ember.runtime.config import KNOBS, EmberConfigError, config
from ember.runtime.devices import defaults_for

log = logging.getLogger(__name__)


def _compiler(
    kind: str, settings: dict[str, Any], compiled: dict[str, Any] | None = None
) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
    return functools.partial(_compile_kind, kind=kind, settings=settings, compiled=compiled)


def _compile_kind(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    kind: str,
    settings: dict[str, Any],
    compiled: dict[str, Any] | None = None,
) -> Any:
    """One graph of a backend call, compiled with the settings of that call: a backward
    compiled lazily, at the first backward call, uses its forward's settings, not
    whatever the environment or a `config.scope` says by then. Each compiled graph
    (and a forward's or inference graph's AOTAutograd metadata) is noted in
    `compiled`, for ember's lean runtime (ember.runtime.lean_runtime)."""
    with config.frozen(settings), full_collections_deferred():
        static = _static_inputs() if kind != "backward" else ()
        # a forward lends what it saves for the backward, a backward its gradients
        # (autograd moves them into `.grad`), an inference graph its results (a caller
        # that drops them before the next call saves their copy; ember.runtime.cudagraphs)
        lend = _saved_outputs_start() if kind == "forward" else 0
        graph = compile_graph(
            gm, example_inputs, name=kind, static_inputs=static, lend_outputs_from=lend
        )
    if compiled is not None:
        compiled[kind] = graph
        if kind != "backward":
            compiled["metadata"] = _forward_metadata()
        else:
            compiled["backward_outputs"] = _output_count(gm)
    return graph


def _output_count(gm: torch.fx.GraphModule) -> int:
    """How many values a graph returns (a backward: one gradient or None per input)."""
    return len(pytree.tree_leaves(output_node(gm).args[0]))


def _forward_metadata() -> Any:
    """AOTAutograd's view-and-mutation metadata of the graph being compiled, from its
    tracing context; None where torch records none."""
    from torch._guards import TracingContext

    return getattr(TracingContext.try_get(), "fw_metadata", None)


def _saved_outputs_start() -> int | None:
    """Where a training forward's outputs saved for the backward begin (after what the
    caller sees and the RNG state), from AOTAutograd's metadata; None where torch
    records no such count."""
    count = getattr(_forward_metadata(), "num_forward", None)
    return int(count) if isinstance(count, int) else None


def _static_inputs() -> list[int]:
    """The positions of the graph being compiled's inputs that AOTAutograd knows keep
    their address across calls (parameters and buffers), from its metadata; none
    where torch records no such list."""
    indices = getattr(_forward_metadata(), "static_input_indices", None)
    return list(indices) if indices else []


# torch.compile's `mode`, as ember settings: CUDA graphs are what "reduce-overhead"
# asks for; the other modes ask for autotuning ember does by default.
MODES: dict[str, dict[str, str]] = {
    "default": {},
    "reduce-overhead": {"cudagraphs": "on"},
    "max-autotune": {"cudagraphs": "on"},
    "max-autotune-no-cudagraphs": {"cudagraphs": "off"},
}


def call_settings(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """The settings of one backend call: the environment's (under any `config.scope`),
    then `torch.compile`'s `mode`, then its `options` (ember setting names, as
    `config.scope` takes them: `options={"cudagraphs": "off", "strict": True}`).
    An unknown mode or option, or a bad value, is an `EmberConfigError`."""
    config.validate()  # before anything reads a setting, so that the first bad one raises
    settings = config.snapshot()
    if mode is not None:
        if mode not in MODES:
            raise EmberConfigError(
                "mode", mode, f"one of {', '.join(map(repr, MODES))}",
                given_as=f"torch.compile(mode={mode!r})",
            )  # fmt: skip
        settings.update(MODES[mode])
    for name, value in (options or {}).items():
        knob = KNOBS.get(name)
        if knob is None:
            raise EmberConfigError(
                "options", name, f"an ember setting: one of {', '.join(sorted(KNOBS))}",
                given_as=f"torch.compile(options={{{name!r}: ...}})",
            )  # fmt: skip
        settings[name] = knob.accept(name, value)
    return settings


def partition_fn(device_type: str = "cuda") -> Callable[..., Any]:
    """The forward/backward split for training graphs (`EMBER_PARTITIONER`).

    AOTAutograd's min-cut partitioner saves for the backward the fewest bytes it can
    and recomputes the pointwise values in between (a layer norm's normalised input, a
    GELU's argument) inside the backward's fused kernels. On a GPU, where those kernels
    are bound by memory, that wins: GPT-2's fused-kernel traffic fell by a third and its
    training step went from 0.97x to 1.56x eager (H100). On the CPU the recomputed math
    costs more than the bytes it saves (GPT-2's step 8.5-9.0 -> 10.6-11.7 ms, 2 cores,
    one thread), so 'auto' saves every value there. The min-cut's cost model asks
    which ops fuse; it is torch's own (written for Inductor), and ember fuses the same
    pointwise and reduction ops.

    Either way, training-mode batch norm backwards first stop taking the running
    statistics they never read (`drop_training_running_statistics`), so neither
    partitioner keeps them for the backward."""
    from torch._functorch import partitioners

    choice = config.partitioner
    if choice == "auto":  # the device type's default (ember.runtime.devices)
        choice = "mincut" if defaults_for(device_type).mincut else "save-all"
    partition = min_cut_partition if choice == "mincut" else partitioners.default_partition

    def split(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        drop_training_running_statistics(joint_module)
        return partition(joint_module, joint_inputs, **kwargs)

    split.partition = partition  # type: ignore[attr-defined]  # which one, for tests
    return split


def min_cut_partition(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """AOTAutograd's min-cut partitioner, with ember's common-subexpression pass on the
    joint graph in place of the partitioner's own. Torch's imports Inductor's pattern
    matcher (`torch._inductor.pattern_matcher`, for two helpers), which cost 1.74 s of
    a fresh process's first training step on the H100 machine (attention block,
    `python -X importtime`), more than the rest of ember's compile of that step.
    Both merge repeated pure ops of the forward and backward before the cut, and keep
    a value only the forward uses apart from one the backward needs (else the cut
    may save the merged value for the backward); ember's also keeps apart reads of a
    storage written in between, and the bases of distinct outputs (cse.py)."""
    from torch._functorch import config as functorch_config
    from torch._functorch import partitioners

    merge_common_subexpressions(joint_module, group=_needed_by_backward(joint_module, kwargs))
    with functorch_config.patch(cse=False):
        return partitioners.min_cut_rematerialization_partition(
            joint_module, joint_inputs, **kwargs
        )


def _needed_by_backward(
    joint_module: torch.fx.GraphModule, kwargs: dict[str, Any]
) -> Callable[[torch.fx.Node], bool]:
    """Whether the backward's outputs (the joint graph's outputs after the forward's
    `num_fwd_outputs`) depend on a node. Everything counts as needed where the split
    point is unknown."""
    count = kwargs.get("num_fwd_outputs")
    if not isinstance(count, int):
        return lambda node: True
    output = output_node(joint_module)
    needed: set[torch.fx.Node] = set()
    stack = [a for a in pytree.tree_leaves(output.args)[count:] if isinstance(a, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    return needed.__contains__


def _channels_last_then(
    partition: Callable[..., Any], devices: Sequence[str], by_convolution: Sequence[str] = ()
) -> Callable[..., Any]:
    """`partition`, after the joint forward + backward graph of a training step on
    `devices` (`EMBER_LAYOUT`; CUDA by default) is turned channels-last
    (`channels_last_training`): the convolutions of both directions then read NHWC
    data, and the activations the forward saves cross to the backward in that layout.
    After the split, the forward alone could not change its saved activations'
    strides (the backward reads them as promised). A failure leaves the joint graph
    to the partitioner as it came, with a warning."""
    layout = channels_last_training(devices, by_convolution=by_convolution)

    def split(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        try:
            layout(joint_module)
        except Exception as exc:  # a layout is an optimisation: never fail the step for it
            log.warning("channels-last training layout skipped: %s: %s", type(exc).__name__, exc)
        return partition(joint_module, joint_inputs, **kwargs)

    return split


def ember_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """Dynamo backend entry: AOTAutograd around ember's graph compiler.

    `torch.compile(..., mode=..., options=...)` arrive as keyword arguments
    (`call_settings`); every graph of the call compiles with the one set of settings
    they make."""
    mode, options = kwargs.pop("mode", None), kwargs.pop("options", None)
    kwargs.pop("name", None)  # torch.compile's name for the compiled region
    settings = call_settings(mode, options)
    with config.frozen(settings), full_collections_deferred():
        gap = dtype_gaps.first_gap(gm)
        if gap is not None:
            return _refused_by_eager(gm, gap)
        return _aot_call(gm, example_inputs, settings, kwargs)


def _refused_by_eager(gm: torch.fx.GraphModule, gap: dtype_gaps.DtypeGap) -> Any:
    """A graph with an op eager has no kernel for at its dtypes runs eagerly, where
    that op raises eager's own error (ember.runtime.dtype_gaps); strict mode raises
    at compile time."""
    message = (
        f"{gap.describe()}; the graph runs eagerly, so that it raises as eager does "
        "(cast the input to a dtype the op supports)"
    )
    if config.strict:
        raise EmberCompileError("dynamo", "dtype check", NotImplementedError(message))
    log.warning("ember: %s", message)
    record_eager_graph("dynamo", message)
    return gm.forward


def _aot_call(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    settings: dict[str, Any],
    kwargs: dict[str, Any],
) -> Any:
    cuda = [x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.is_cuda]
    on_cuda = bool(cuda)
    device_type = "cuda" if on_cuda else "cpu"
    # the warm-start hint, taken before the attention rewrite below edits gm in place
    hint = None
    if config.kernels == "auto" and on_cuda:
        hint = compile_cache.warm_hint(gm, example_inputs)
        if not compile_cache.seen(hint):
            # the workers start (and warm up) while AOTAutograd traces; a graph
            # compiled before is likely all in the cache, and they start at the
            # first compile, if one comes (ember.runtime.triton_kernels.Precompiler)
            compile_pool.start(compile_pool.cuda_target(cuda[0]))
    elif config.kernels == "auto" and compile_cache.enabled():
        # the C++ compiler's identity and target, which a CPU graph's cache key holds,
        # are asked for while AOTAutograd traces
        compile_cache.prepare_cpu_target()
    # Hand-written attention -> SDPA on Dynamo's graph, so that AOTAutograd traces
    # SDPA's own backward too (after the split, the saved softmax blocks the ATen pattern).
    gm = rewrite_attention_pregrad(gm).graph_module
    graphs: dict[str, Any] = {}
    options: dict[str, Any] = dict(
        fw_compiler=_compiler("forward", settings, graphs),
        bw_compiler=_compiler("backward", settings, graphs),
        inference_compiler=_compiler("inference", settings, graphs),
        decompositions=_decompositions(device_type),
        partition_fn=_channels_last_then(
            partition_fn(device_type), config.layout_devices, config.layout_by_convolution
        ),
        # Input mutations stay in the inference graph as copy_ epilogues, which ember
        # runs in place, instead of being replayed by AOTAutograd's runtime wrapper.
        keep_inference_input_mutations=True,
    )
    eager_backward = config.backward == "eager" or (
        config.backward == "auto" and defaults_for(device_type).eager_backward
    )
    deferred = not eager_backward and config.autograd == "lean"
    if eager_backward:
        options["bw_compiler"] = _failing_at_first_call(options["bw_compiler"])
    elif deferred:  # AOTAutograd hands the backward over now, ember compiles it later
        options["bw_compiler"] = _compiled_at_first_call(options["bw_compiler"], graphs)
    with _backward_compile(eager_backward or deferred):
        if kwargs or any(isinstance(x, list | tuple | dict) for x in example_inputs):
            # nested inputs: torch's helper flattens them first
            compiled = aot_autograd(**options)(gm, example_inputs, **kwargs)
        else:
            compiled = _aot(gm, example_inputs, options)
            compiled = _lean_runtime(gm, example_inputs, graphs, compiled)
    compile_cache.remember(hint)  # None (nothing noted) but for CUDA graphs
    return compiled


def _lean_runtime(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    graphs: dict[str, Any],
    compiled: Callable[..., Any],
) -> Callable[..., Any]:
    """AOTAutograd's runtime `compiled`, or ember's lean one for the same compiled
    graphs where they allow it (`EMBER_AUTOGRAD`, ember.runtime.lean_runtime). A
    training graph qualifies only where its backward compiled with its forward; a
    graph module AOTAutograd took parameters out of (one holding them as attributes)
    never does, since its callers pass fewer inputs than the graphs take."""
    inference, forward, backward = (graphs.get(k) for k in ("inference", "forward", "backward"))
    graph = forward if forward is not None else inference
    if graph is None:
        return compiled
    why = None
    if config.autograd != "lean":
        why = "EMBER_AUTOGRAD=aot"
    elif forward is not None and backward is None:
        why = "AOTAutograd compiles the backward at its first call"
    elif any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        why = "the graph module holds parameters"
    else:
        outputs = graphs["backward_outputs"] if forward is not None else None
        why = lean_runtime.why_not_lean(graphs.get("metadata"), example_inputs, outputs)
    graph.record.autograd = "ember" if why is None else f"aot: {why}"
    if why is not None:
        log.debug("%s: AOTAutograd's runtime (%s)", graph.record.graph, why)
        return compiled
    lean: Callable[..., Any]
    if forward is None:
        lean = lean_runtime.lean_inference(graph, graphs["metadata"], compiled)
    else:
        assert backward is not None  # checked above: for mypy
        lean = lean_runtime.lean_training(
            forward, backward, graphs["metadata"], compiled, graph=forward.record.graph
        )
    disable: Callable[..., Callable[..., Any]] = torch._dynamo.disable
    return disable(lean)


def _decompositions(device_type: str) -> dict[Any, Any]:
    """AOTAutograd's decomposition table for a graph on `device_type`.

    Training batch norm stays whole on the CPU (`DeviceDefaults.decompose_batch_norm`):
    decomposing it was most of the decomposition time of resnet18's training trace
    (0.37 of 0.52 s under the profiler, 2-core CPU), paid by every process, warm
    ones included, and the CPU's save-everything split has no recomputation for the
    decomposed form to help. On GPUs the decomposed form schedules better (see
    ember.graphpasses.decompositions.EMBER_ADDITIONS)."""
    table = aot_decompositions()
    if not defaults_for(device_type).decompose_batch_norm:
        table.pop(torch.ops.aten._native_batch_norm_legit_functional.default, None)
    return table


def _failing_at_first_call(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """`compiler`, with an error (EMBER_STRICT: a backward that fails to compile
    raises) raised where a lazily compiled backward would raise it: at the first
    backward call, not at the forward's compile. A forward never differentiated
    then runs, as it does with the backward compiled lazily."""

    def compile_or_defer(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        try:
            return compiler(gm, example_inputs)
        except EmberConfigError:
            raise  # the user's setting, not the backward's compile: say so now
        except Exception as exc:
            error = exc

            def failed(args: list[Any]) -> Any:
                raise error

            failed._boxed_call = True  # type: ignore[attr-defined]
            return failed

    return compile_or_defer


def _compiled_at_first_call(
    compiler: Callable[..., Any], graphs: dict[str, Any]
) -> Callable[..., Any]:
    """`compiler` for a backward that compiles lazily (`EMBER_BACKWARD=lazy`, the
    CPU's default) while AOTAutograd hands it over with the forward: the graph is
    kept and compiled at its first call, in the forward's tracing and compile
    contexts, as AOTAutograd's own lazy compile does. Knowing the backward at the
    forward's compile lets the graph run on ember's lean runtime
    (ember.runtime.lean_runtime), which AOTAutograd's lazy compile would not allow,
    and a forward never differentiated still compiles no backward."""
    from torch._guards import CompileContext, TracingContext, compile_context, tracing

    def compile_later(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        saved_tracing, saved_compile = TracingContext.try_get(), CompileContext.try_get()
        lock = threading.Lock()
        compiled: list[Any] = []

        def backward(args: list[Any]) -> Any:
            if not compiled:
                with lock, contextlib.ExitStack() as stack:
                    if not compiled:
                        if saved_tracing is not None:
                            stack.enter_context(tracing(saved_tracing))
                        if saved_compile is not None:
                            stack.enter_context(compile_context(saved_compile))
                        stack.enter_context(torch._C._DisableAutocast())
                        compiled.append(compiler(gm, example_inputs))
            return compiled[0](args)

        backward._boxed_call = True  # type: ignore[attr-defined]
        graphs["backward"] = backward
        graphs["backward_outputs"] = _output_count(gm)
        return backward

    return compile_later


def _backward_compile(eager: bool) -> contextlib.AbstractContextManager[Any]:
    """Compile a training graph's backward right after its forward (`EMBER_BACKWARD`).

    AOTAutograd compiles the backward at the first backward call by default, so on a
    cold first step everything the backward's compile waits for (its Triton kernels,
    in the compile workers) comes after the forward has compiled and run: attention
    on the H100 machine spent 0.95 s of its 2.58 s first step in the backward call
    (compile and run), the backward's worker jobs sent 1.86 s in. Compiled eagerly,
    the backward is lowered while the forward's kernels compile, and its own kernels
    compile while the forward's are waited for and run (`compile_triton_kernels`
    returns before its compiles end). The price: a forward that is never
    differentiated has its backward compiled anyway. Torch's switch for this is
    private (functorch config `force_non_lazy_backward_lowering`, which its
    ahead-of-time compile sets); where it is missing, the backward compiles lazily as
    before."""
    from torch._functorch import config as functorch_config

    if not eager or not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    patch: contextlib.AbstractContextManager[Any]
    patch = functorch_config.patch(force_non_lazy_backward_lowering=True)
    return patch


def _aot(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any]) -> Any:
    """AOTAutograd on Dynamo's graph, called directly rather than through torch's
    `aot_autograd` backend helper: that helper imports Inductor's debug module (and
    with it Inductor's scheduler and IR), 0.75 s of a fresh process's first compile on
    the H100 machine, for logging ember does not use. What it does that matters is
    kept: Dynamo must not trace the backward's compile nor the compiled functions
    (`torch._dynamo.disable`), and the call is counted in Dynamo's
    `counters["aot_autograd"]`, which is how Dynamo's DDP support learns that
    AOTAutograd ran (it then makes each compiled bucket's first call, whose results
    are fake, itself at compile time; uncounted, the user's first call returned fake
    tensors)."""
    backward = options["bw_compiler"]
    disable: Callable[..., Any] = torch._dynamo.disable

    def compile_backward(*args: Any, **kwargs: Any) -> Any:
        return disable(disable(backward)(*args, **kwargs))

    options["bw_compiler"] = compile_backward
    counters["aot_autograd"]["total"] += 1
    try:
        compiled = aot_module_simplified(gm, example_inputs, **options)
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled)


def register() -> None:
    """Make `backend="ember"` known to Dynamo (idempotent).

    Not for a caller that Dynamo's loading of the entry point may be importing: Dynamo
    registers what the entry point names once the import returns, and a name already
    registered is an error there (ember.runtime.registration is for that case)."""
    from torch._dynamo.backends import registry

    if "ember" not in registry._COMPILER_FNS:
        registry.register_backend(name="ember")(ember_backend)
