"""CUDA graphs around compiled graphs (`EMBER_CUDAGRAPHS`, `mode="reduce-overhead"`).

A compiled graph's wrapper launches one kernel after another from Python: tens of
microseconds of host time per launch, where a small model's kernels take a few each.
A CUDA graph records the launches of one call once and replays them with one driver
call. What makes that legal and how ember does it:

- **When.** A graph is recorded only where its replay does what a call would: every
  tensor on one CUDA device (a CPU tensor's value is read by the host when the
  launch is recorded, and would be stale at every replay), no data-dependent sizes
  or host syncs (`.item()`, `nonzero`: recording cannot wait for the device), no
  write to an input that is not a parameter or buffer (the write would land in the
  recording's copy of the input), and not under `EMBER_CHECK`. Otherwise the graph
  runs its launches as before, and why is logged once per graph (`graph_blocker`).
- **Inputs.** Parameters and buffers (AOTAutograd's static inputs) are read where
  they live: their addresses are checked at each replay (one C call for all of them)
  and a change records again. Every other tensor input is copied, at each replay,
  into a buffer the recording owns, laid out as the input was when recorded.
- **Outputs.** A replay writes its results into the same memory every time. Ember
  copies each result out into memory of its own (one `_foreach_copy_`), so a tensor
  handed to the user is never overwritten by a later replay, whatever the user keeps
  and however calls interleave; results that are views of an input are rebuilt as
  views of that input. The price is one copy of the outputs per call, which the
  graphs below avoid by lending.
- **What a training forward saves for its backward** is not copied: only the
  backward reads it, so the forward's replay lends it out of the recording's memory
  (a new storage object over that memory per replay) and the backward's recording
  reads it in place, checking at each replay that it is still there. Before the
  next replay rewrites that memory, the forward checks that everything it lent last
  time has died (autograd frees saved tensors once the backward has run): lent
  results are built on the recording's own storages, the ones that own the memory,
  so their use count back at the recording's own says nothing else holds them (a
  weak reference per storage per replay cost a few microseconds each, and a
  MobileNetV3 step lends ~190), and a result still held when the recording is gone
  (`torch._dynamo.reset()`) keeps its memory allocated rather than dangling; where
  something is still held (two forwards before one backward), that call runs plainly
  into memory of its own. On a MobileNetV3 training step this copy, and the copy of
  the saved tensors into the backward's recording, were most of the host time
  (H100, 2026-11-24).
- **An inference graph's results** are lent the same way: most callers drop a
  result before the next call (a serving loop, a benchmark), and then the next replay
  writes into that memory again without a copy out; a result still held at the next
  replay leaves that call to a second recording that copies its results out (below).
  The copy out was about a fifth of ember's host time per call of a three-layer MLP
  (H200, 2026-11-24).
- **A backward's gradients** are lent too: autograd moves a gradient it receives
  into `.grad` without a copy where `.grad` is None, and `zero_grad()` (which sets
  it to None) lets it die before the next backward. Where a lent gradient is still
  held at the next replay (`zero_grad(set_to_none=False)`, gradients accumulated
  over several backwards, a reference kept by the user), the sizes get a second
  recording that copies its results out, as an inference graph does, and that one
  replays whenever the first cannot. Copying 39 gradients out of a small Llama's
  backward cost about a third of its host time per step (H100, 2026-11-24).
- **Memory.** One pool per device, shared by every recording of the process (a
  forward and its backward included): a recording's intermediate buffers are free
  again when its replay ends, and the outputs leave the pool at once, so the next
  recording can reuse them. Copied-input buffers live outside the pool.
- **Sizes.** One recording per distinct set of input sizes (and strides of copied
  inputs, and integer inputs), after one plain call with those sizes (which compiles
  and tunes the kernels: recording cannot wait for the device), up to
  `MAX_RECORDINGS` per graph; beyond that, calls run their launches plainly. Under
  'auto', a second plain call is timed first: where the device, not the host, is
  the bottleneck, a recording would save nothing and cost memory, so those sizes
  stay plain (`GPU_BOUND`).
- **Randomness.** The seed a graph draws per call comes from torch's CUDA generator,
  which torch advances at each replay as a call would advance it, so seeded dropout
  gives the same values graphed and not graphed.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ember.graphpasses.effects import mutated_storages, storage_key
from ember.runtime.layouts import pointers_equal

log = logging.getLogger("ember.runtime")

MAX_RECORDINGS = 8  # per graph: distinct sizes, or parameters that moved
# Under 'auto', sizes whose launches the host enqueues in less than this fraction of
# the time the device runs them are not recorded (`GraphedCall._measured`).
GPU_BOUND = 0.5
# Ops whose result the host must wait for (or whose sizes depend on data): a recording
# cannot contain them.
_SYNCING_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.item",
        "aten.nonzero",
        "aten.masked_select",
        "aten.unique",
        "aten._unique",
        "aten._unique2",
        "aten.unique_consecutive",
        "aten.unique_dim",
        "aten.equal",
        "aten.is_nonzero",
    }
)

_pools: dict[int, Any] = {}
_pools_lock = threading.Lock()


def memory_pool(device: int) -> Any:
    """The memory pool of every recording on CUDA device `device`.

    Torch frees a pool when the last graph recorded into it is destroyed, and a
    handle recorded into after that trips an internal assertion of its allocator
    (seen on torch 2.11 once a test's graphs were dropped). So each pool gets a
    graph of its own, recorded once and kept for the process. It writes one
    zero: torch warns about every empty recording, and a user would read that
    warning as a fault of their model's graphs."""
    with _pools_lock:
        entry = _pools.get(device)
        if entry is None:
            pool = torch.cuda.graph_pool_handle()
            keeper = torch.cuda.CUDAGraph()
            with (
                torch.cuda.device(device),
                torch.cuda.graph(keeper, pool=pool, capture_error_mode="thread_local"),
            ):
                torch.zeros((), device=torch.device("cuda", device))
            entry = _pools[device] = (pool, keeper)
        return entry[0]


def graph_blocker(gm: torch.fx.GraphModule, static_inputs: Sequence[int], check: str) -> str | None:
    """Why the graph `gm` (ATen, `meta['val']` on its nodes) cannot be recorded as a
    CUDA graph, or None where it can."""
    if check != "off":
        return "EMBER_CHECK runs each call eagerly as well"
    devices: set[torch.device] = set()
    for node in gm.graph.nodes:
        values = node.meta.get("val")
        for value in values if isinstance(values, list | tuple) else [values]:
            if isinstance(value, torch.Tensor):
                devices.add(value.device)
            if free_unbacked_symbols(value):
                return f"node {node.name} has a data-dependent size"
        if node.op == "call_function":
            packet = getattr(node.target, "overloadpacket", None)
            qualified = str(packet).replace("::", ".") if packet is not None else ""
            if qualified in _SYNCING_OPS:
                return f"node {node.name} ({qualified}) waits for the device's result"
            if qualified.split(".", 1)[0] in ("_c10d_functional", "c10d", "_dtensor"):
                # a recorded collective replays against whatever the other ranks do
                # then; torch records NCCL work only under conditions not checked here
                return f"node {node.name} ({qualified}) is a collective"
    if any(d.type != "cuda" for d in devices):
        return "the graph has CPU tensors"
    if len(devices) != 1:
        return "the graph has no CUDA tensor" if not devices else "the graph spans devices"
    written = mutated_storages(gm.graph.nodes)  # views share their base's storage
    static = set(static_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        if index not in static and storage_key(node.meta.get("val")) in written:
            return f"the graph writes input {node.name}, which is not a parameter"
    return None


def launches_nothing(gm: torch.fx.GraphModule) -> bool:
    """Whether every op of `gm` is a view (its result aliases an input, nothing
    written) or picks a tuple item: such a graph launches no device work, so a
    recording of it would be empty (torch warns about each one) and a replay saves
    nothing over the plain call."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            continue
        schema = getattr(node.target, "_schema", None)
        returns = schema.returns if schema is not None else []
        alias = returns[0].alias_info if len(returns) == 1 else None
        if alias is None or alias.is_write:
            return False
    return True


def graph_device(gm: torch.fx.GraphModule) -> int:
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value.device.index or 0
    return torch.cuda.current_device()


@dataclass
class _Output:
    """How one result of a recording reaches the caller at each replay."""

    # "value", "input" (input `index` itself), "alias" (a view of input `index`),
    # "copy" (into a fresh tensor), "bytes" (a view of a fresh copy of its storage),
    # "lent" (the recording's memory at `index`)
    kind: str
    value: Any = None  # a "value" result itself; for "bytes" and "lent", the metadata
    index: int = 0  # the input aliased, or the byte buffer shared with other results
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0


def _metadata(
    dtype: torch.dtype, size: tuple[int, ...], stride: tuple[int, ...], offset: int
) -> dict[str, Any]:
    """What `_TENSOR_ON` needs to build a result over a storage."""
    return {"dtype": dtype, "size": size, "stride": stride, "storage_offset": offset}


# A CUDA tensor viewing a storage as `_metadata` says: one call into torch, where an
# empty tensor's `set_` takes two and a third of the host time per result (a training
# step hands out a few hundred). Called as `_TENSOR_ON(metadata, storage)`, inline in
# `replay`'s loop: a Python wrapper around it cost a tenth of the replay.
_TENSOR_ON = torch._C._construct_CUDA_Tensor_From_Storage_And_Metadata


class _Recording:
    """One recorded call: its graph, the buffers its copied inputs go into, and how
    its results are handed out."""

    def __init__(
        self,
        call: Callable[[list[Any]], Any],
        args: list[Any],
        static: frozenset[int],
        device: int,
        lend_from: int | None = None,
    ) -> None:
        # Parameters and buffers: the static inputs, and in a backward (which torch
        # marks none of) the inputs in the memory of some recording's static inputs,
        # the parameters its forward saved for it. Reading them in place is right
        # whenever the address matches at a replay, which is checked; copying them
        # cost the largest copies of a step (a 32000-word embedding's weight).
        static = static | {
            i
            for i, value in enumerate(args)
            if isinstance(value, torch.Tensor) and _in_static_memory(value)
        }
        self.static_indices = sorted(i for i in static if isinstance(args[i], torch.Tensor))
        _static_memory.register(
            self, [args[i].untyped_storage().data_ptr() for i in self.static_indices]
        )
        self.static_pointers: list[int | None] = [None] * len(args)
        for i in self.static_indices:
            self.static_pointers[i] = args[i].data_ptr()
        # inputs lent by another recording (a forward's saved tensors, here in its
        # backward): read in place while they come from the same memory
        self.lent_indices = [
            i
            for i, value in enumerate(args)
            if i not in static and isinstance(value, torch.Tensor) and _is_lent(value)
        ]
        self.lent_pointers: list[int | None] = [None] * len(args)
        for i in self.lent_indices:
            self.lent_pointers[i] = args[i].data_ptr()
        in_place = static | frozenset(self.lent_indices)
        # copied inputs: (position, the recording's buffer, the part of it copied into)
        self.copied: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        inputs = list(args)
        for i, value in enumerate(args):
            if isinstance(value, torch.Tensor) and i not in in_place:
                buffer = torch.empty_strided(
                    value.size(), value.stride(), dtype=value.dtype, device=value.device
                )
                target = _unexpanded(buffer)
                target.copy_(_unexpanded(value))
                self.copied.append((i, buffer, target))
                inputs[i] = buffer
        self.graph = torch.cuda.CUDAGraph()
        with (
            torch.cuda.device(device),
            torch.cuda.graph(
                self.graph, pool=memory_pool(device), capture_error_mode="thread_local"
            ),
        ):
            results = call(list(inputs))
        self.container = type(results) if isinstance(results, list | tuple) else None
        self.results = list(results) if self.container is not None else [results]
        self.lend_from = len(self.results) if lend_from is None else lend_from
        aliased = self._plan(inputs)
        self._fixed_strides(aliased)
        self.copy_targets = [target for _, _, target in self.copied]
        self.device = torch.device("cuda", device)
        count = torch._C._storage_Use_Count
        # each lent storage's handle and the recording's own use count of it: see
        # `lent_free`
        self.lent_handles = [st._cdata for st in self.lent_storages.values()]
        self.lent_owns = [count(handle) for handle in self.lent_handles]

    def _plan(self, inputs: list[Any]) -> set[int]:
        """Classify each result: a plain value, a view of an input, or pool memory
        to copy out (whole tensors where they fill their storage, else the storage's
        bytes, shared by every result in it). Returns the copied inputs that results
        are views of."""
        owners = {
            t.untyped_storage().data_ptr(): i
            for i, t in enumerate(inputs)
            if isinstance(t, torch.Tensor)
        }
        self.plan: list[_Output] = []
        copied = {i for i, _, _ in self.copied}
        aliased: set[int] = set()
        self.sources: list[torch.Tensor] = []  # what a replay copies out, in order
        sharing: dict[int, int] = {}  # storage -> how many results live in it
        for result in self.results:
            if isinstance(result, torch.Tensor):
                pointer = result.untyped_storage().data_ptr()
                sharing[pointer] = sharing.get(pointer, 0) + 1
        byte_buffers: dict[int, int] = {}  # storage -> its entry in `sources`
        # lent storage address -> the recording's own storage there (the one that owns
        # the memory): every replay's lent results are built on it, so a result the
        # caller still holds keeps its memory allocated even after this recording is
        # gone, and its use count back at the recording's own says that nothing lent
        # last time is still held
        self.lent_storages: dict[int, torch.UntypedStorage] = {}
        for number, result in enumerate(self.results):
            if not isinstance(result, torch.Tensor):
                self.plan.append(_Output("value", result))
                continue
            storage = result.untyped_storage()
            pointer = storage.data_ptr()
            size, stride = tuple(result.size()), tuple(result.stride())
            offset = int(result.storage_offset())
            owner = owners.get(pointer)
            if owner is not None:
                aliased.add(owner)
                source = inputs[owner]
                if result is source:
                    # the input itself (a parameter saved for the backward): handed
                    # back as it is, as a plain call does
                    self.plan.append(_Output("input", None, owner))
                    continue
                relative = offset - int(source.storage_offset())
                self.plan.append(_Output("alias", None, owner, size, stride, relative))
            elif number >= self.lend_from:
                # lent: handed out in place (a new storage object over the recording's
                # memory each replay, whose death `lent_free` checks before the next)
                meta = _metadata(result.dtype, size, stride, offset)
                self.plan.append(_Output("lent", meta, pointer, size, stride, offset))
                self.lent_storages.setdefault(pointer, storage)
            elif sharing[pointer] == 1 and _fills_storage(result):
                self.plan.append(_Output("copy", None, len(self.sources), size, stride, offset))
                self.sources.append(result)
            else:
                if pointer not in byte_buffers:
                    byte_buffers[pointer] = len(self.sources)
                    whole = torch.empty(0, dtype=torch.uint8, device=result.device)
                    self.sources.append(whole.set_(storage))
                index = byte_buffers[pointer]
                meta = _metadata(result.dtype, size, stride, offset)
                self.plan.append(_Output("bytes", meta, index, size, stride, offset))
        _lent_memory.register(self, list(self.lent_storages))
        return aliased & copied

    def _fixed_strides(self, aliased: set[int]) -> None:
        self.strides_fixed = [
            (i, tuple(buffer.stride()))
            for i, buffer, _ in self.copied
            if i in aliased or 0 in buffer.stride()
        ]

    def fits(self, args: list[Any]) -> bool:
        """Whether the copied inputs whose strides matter have the recorded ones: a
        broadcast input (stride 0: only one slice is copied) and an input a result
        is a view of (the view is rebuilt on the caller's tensor)."""
        return all(args[i].stride() == stride for i, stride in self.strides_fixed)

    def statics_moved(self, args: list[Any]) -> bool:
        return not pointers_equal(args, self.static_pointers, self.static_indices)

    def inputs_in_place(self, args: list[Any]) -> bool:
        """Whether the inputs read in place from another recording's memory are there."""
        return not self.lent_indices or pointers_equal(args, self.lent_pointers, self.lent_indices)

    def lent_free(self) -> bool:
        """Whether every tensor the last replay lent has died (a replay rewrites that
        memory)."""
        # one C-level pass over the handles and one list comparison: a backward lends
        # hundreds of results, and a Python loop over them cost more than the replay
        return list(map(torch._C._storage_Use_Count, self.lent_handles)) == self.lent_owns

    def replay(self, args: list[Any]) -> Any:
        copied = self.copied
        if len(copied) == 1:  # one op is cheaper than a list op of one
            copied[0][2].copy_(_unexpanded(args[copied[0][0]]))
        elif copied:
            torch._foreach_copy_(self.copy_targets, [_unexpanded(args[i]) for i, _, _ in copied])
        self.graph.replay()
        sources = self.sources
        if len(sources) == 1:
            fresh = [sources[0].clone(memory_format=torch.preserve_format)]
        else:
            fresh = [torch.empty_like(s, memory_format=torch.preserve_format) for s in sources]
            if fresh:
                torch._foreach_copy_(fresh, sources)
        out = []
        storages = self.lent_storages
        make = _TENSOR_ON
        for entry in self.plan:
            kind = entry.kind
            if kind == "copy":
                out.append(fresh[entry.index])
            elif kind == "lent":
                out.append(make(entry.value, storages[entry.index]))  # type: ignore[arg-type]
            elif kind == "input":
                out.append(args[entry.index])
            elif kind == "value":
                out.append(entry.value)
            elif kind == "alias":
                base = args[entry.index]
                out.append(
                    base.as_strided(entry.size, entry.stride, base.storage_offset() + entry.offset)
                )
            else:
                out.append(make(entry.value, fresh[entry.index].untyped_storage()))  # type: ignore[arg-type]
        args.clear()
        if self.container is None:
            return out[0]
        return self.container(out)


class _Addresses:
    """Storage addresses that live recordings registered, each counted once per
    recording: an address leaves when the last recording that registered it is
    collected, so the set holds what the process's recordings use now, not every
    address any recording ever had (a process that recompiles, or drops its graphs
    with `torch._dynamo.reset()`, would otherwise grow it without end, and a stale
    address would make a later recording read some unrelated input in place)."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def register(self, owner: object, pointers: Sequence[int]) -> None:
        if not pointers:
            return
        for pointer in pointers:
            self._counts[pointer] = self._counts.get(pointer, 0) + 1
        weakref.finalize(owner, self._release, tuple(pointers))

    def _release(self, pointers: tuple[int, ...]) -> None:
        for pointer in pointers:
            left = self._counts.get(pointer, 0) - 1
            if left > 0:
                self._counts[pointer] = left
            else:
                self._counts.pop(pointer, None)

    def __contains__(self, pointer: int) -> bool:
        return pointer in self._counts

    def __len__(self) -> int:
        return len(self._counts)


# Storage addresses of the live recordings' lent results: a later recording reads an
# input in this memory in place (a backward reading its forward's saved tensors).
_lent_memory = _Addresses()
# Storage addresses of the live recordings' parameters and buffers (`_Recording`).
_static_memory = _Addresses()


def _in_static_memory(t: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() in _static_memory


def _is_lent(t: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() in _lent_memory


def _fills_storage(t: torch.Tensor) -> bool:
    """Whether `t` is its storage's only content: dense, no gaps, offset 0."""
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return False
    expected = 1  # the dimensions, innermost first, must tile the storage exactly
    for stride, size in sorted((st, n) for n, st in zip(t.size(), t.stride(), strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _unexpanded(t: torch.Tensor) -> torch.Tensor:
    """`t` without the repeats of its broadcast dimensions (stride 0): a copy into
    such a tensor would write one element many times, which torch refuses."""
    if 0 not in t.stride():
        return t
    for dim, (n, s) in enumerate(zip(t.size(), t.stride(), strict=True)):
        if s == 0 and n > 1:
            t = t.narrow(dim, 0, 1)
    return t


class GraphedCall:
    """A compiled graph's boxed call, replayed from CUDA graphs where it can be."""

    def __init__(
        self,
        call: Callable[[list[Any]], Any],
        *,
        name: str,
        static_inputs: Sequence[int],
        device: int,
        loud: bool,
        adaptive: bool = False,
        on_record: Callable[[str], None] | None = None,
        lend_from: int | None = None,
        copy_when_held: bool = False,
    ) -> None:
        self._call = call
        self._lend_from = lend_from
        self._name = name
        self._static = frozenset(static_inputs)
        self._device = device
        self._loud = loud
        self._recordings: dict[tuple[Any, ...], _Recording] = {}
        # the recordings that copy out what the ones above lend, for replays while
        # something lent is still held (`copy_when_held`)
        self._copying: dict[tuple[Any, ...], _Recording] = {}
        self._copy_when_held = copy_when_held
        self._seen: dict[tuple[Any, ...], str] = {}  # "warm", "ready" or "plain"
        self._adaptive = adaptive
        self._said_gpu_bound = False
        self._recorded = 0
        self._stopped: str | None = None
        self._on_record = on_record
        self._keyed: list[int] | None = None
        self.replays = 0

    def _key(self, args: list[Any]) -> tuple[Any, ...]:
        """What a recording is for: the sizes of the copied inputs and the values of
        the others (parameters are checked apart). Strides are left out: a copy into
        the recording's buffer takes any; the inputs whose strides do matter are
        checked by `_Recording.fits`. Dtypes are the compiled graph's own (Dynamo
        guards them). Sizes alone cost a third of sizes, strides and dtypes, and a
        backward has a hundred inputs."""
        keyed = self._keyed
        if keyed is None or len(keyed) > len(args):
            keyed = self._keyed = [i for i in range(len(args)) if i not in self._static]
        return tuple(
            [a.shape if isinstance(a, torch.Tensor) else a for a in [args[i] for i in keyed]]
        )

    def __call__(self, args: list[Any]) -> Any:
        if self._stopped is not None:
            return self._call(args)
        key = self._key(args)
        recording = self._recordings.get(key)
        if recording is not None and not recording.statics_moved(args):
            if not recording.fits(args) or not recording.inputs_in_place(args):
                return self._call(args)  # strides it cannot take, inputs moved
            if not recording.lent_free():
                copying = self._copying_recording(key, args) if self._copy_when_held else None
                if copying is None:
                    return self._call(args)  # what it lent last time is still held
                recording = copying
            self.replays += 1
            return recording.replay(args)
        state = self._seen.get(key)
        if state is None:
            # first call with these sizes: its launches compile and tune the kernels
            self._seen[key] = "warm" if self._adaptive else "ready"
            return self._call(args)
        if state == "plain":
            return self._call(args)
        if state == "warm":
            return self._measured(key, args)
        if self._recorded >= MAX_RECORDINGS:
            self._stop(f"{MAX_RECORDINGS} recordings made (sizes or parameter addresses vary)")
            return self._call(args)
        try:
            recording = _Recording(self._call, args, self._static, self._device, self._lend_from)
        except Exception as exc:  # a call that cannot be recorded runs as before
            log.debug("recording graph %s failed", self._name, exc_info=True)
            self._stop(f"recording failed: {type(exc).__name__}: {exc}")
            return self._call(args)
        self._recorded += 1
        self._recordings[key] = recording
        if self._on_record is not None:
            self._on_record(f"recorded {self._recorded}")
        self.replays += 1
        return recording.replay(args)

    def _copying_recording(self, key: tuple[Any, ...], args: list[Any]) -> _Recording | None:
        """The recording of these sizes that lends nothing, made at the first replay
        that finds a lent result still held; None past the recording limit."""
        copying = self._copying.get(key)
        if copying is not None and not copying.statics_moved(args):
            return copying
        if self._recorded >= MAX_RECORDINGS:
            return None
        try:
            copying = _Recording(self._call, args, self._static, self._device, None)
        except Exception:  # the lending recording keeps serving the other calls
            log.debug("recording graph %s without lending failed", self._name, exc_info=True)
            return None
        self._recorded += 1
        self._copying[key] = copying
        return copying

    def _measured(self, key: tuple[Any, ...], args: list[Any]) -> Any:
        """A plain call, timed on the host and on the device: where the host enqueues
        the launches in less than `GPU_BOUND` of the time the device takes to run
        them, the device never waits for the host, and a recording would save
        nothing but cost memory (its pool, and the copies of its outputs); those
        sizes keep running plainly (under 'auto'; 'on' records regardless)."""
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch stub
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch stub
        began = time.perf_counter()
        start.record()
        result = self._call(args)
        end.record()
        host_ms = (time.perf_counter() - began) * 1e3
        end.synchronize()
        device_ms = float(start.elapsed_time(end))
        if host_ms < GPU_BOUND * device_ms:
            self._seen[key] = "plain"
            if not self._said_gpu_bound:
                self._said_gpu_bound = True
                log.info(
                    "graph %s is not recorded for its sizes: the device is the bottleneck "
                    "(launches enqueued in %.2f ms, run in %.2f ms)",
                    self._name, host_ms, device_ms,
                )  # fmt: skip
                if self._on_record is not None and not self._recorded:
                    self._on_record(
                        f"plain: device-bound (host {host_ms:.2f} ms, device {device_ms:.2f} ms)"
                    )
        else:
            self._seen[key] = "ready"
        return result

    def _stop(self, reason: str) -> None:
        self._stopped = reason
        self._recordings.clear()
        self._copying.clear()
        level = logging.WARNING if self._loud else logging.INFO
        log.log(level, "CUDA graphs off for graph %s: %s", self._name, reason)
        if self._on_record is not None:
            self._on_record(f"off: {reason}")
