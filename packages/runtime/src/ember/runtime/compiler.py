"""The compile driver: one ATen graph through the whole stack to a callable.

passes (ember.graphpasses) -> lowering and verification (ember.ir) -> schedule and
memory plan (ember.scheduler) -> wrapper source -> load. Each stage is timed, and with
`EMBER_DEBUG_DIR` set each stage's output is written there. A failure in any stage
either raises `EmberCompileError` (strict mode) or is logged and the graph runs eagerly,
so a compiler bug never takes the user's program down. A bad setting
(`EmberConfigError`) is the user's to fix, not a compiler bug: it always raises.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ember.graphpasses import default_pipeline
from ember.graphpasses.effects import written_args
from ember.ir import (
    ExternShapeMismatch,
    LoweringOptions,
    Program,
    format_program,
    lower_graph,
    verify,
)
from ember.runtime import compile_cache
from ember.runtime.artifact import Artifact, runner
from ember.runtime.bounded import RecentRecords
from ember.runtime.config import EmberConfigError, config
from ember.runtime.cpu_gemm import prefer_for, recorded, rule_key
from ember.runtime.debug import repro_source, run_directory
from ember.runtime.devices import device_records
from ember.runtime.explain import EXPLAIN_FILE, matmul_dtypes, schedule_summary
from ember.runtime.kernels import (
    Launcher,
    Records,
    compile_kernels,
    extern_depthwise,
    measures_matmuls,
    scheduling_choices,
    sort_limits,
    template_choices,
    unsupported_ops,
    wants_loops,
)
from ember.runtime.layouts import input_records
from ember.runtime.loader import load_module, write_source
from ember.runtime.logs import setup_logging, trace_artifact, tracing
from ember.runtime.matmul_choice import CudaMatmulTimer, choose_matmuls
from ember.runtime.profiling import StepTimer
from ember.runtime.wrapper import generate_wrapper
from ember.scheduler import ExternCall, Schedule, schedule_program

log = logging.getLogger("ember.runtime")
_graph_ids = itertools.count()


class EmberCompileError(RuntimeError):
    """A graph failed to compile (raised in strict mode, logged otherwise)."""

    def __init__(self, graph: str, stage: str, cause: BaseException) -> None:
        super().__init__(
            f"ember failed to compile graph {graph!r} in stage {stage!r}: "
            f"{type(cause).__name__}: {cause}. (Such graphs run eagerly unless EMBER_STRICT=1; "
            "EMBER_DEBUG_DIR=<dir> dumps each stage's output.)"
        )
        self.graph = graph
        self.stage = stage


@dataclass
class CompileRecord:
    """What compiling one graph did; kept in `compile_records` for demo and bench."""

    graph: str
    kernels: int = 0
    steps: int = 0
    fallback_ops: list[str] = field(default_factory=list)
    wrapper_path: Path | None = None
    debug_dir: Path | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    fused_kernels: int = 0  # generated kernels among `kernels`
    planned_peak_bytes: int = (
        0  # the memory plan's peak (size symbols counted as `ember.ir.SIZE_HINT`)
    )
    kernel_fallback: str | None = None  # why, when generated kernels failed (ATen used)
    ran_eagerly: str | None = None  # why, when the graph fell back to eager
    cudagraphs: str = "off"  # whether its calls replay CUDA graphs, or why not
    # a training forward's or inference graph's runtime: "ember"
    # (ember.runtime.lean_runtime) or "aot: why"
    autograd: str = ""
    # EMBER_MATMUL_TEMPLATES=auto: template or cuBLAS for each matmul, and the times
    matmul_choices: list[str] = field(default_factory=list)
    # what it compiled to, while the compiled graph lives (ember.runtime.artifact:
    # `record.artifact.save(dir)`); weak, so the records kept for reports do not keep
    # every graph's kernels loaded
    _artifact: weakref.ref[Artifact] | None = field(default=None, repr=False, compare=False)

    @property
    def artifact(self) -> Artifact | None:
        return self._artifact() if self._artifact is not None else None

    @artifact.setter
    def artifact(self, value: Artifact | None) -> None:
        self._artifact = weakref.ref(value) if value is not None else None

    @property
    def seconds(self) -> float:
        return sum(self.stage_seconds.values())


# The last 4096 graphs' records (positions still count every graph: `RecentRecords`).
RECORDS_KEPT = 4096
compile_records: RecentRecords[CompileRecord] = RecentRecords(RECORDS_KEPT)


class CompiledGraph:
    """The compiled callable: boxed (takes the list of inputs, which it empties)."""

    def __init__(
        self,
        call: Callable[[list[Any]], Any],
        record: CompileRecord,
        artifact: Artifact | None = None,
    ) -> None:
        # An instance attribute, not a class one: wrappers that AOTAutograd puts around
        # the callable copy __dict__ (functools.wraps), and the flag must survive that.
        self._boxed_call = True
        self._call = call
        self.record = record
        self.artifact = artifact  # the record's reference to it is weak

    def __call__(self, args: list[Any]) -> Any:
        return self._call(args)


def record_eager_graph(name: str, why: str) -> CompileRecord:
    """Keep a record for a graph that runs eagerly without being compiled (eager
    refuses one of its dtypes: ember.runtime.dtype_gaps), so that reports which count
    the graphs that ran eagerly count it too."""
    record = _new_record(name)
    record.ran_eagerly = why
    return record


def _new_record(name: str) -> CompileRecord:
    """A record for the next graph, named `name` and its number, kept in
    `compile_records`."""
    record = CompileRecord(f"{name}_{next(_graph_ids)}")
    compile_records.append(record)
    return record


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] = (),
    *,
    name: str = "graph",
    static_inputs: Sequence[int] = (),
    lend_outputs_from: int | None = None,
) -> CompiledGraph:
    """Compile an ATen-level graph (nodes carry `meta['val']`) into a boxed callable.

    `static_inputs` are the positions of inputs that keep their address from call to
    call (parameters and buffers): a CUDA graph reads them in place
    (ember.runtime.cudagraphs). Outputs from `lend_outputs_from` on (a training
    forward's saved tensors, which only its backward reads) are handed out of a CUDA
    graph's memory without a copy."""
    config.validate()
    setup_logging()
    record = _new_record(name)
    graph_name = record.graph
    debug_root = config.debug_dir
    debug = run_directory(debug_root) / graph_name if debug_root is not None else None
    record.debug_dir = debug
    eager_gm = gm
    if debug is not None:  # first: a graph that fails to compile needs it most
        _dump(debug, "repro.py", lambda: repro_source(eager_gm, example_inputs, graph_name), "")

    key = None
    if compile_cache.enabled() and debug is None:  # a debug dump shows every stage run
        with _timed(record, "cache"):
            try:
                key = compile_cache.graph_key(eager_gm, static_inputs, _devices(eager_gm))
                cached = compile_cache.lookup(key, graph_name)
            except EmberConfigError:
                raise
            except Exception as exc:  # the cache is an optimisation: compile instead
                log.warning("compile cache not used for %s: %r", graph_name, exc)
                key, cached = None, None
        if cached is not None:
            artifact, guarded = cached
            for name, value in artifact.extra.get("record", {}).items():
                setattr(record, name, value)
            record.wrapper_path = artifact.source_path
            # the stages did not run: the trace gets what the cache holds, the wrapper
            trace_artifact(f"ember_{graph_name}_wrapper", lambda: artifact.wrapper.source)
            return _finish(guarded, artifact, eager_gm, record, static_inputs, lend_outputs_from)

    # passes rewrite a copy, eager keeps the original (copied only on a miss: the
    # copy took 10-25 ms per graph of GPT-2 on the CPU, and a hit needs none)
    gm = _copy_graph_module(eager_gm)
    stage = "passes"
    gemm_choices: dict[str, str] = {}  # CPU matmul -> "oneDNN" or "ATen", for the artifact
    try:
        with _timed(record, stage):
            cpu = any(d.type == "cpu" for d in _devices(gm))
            pipeline = default_pipeline(
                dump_dir=debug / "passes" if debug else None,
                layout_devices=config.layout_devices,
                layout_by_convolution=config.layout_by_convolution,
                cpu_linear_prefer=recorded(prefer_for(config.cpu_gemm), gemm_choices)
                if cpu
                else None,
            )
            gm, report = pipeline.run(gm)
            log.debug("%s", report.format())
        trace_artifact(f"ember_{graph_name}_passes", lambda: _passes_text(gm, report.format()))
        records = device_records(_devices(gm))  # each device asked once, here
        loops = wants_loops(records, config.kernels)
        stage = "lowering"
        program, schedule, launchers = _build(gm, graph_name, record, debug, records, loops=loops)
        if loops and launchers is None:
            program, schedule, launchers = _build(
                gm, graph_name, record, debug, records, loops=False
            )
        stage = "wrapper"
        with _timed(record, stage):
            timer = _step_timer(graph_name, debug, schedule) if debug and config.profile else None
            wrapper = generate_wrapper(schedule, launchers, timer)
            path = write_source(config.cache_dir / "wrappers", wrapper.source)
            module = load_module(path, {})
            artifact = Artifact(
                graph_name,
                wrapper,
                dict(launchers or {}),
                input_records(program, gm),
                tuple(static_inputs),
                source_path=path,
            )
            guarded = runner(artifact, module)
        _dump(debug, "wrapper.py", lambda: wrapper.source, graph_name)
    except EmberConfigError:
        raise  # a setting changed mid-compile: running eagerly would hide it
    except Exception as exc:
        error = EmberCompileError(graph_name, stage, exc)
        if config.strict:
            raise error from exc
        log.warning("%s Running this graph eagerly.", error)
        record.ran_eagerly = str(error)
        return CompiledGraph(_eager_runner(eager_gm), record)

    _fill_record(record, program, schedule, path)
    _dump(debug, EXPLAIN_FILE, lambda: json.dumps(schedule_summary(schedule), indent=1), graph_name)
    log.info(
        "compiled %s: %d kernels, %d steps, %.1f ms, wrapper %s",
        graph_name,
        record.kernels,
        record.steps,
        record.seconds * 1e3,
        path,
    )
    artifact.extra["record"] = {
        name: getattr(record, name)
        for name in ("kernels", "fused_kernels", "planned_peak_bytes", "steps", "fallback_ops")
    }
    if gemm_choices:
        artifact.extra["cpu_gemm"] = {"rule": rule_key(config.cpu_gemm), "choices": gemm_choices}
    # a graph whose generated kernels failed is not kept: the cause may be this
    # machine's (no compiler), and a later process would run ATen kernels for good
    if key is not None and record.kernel_fallback is None:
        guarded = compile_cache.store_after_first_call(guarded, key, artifact)
    return _finish(guarded, artifact, eager_gm, record, static_inputs, lend_outputs_from)


def _finish(
    guarded: Callable[[list[Any]], Any],
    artifact: Artifact,
    eager_gm: torch.fx.GraphModule,
    record: CompileRecord,
    static_inputs: Sequence[int],
    lend_outputs_from: int | None = None,
) -> CompiledGraph:
    """The compiled graph around an artifact's guarded call (compiled here or loaded
    from the cache): eager on a shape mismatch, CUDA graphs, EMBER_CHECK."""
    record.artifact = artifact
    # kernels bake each input's strides and storage offset: a call with others copies
    call = _eager_on_shape_mismatch(guarded, eager_gm, record)
    call = _graphed(call, eager_gm, record, static_inputs, lend_outputs_from, artifact)
    if config.check != "off":  # EMBER_CHECK: also run eagerly and compare (ember.runtime.check)
        from ember.runtime.check import checked

        call = checked(call, eager_gm, record.graph, record.wrapper_path)
    return CompiledGraph(call, record, artifact)


def recompute_shared(records: Records) -> bool:
    """Whether a graph on the devices of `records` recomputes shared values wider than
    their inputs (EMBER_RECOMPUTE: `cuda`, the default, for graphs with a device whose
    type recomputes by default: `DeviceDefaults.recompute_shared`, CUDA's)."""
    setting = config.recompute
    return setting == "all" or (
        setting == "cuda" and any(r.defaults.recompute_shared for r in records.values())
    )


def _build(
    gm: torch.fx.GraphModule,
    name: str,
    record: CompileRecord,
    debug: Path | None,
    records: Records,
    *,
    loops: bool,
) -> tuple[Program, Schedule, dict[str, Launcher] | None]:
    """Lower, schedule and compile the kernels of one graph.

    Lowering and scheduling errors propagate (the caller decides: strict or eager).
    A failure to generate or compile kernels returns `None` launchers so the caller
    can retry with every op as an ATen call: a kernel bug costs speed, not the graph.
    """
    with _timed(record, "lowering"):
        options = LoweringOptions(
            allow_fallback=config.fallback,
            loops=loops,
            unsupported_ops=unsupported_ops(records, config.kernels) if loops else frozenset(),
            sort_limits=sort_limits(records, config.kernels),
            extern_depthwise=extern_depthwise(records, config.depthwise),
            recompute_shared=recompute_shared(records),
            index_checks=config.index_checks,
        )
        program = lower_graph(gm, name=name, options=options)
        verify(program)
    _dump(debug, "ir.txt", lambda: format_program(program), name)
    measured = measures_matmuls(records, config.kernels, config.matmul_templates)
    templates = template_choices(records) if measured else None
    with _timed(record, "scheduling"):
        training = name.startswith(("forward", "backward"))
        choices = scheduling_choices(records, config.matmul_templates, training)
        if templates is None:
            schedule = schedule_program(program, choices)
    if templates is not None:
        # EMBER_MATMUL_TEMPLATES=auto: a template for each matmul that measures faster
        with _timed(record, "matmul choice"):
            timer = CudaMatmulTimer(config.cache_dir / "kernels")
            schedule, decisions = choose_matmuls(program, templates, choices, timer)
            record.matmul_choices = [d.describe() for d in decisions]
    _dump(debug, "schedule.txt", schedule.format, name)
    if not schedule.kernels:
        return program, schedule, {}
    try:
        with _timed(record, "kernels"):
            launchers = compile_kernels(
                schedule.kernels, config.kernels, config.cache_dir / "kernels", records
            )
    except EmberConfigError:
        raise
    except Exception as exc:
        if config.strict:
            raise
        log.warning(
            "generated kernels for graph %r failed (%s: %s); its ops run as ATen kernels",
            name,
            type(exc).__name__,
            exc,
        )
        record.kernel_fallback = f"{type(exc).__name__}: {exc}"
        return program, schedule, None
    if debug is not None or tracing():
        _dump_kernel_source(debug, launchers, name)
    return program, schedule, launchers


def _dump_kernel_source(debug: Path | None, launchers: dict[str, Launcher], graph: str) -> None:
    """The graph's generated kernels: the translation unit of its C++ kernels as
    `kernels.cpp` (the cache keeps it too, but under a hashed name beside its library),
    its Triton kernels' modules as `kernels_triton.py`."""
    from ember.runtime.cpp_kernels import CppKernel

    kernels = [k for k in launchers.values() if isinstance(k, CppKernel)]
    units = {id(k.unit): k.unit.source.source for k in kernels}
    if units:
        _dump(debug, "kernels.cpp", lambda: "\n".join(units.values()), graph)
    triton = {
        name: launcher.kernel.source
        for name, launcher in launchers.items()
        if hasattr(launcher, "kernel") and isinstance(getattr(launcher.kernel, "source", None), str)
    }
    if triton:
        text = "\n\n".join(f"# kernel {name}\n{source}" for name, source in triton.items())
        _dump(debug, "kernels_triton.py", lambda: text, graph)


def _passes_text(gm: torch.fx.GraphModule, report: str) -> str:
    """The graph after the passes, as Python, and what each pass did."""
    return f"{gm.print_readable(print_output=False)}\n\n# passes\n{report}"


def _step_timer(graph: str, debug: Path, schedule: Schedule) -> StepTimer:
    """The timer of a profiled graph (EMBER_PROFILE): every step that runs device code."""
    steps = {i: s.name for i, s in enumerate(schedule.steps) if s.launches_kernel}
    devices = [k.device for k in schedule.kernels]
    for step in schedule.steps:
        if isinstance(step, ExternCall):
            devices += [o.device for o in step.node.outputs if o is not None]
    device = next((d for d in devices if d.type == "cuda"), torch.device("cpu"))
    return StepTimer(graph, debug, steps, device, matmul_dtypes(schedule))


def _devices(gm: torch.fx.GraphModule) -> set[torch.device]:
    devices: set[torch.device] = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            devices.add(val.device)
    return devices


def _fill_record(record: CompileRecord, program: Program, schedule: Schedule, path: Path) -> None:
    record.kernels = schedule.kernel_count
    record.fused_kernels = len(schedule.kernels)
    record.planned_peak_bytes = schedule.memory.peak_bytes
    record.steps = len(schedule.steps)
    record.fallback_ops = sorted(program.fallback_ops)
    record.wrapper_path = path


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    result = graph.graph_copy(gm.graph, {})
    graph.output(result)
    return torch.fx.GraphModule(gm, graph)


def _eager_on_shape_mismatch(
    call: Callable[[list[Any]], Any], eager_gm: torch.fx.GraphModule, record: CompileRecord
) -> Callable[[list[Any]], Any]:
    """`call`, switching the graph to eager for good where an extern call returns
    other sizes than the graph's metadata promised (ember.ir.ExternShapeMismatch: a
    torch shape function that disagrees with its kernel; ember's kernels were planned
    for the wrong sizes). Only for graphs that write none of their inputs: a graph
    stopped halfway may have written some, and would write them again. Under
    EMBER_STRICT the error is raised."""
    if config.strict or any(written_args(node) for node in eager_gm.graph.nodes):
        return call
    eager = _eager_runner(eager_gm)
    state = {"call": call}

    def run(args: list[Any]) -> Any:
        inputs = list(args)  # the wrapper empties `args`
        try:
            return state["call"](args)
        except ExternShapeMismatch as exc:
            log.warning("%s: %s. Running this graph eagerly from now on.", record.graph, exc)
            record.ran_eagerly = str(exc)
            state["call"] = eager
            return eager(inputs)

    return run


def _graphed(
    call: Callable[[list[Any]], Any],
    gm: torch.fx.GraphModule,
    record: CompileRecord,
    static_inputs: Sequence[int],
    lend_outputs_from: int | None = None,
    artifact: Artifact | None = None,
) -> Callable[[list[Any]], Any]:
    """`call`, replayed from CUDA graphs where `EMBER_CUDAGRAPHS` and the graph allow
    (ember.runtime.cudagraphs); `record.cudagraphs` says what happened. Whether the
    graph can be recorded goes into `artifact`'s manifest, for a loaded copy."""
    setting = config.cudagraphs
    if config.profile and config.debug_dir is not None:
        record.cudagraphs = "off: EMBER_PROFILE times each step"
        return call
    if not any(
        isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_cuda
        for n in gm.graph.nodes
    ):
        record.cudagraphs = "off" if setting == "off" else "no CUDA tensors"
        return call
    from ember.runtime import cudagraphs

    empty = "the graph launches nothing (views only)" if cudagraphs.launches_nothing(gm) else None
    if artifact is not None:  # whatever this process's settings (EMBER_CHECK, graphs off)
        plain = empty or cudagraphs.graph_blocker(gm, static_inputs, "off")
        artifact.extra["cudagraphs"] = {"device": cudagraphs.graph_device(gm), "blocker": plain}
    if setting == "off":
        record.cudagraphs = "off"
        return call
    if empty is not None:  # nothing to record: no log line, under any setting
        record.cudagraphs = f"off: {empty}"
        return call
    blocker = cudagraphs.graph_blocker(gm, static_inputs, config.check)
    if blocker is not None:
        level = logging.WARNING if setting == "on" else logging.INFO
        log.log(level, "CUDA graphs off for graph %s: %s", record.graph, blocker)
        record.cudagraphs = f"off: {blocker}"
        return call
    record.cudagraphs = "waiting for a second call"

    def note(state: str) -> None:
        record.cudagraphs = state

    return cudagraphs.GraphedCall(
        call,
        name=record.graph,
        static_inputs=static_inputs,
        device=cudagraphs.graph_device(gm),
        loud=setting == "on",
        adaptive=setting == "auto",
        on_record=note,
        lend_from=lend_outputs_from,
        # a graph lending all it returns (a backward's gradients) returns them to a
        # caller that may keep them; a forward's lent tensors only its backward reads
        copy_when_held=lend_outputs_from == 0,
    )


def _eager_runner(gm: torch.fx.GraphModule) -> Callable[[list[Any]], Any]:
    def run(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        return gm(*inputs)

    return run


class _timed:
    def __init__(self, record: CompileRecord, stage: str) -> None:
        self.record, self.stage = record, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.record.stage_seconds[self.stage] = time.perf_counter() - self.start


def _dump(directory: Path | None, filename: str, text: Callable[[], str], graph: str) -> None:
    """A stage's output: written to the graph's debug directory (EMBER_DEBUG_DIR) and
    to TORCH_TRACE as the artifact `ember_<graph>_<stage>` (ember.runtime.logs)."""
    traced = tracing() and bool(graph)  # `graph` empty: for the debug directory only
    if directory is None and not traced:
        return
    content = text()
    if traced:
        trace_artifact(f"ember_{graph}_{filename.rsplit('.', 1)[0]}", lambda: content)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / filename).write_text(content)
