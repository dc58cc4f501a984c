"""A persistent cache of compiled graphs: a second process skips lowering, scheduling,
code generation, the C++ and Triton compiles, and loads the graph's artifact
(ember.runtime.artifact) as it was saved.

The key (`graph_key`) is a SHA-256 over everything the artifact depends on:

- the graph as ember receives it (its Python code: ops, arguments, node order) and
  each placeholder's metadata (dtype, sizes and strides with their symbols and hints,
  storage offset, device, requires_grad; a SymInt's expression and hint); the values
  of constant tensors the graph holds;
- which inputs are parameters and buffers (static inputs);
- the settings that change what is compiled (`KEYED_SETTINGS`); for graphs with CPU
  tensors what the choice of oneDNN linears depends on (`cpu_gemm.rule_key`: the
  rule's version, the CPU's vendor and ISA, the thread count's threshold);
- torch, Triton, ember and Python versions, and the fingerprint of ember's source
  (ember.runtime.fingerprint: a development install edits code under one version);
  each CUDA device's capability; for graphs with CPU tensors the C++ compiler's
  version and the target `-march=native` resolves to on this CPU (the same
  resolution as the C++ kernel cache: a library built for AVX-512 is never handed to
  a CPU without it).

An entry is stored once the graph's first call has run, so it holds the binaries of
every candidate config and the configs chosen for the sizes seen. Entries live in an
`EntryStore` (ember.runtime.store): checked against their hashes before use, so an
altered or truncated entry is rebuilt, never loaded. A hit is checked again against
this process like any artifact (`check_requirements`). `EMBER_COMPILE_CACHE=off`
turns the whole-graph cache off (kernel-level caches stay).

On a hit the key is most of what ember adds to AOTAutograd's own work: the graph's
code is generated as text without being compiled (`_graph_code`), and the compiler
subprocesses behind the CPU target run in a thread while AOTAutograd traces
(`prepare_cpu_target`, started by the backend).

Graphs whose artifact cannot be saved (an opaque object in the graph, reference
kernels) are not cached; that is logged at debug level.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ember.runtime.artifact import (
    MANIFEST,
    Artifact,
    ArtifactError,
    check_requirements,
    load_files,
    verify_files,
    versions,
)
from ember.runtime.config import config
from ember.runtime.devices import cuda_properties
from ember.runtime.store import EntryStore

log = logging.getLogger("ember.runtime")

# Settings that change the compiled artifact (others, e.g. strictness or CUDA graphs,
# act around it).
KEYED_SETTINGS = (
    "fallback",
    "index_checks",
    "kernels",
    "layout",
    "recompute",
    "cpu_gemm",
    "depthwise",
    "matmul_templates",
)
_SEPARATOR = "~"  # stands for "/" in entry file names (the store keeps flat names)
stats = {"hits": 0, "misses": 0, "stored": 0}


def enabled() -> bool:
    return bool(config.get("compile_cache"))


def graph_key(
    gm: torch.fx.GraphModule, static_inputs: Sequence[int], devices: set[torch.device]
) -> str:
    """The cache key of compiling `gm` here with the current settings."""
    digest = _Digest()
    add = digest.add
    add("graph", _graph_code(gm))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            add("input", node.name, _describe(node.meta.get("val")))
        elif node.op == "get_attr":
            add("attr", node.target, _describe(_attribute(gm, str(node.target)), values=True))
    add("static", list(static_inputs))
    _add_settings(digest)
    for device in sorted(devices, key=str):
        if device.type == "cuda":  # capability, and the SM count that sizes split reductions
            add("cuda", device, cuda_properties(device))
            # float32 matmul templates bake TF32 in or out (ember.runtime.kernels)
            add("tf32", torch.backends.cuda.matmul.allow_tf32)
        elif device.type == "cpu":
            from ember.runtime.cpu_gemm import rule_key

            # which matmuls become oneDNN linears: the rule's version, the CPU family,
            # the thread count's threshold (ember.runtime.cpu_gemm)
            add("cpu_gemm", rule_key(config.cpu_gemm))
            if config.kernels == "auto":
                add("cpu", _cpu_target())
    return digest.key()


class _Digest:
    """A key's hash: each part as its text and a NUL, in order."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, *parts: object) -> None:
        for part in parts:
            self._sha.update(str(part).encode())
            self._sha.update(b"\0")

    def key(self) -> str:
        return self._sha.hexdigest()[:40]


def _add_settings(digest: _Digest) -> None:
    """The settings that change a compiled artifact, and the versions: in every key."""
    digest.add("settings", [(name, config.get(name)) for name in KEYED_SETTINGS])
    digest.add("versions", sorted(versions().items()))


def warm_hint(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """The key under which a process notes that it compiled Dynamo's graph `gm` for
    inputs like `example_inputs` under the current settings (`remember`), or None
    with the cache off or where no key can be made (an input ember cannot describe
    without its values: nested or sparse inputs). Take it before anything rewrites
    `gm` in place (the backend's attention rewrite does).

    A hint only: a graph seen before is likely all in the cache, so the backend does
    not start the Triton compile workers ahead of its trace (they start at the first
    compile instead). Starting 15 of them and hashing Triton beside a call that only
    loads from the cache took about 0.6 s of its wall time (MLP, H100: 1.1-1.3 s
    first call against 0.5-0.6 s without); a wrong hint costs the compile that
    follows a worker start, never a result."""
    if not enabled():
        return None
    if any(
        isinstance(x, list | tuple | dict)
        or (isinstance(x, torch.Tensor) and x.layout != torch.strided)
        for x in example_inputs
    ):
        return None
    try:
        return _hint_key(gm, example_inputs)
    except Exception as exc:  # a hint is an optimisation: never fail the compile for it
        log.debug("no compile hint for %s: %s", type(gm).__name__, exc)
        return None


def seen(hint: str | None) -> bool:
    """Whether a process with this cache noted `hint` (`warm_hint`) before."""
    if hint is None or not enabled():
        return False
    try:
        return _hints().get(hint) is not None
    except OSError:
        return False


def remember(hint: str | None) -> None:
    """Note `hint` (`warm_hint`): this process compiled its graph."""
    if hint is None or not enabled():
        return
    try:
        hints = _hints()
        if hints.get(hint) is None:
            hints.put(hint, {"seen": b""})
    except OSError as exc:
        log.debug("compile hint %s not written: %s", hint, exc)


def _hints() -> EntryStore:
    from ember.runtime.cache import entry_store

    return entry_store(config.cache_dir / "hints")


def _hint_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    digest = _Digest()
    digest.add("graph", _graph_code(gm))
    digest.add("inputs", [_describe(x) for x in example_inputs])
    _add_settings(digest)
    return digest.key()


def _graph_code(gm: torch.fx.GraphModule) -> str:
    """The Python code of `gm`'s graph, as `gm.code` gives it, without compiling it.

    The graphs AOTAutograd hands over are lazy (`_LazyGraphModule`): their code is
    generated and compiled at first use, and `gm.code` is such a use. On a cache hit
    nothing runs `gm`, so that compile was wasted: about half of the text's cost, 8
    and 7 ms of CPU time for resnet18's training forward and backward on the 2-core
    CPU. The graph's public `python_code` generates the same text alone."""
    if getattr(gm, "_needs_recompile", lambda: False)():
        return gm.graph.python_code(root_module="self").src
    return gm.code


def prepare_cpu_target() -> None:
    """Start finding what the key's `_cpu_target` reads (the C++ compiler's version
    banner and what `-march=native` resolves to: two compiler subprocesses, 3.5 ms
    of wall time on an idle 2-core CPU and tens of milliseconds on a loaded one) in a
    thread, so that they run while AOTAutograd traces the graph whose key needs
    them. Once per process; the key waits for the thread's answer, never computes
    it twice."""
    if _TARGET or _TARGET_STARTED:
        return
    _TARGET_STARTED.append(True)
    threading.Thread(target=_cpu_target, name="ember-cpu-target", daemon=True).start()


_TARGET: list[str] = []  # _cpu_target's answer, once found
_TARGET_STARTED: list[bool] = []
_TARGET_LOCK = threading.Lock()


def _cpu_target() -> str:
    """The C++ compiler's identity and native target, as the key holds them (found
    once per process, by the first caller; later callers wait for it)."""
    with _TARGET_LOCK:
        if not _TARGET:
            _TARGET.append(_find_cpu_target())
        return _TARGET[0]


def _find_cpu_target() -> str:
    try:
        from ember.runtime.cpp_kernels import compiler_identity, find_compiler, native_target
    except ImportError:
        return "no C++ kernels"
    try:
        compiler = find_compiler()
    except Exception as exc:  # no compiler: the graph compiles without C++ kernels
        return f"no compiler ({exc})"
    return f"{compiler_identity(compiler)}\0{native_target(compiler)}"


def _attribute(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _describe(value: Any, values: bool = False) -> str:
    """What of an input (or a constant, with its `values`) the compile depends on."""
    if isinstance(value, torch.Tensor):
        text = (
            f"tensor {value.dtype} {_symbols(value.shape)} {_symbols(value.stride())} "
            f"{_symbols([value.storage_offset()])} {value.device} {value.requires_grad}"
        )
        if values and not isinstance(value, torch._subclasses.FakeTensor):
            # a compile can run under an active fake mode (AOTAutograd's), in which
            # torch ops refuse a real tensor: the constant's bytes are read outside it
            with unset_fake_temporarily():
                data = value.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy()
            text += " " + hashlib.sha256(data.tobytes()).hexdigest()
        return text
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"{type(value).__name__} {_symbols([value])}"
    return f"{type(value).__name__} {value!r}"


def _symbols(values: Sequence[Any]) -> str:
    """Sizes as text: a symbol's expression with its hint (the value it was traced
    with, which picks tilings), a plain int as itself."""
    parts = []
    for v in values:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            parts.append(f"{v.node.expr}={getattr(v.node, 'hint', None)}")
        else:
            parts.append(str(v))
    return "(" + ",".join(parts) + ")"


def _store() -> EntryStore:
    """The store of compiled graphs, under the cache's size cap (ember.runtime.cache)."""
    from ember.runtime.cache import entry_store

    return entry_store(config.cache_dir / "graphs")


def lookup(key: str, graph: str) -> tuple[Artifact, Callable[[list[Any]], Any]] | None:
    """The cached artifact under `key` and its call, or None (a miss, or an entry
    that does not fit this process: logged, and compiled anew)."""
    start = time.perf_counter()
    entry = _store().get(key)
    if entry is None:
        stats["misses"] += 1
        return None
    files = {name.replace(_SEPARATOR, "/"): data for name, data in entry.files.items()}
    where = str(entry.directory)
    try:
        manifest = json.loads(files.pop(MANIFEST))
        verify_files(manifest, files, where)
        check_requirements(manifest, where)
        artifact, call = load_files(manifest, files, where)
    except (ArtifactError, KeyError, ValueError, OSError) as exc:
        log.warning("compile cache entry %s not used (%s); compiling %s anew", where, exc, graph)
        stats["misses"] += 1
        return None
    artifact.graph = graph
    artifact.extra = {k: manifest[k] for k in ("record", "cudagraphs", "cpu_gemm") if k in manifest}
    stats["hits"] += 1
    log.info("compiled %s from the cache in %.1f ms", graph, (time.perf_counter() - start) * 1e3)
    return artifact, call


def store_after_first_call(
    call: Callable[[list[Any]], Any], key: str, artifact: Artifact
) -> Callable[[list[Any]], Any]:
    """`call`, which stores `artifact` under `key` once its first call has returned
    (its kernels are compiled and their configs chosen by then), in the store of the
    compile's settings (taken now: the call may come after they changed)."""
    pending = [True]
    try:
        entries = _store()
    except OSError as exc:
        log.warning("graph %s will not be cached: %s", artifact.graph, exc)
        return call

    def run(args: list[Any]) -> Any:
        result = call(args)
        if pending:
            pending.clear()
            store(key, artifact, entries)
        return result

    return run


def store(key: str, artifact: Artifact, entries: EntryStore | None = None) -> None:
    """`artifact` under `key` in `entries` (the current settings' store by default)."""
    try:
        files = artifact.files()
    except ArtifactError as exc:
        log.debug("graph %s is not cached: %s", artifact.graph, exc)
        return
    try:
        (entries or _store()).put(
            key, {path.replace("/", _SEPARATOR): data for path, data in files.items()}
        )
    except OSError as exc:
        log.warning("graph %s could not be cached: %s", artifact.graph, exc)
        return
    stats["stored"] += 1
