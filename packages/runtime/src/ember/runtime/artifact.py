"""One compiled graph as a self-contained artifact: what the runtime runs, what a
compile cache can store and an ahead-of-time package can carry.

In a process, `compile_graph` builds an `Artifact` and runs it through `runner`, the
same path a loaded one takes. Saved (`Artifact.save`), it is a directory:

    manifest.json          format; graph name; versions (Python, torch, Triton,
                           ember; the fingerprint of ember's source,
                           ember.runtime.fingerprint); what it needs of the
                           machine (each CUDA device's capability, the CPU's
                           architecture and instruction-set extensions where it
                           has C++ kernels); its inputs (dtype,
                           device, layout as expressions over the size symbols, the
                           symbols each binds, whether the graph writes it); which
                           inputs are parameters; its kernels and files; the SHA-256
                           of every other file
    wrapper.py             the wrapper module (ember.runtime.wrapper): plain source
                           that names every operator by its path
    kernels/NAME.json      per Triton kernel: its description (signature, grid, configs,
                           the config chosen per set of sizes) and, beside it, one
                           .cubin per compiled variant
    kernels/cpp-N.so/json  per C++ translation unit: the library and its kernels'
                           argument lists
    constants.safetensors  the storages of the graph's constant tensors, each
                           rebuilt with its dtype, sizes, strides and offset

`load_artifact` checks the manifest against this process (a mismatch is an
`ArtifactError` naming both sides) and every file against its hash before anything
is executed or loaded, then loads the binaries as they are: no C++ compiler and no
Triton compile (a Triton kernel would only compile a variant the artifact lacks: a
call with a size past 2**31 - 1, or a buffer not 16-byte aligned). No file is a
pickle.

An artifact holding an object with no saved form (`WrapperSource.live`, e.g. an
opaque script object) runs in its process but cannot be saved: `save` says which.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import platform
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ember.runtime.fingerprint import source_fingerprint
from ember.runtime.layouts import (
    InputRecord,
    guard_layouts,
    guard_symbolic_layouts,
    static_layouts,
)
from ember.runtime.loader import execute_source
from ember.runtime.store import private_directory
from ember.runtime.wrapper import WrapperSource

FORMAT = 1
MANIFEST = "manifest.json"
WRAPPER = "wrapper.py"
CONSTANTS = "constants.safetensors"


class ArtifactError(RuntimeError):
    """An artifact cannot be saved, or cannot be loaded here; the message says why
    and names the file or the mismatch (what the artifact needs, what is here)."""


@dataclass
class Artifact:
    """A compiled graph: its wrapper, the launchers its kernels run through, its
    inputs as the guards check them, and the inputs that are parameters."""

    graph: str
    wrapper: WrapperSource
    launchers: dict[str, Any]
    inputs: list[InputRecord]
    static_inputs: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # more manifest entries
    source_path: Path | None = None  # where the wrapper module's file is, once loaded

    def bind(self, module: ModuleType) -> ModuleType:
        """Bind the wrapper module's kernels, constants and live objects."""
        names = {name: self.launchers[name] for name in self.wrapper.kernels}
        module.__dict__.update(names)
        module.__dict__.update(self.wrapper.constants)
        module.__dict__.update(self.wrapper.live)
        return module

    def files(self) -> dict[str, bytes]:
        """Every file of the saved artifact by its path in it, the manifest included."""
        if self.wrapper.live:
            raise ArtifactError(
                f"graph {self.graph} holds objects with no saved form "
                f"({', '.join(f'{k}: {type(v).__name__}' for k, v in self.wrapper.live.items())});"
                " it runs in this process but cannot be saved"
            )
        files: dict[str, bytes] = {WRAPPER: self.wrapper.source.encode()}
        kernels: dict[str, Any] = {}
        units: dict[int, str] = {}
        for name in self.wrapper.kernels:
            kernels[name] = _export_kernel(name, self.launchers[name], files, units)
        constants = _export_constants(self.wrapper.constants, files)
        manifest = {
            "format": FORMAT,
            "graph": self.graph,
            "versions": versions(),
            "requires": requirements(self.inputs, files),
            "inputs": [r.to_json() for r in self.inputs],
            "static_inputs": list(self.static_inputs),
            "kernels": kernels,
            "constants": constants,
            **self.extra,
            "files": {path: _digest(data) for path, data in sorted(files.items())},
        }
        files[MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        return files

    def save(self, directory: Path | str) -> Path:
        """Write the artifact under `directory` (created; files in it are replaced)."""
        files = self.files()
        root = Path(directory)
        (root / "kernels").mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            if path != MANIFEST:
                (root / path).write_bytes(data)
        (root / MANIFEST).write_bytes(files[MANIFEST])  # last: a complete artifact
        return root


def runner(artifact: Artifact, module: ModuleType) -> Callable[[list[Any]], Any]:
    """The boxed call of a loaded wrapper `module`, behind the layout guards its
    inputs need (ember.runtime.layouts)."""
    artifact.bind(module)
    call: Callable[[list[Any]], Any] = module.call
    return guard_layouts(
        guard_symbolic_layouts(call, artifact.inputs, artifact.graph),
        static_layouts(artifact.inputs),
        artifact.graph,
        artifact.static_inputs,
    )


def load_artifact(directory: Path | str) -> tuple[Artifact, Callable[[list[Any]], Any]]:
    """The artifact saved under `directory` and its boxed call (takes the list of
    inputs, which it empties). Raises `ArtifactError` where it does not fit here or a
    file is missing or altered."""
    root = Path(directory)
    manifest = read_manifest(root)
    check_requirements(manifest, root / MANIFEST)
    artifact, call = load_files(manifest, verified_files(root, manifest), str(root))
    return artifact, graphed(artifact, call, manifest)


def graphed(
    artifact: Artifact, call: Callable[[list[Any]], Any], manifest: dict[str, Any]
) -> Callable[[list[Any]], Any]:
    """`call` replayed from CUDA graphs (ember.runtime.cudagraphs) where the graph was
    found recordable when it was compiled (the manifest's `cudagraphs` entry) and
    `EMBER_CUDAGRAPHS` is not off, as a freshly compiled graph would be."""
    from ember.runtime.config import config

    entry = manifest.get("cudagraphs") or {}
    setting = config.cudagraphs
    if setting == "off" or entry.get("device") is None or entry.get("blocker") is not None:
        return call
    from ember.runtime.cudagraphs import GraphedCall

    return GraphedCall(
        call,
        name=artifact.graph,
        static_inputs=artifact.static_inputs,
        device=int(entry["device"]),
        loud=setting == "on",
        adaptive=setting == "auto",
    )


def load_files(
    manifest: dict[str, Any], files: dict[str, bytes], where: str
) -> tuple[Artifact, Callable[[list[Any]], Any]]:
    """An artifact from its manifest (checked against this process by the caller) and
    its files, each already checked against the manifest's hash; `where` names it in
    errors."""
    constants = _restore_constants(manifest["constants"], files.get(CONSTANTS), where)
    # 0700, in this process's own directory (removed at exit): nobody swaps files in
    private = Path(tempfile.mkdtemp(prefix="artifact-", dir=private_directory()))
    launchers: dict[str, Any] = {}
    units: dict[str, Any] = {}
    for name, spec in manifest["kernels"].items():
        launchers[name] = _restore_kernel(spec, files, private, units)
    source = files[WRAPPER].decode()
    wrapper = WrapperSource(source, tuple(manifest["kernels"]), constants, {})
    artifact = Artifact(
        graph=str(manifest["graph"]),
        wrapper=wrapper,
        launchers=launchers,
        inputs=[InputRecord.from_json(r) for r in manifest["inputs"]],
        static_inputs=tuple(int(i) for i in manifest["static_inputs"]),
    )
    # the checked bytes are what runs; the file is a copy for debuggers and tracebacks
    # (written without the cache's fsyncs: 1-20 ms of a warm cache hit on the CPU)
    path = private / WRAPPER
    path.write_bytes(files[WRAPPER])
    artifact.source_path = path
    return artifact, runner(artifact, execute_source(path, files[WRAPPER], {}))


def verify_files(manifest: dict[str, Any], files: dict[str, bytes], where: str) -> None:
    """Raise `ArtifactError` unless `files` are exactly the manifest's, hashes equal."""
    if set(files) != set(manifest["files"]):
        raise ArtifactError(f"{where}: its files differ from its manifest's list")
    for path, digest in manifest["files"].items():
        if _digest(files[path]) != digest:
            raise ArtifactError(f"{where}/{path}: its contents do not match the manifest's hash")


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{root} is not an ember artifact: {MANIFEST} is missing") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} cannot be read: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise ArtifactError(
            f"{path}: artifact format {manifest.get('format')!r}; this ember reads {FORMAT}"
        )
    return manifest


# -- what an artifact needs of the process and the machine --------------------------


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name, distribution in (("ember", "ember-runtime"), ("triton", "triton")):
        try:
            found[name] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return tuple(found.items())


def versions() -> dict[str, str]:
    """Python, torch, ember and Triton versions (package metadata, read once), and the
    fingerprint of ember's source (`ember-source`: a development install changes its
    code under one version number)."""
    return {**dict(_versions()), "ember-source": source_fingerprint()}


# Versions a loaded artifact must share with the process: torch (the wrapper calls its
# operators and relies on their layouts) and ember, by version and by source (the
# wrapper and kernel formats, and the code that generated them). Triton's is
# informative: its binaries launch without it.
CHECKED_VERSIONS = ("torch", "ember", "ember-source")


def requirements(inputs: Sequence[InputRecord], files: dict[str, bytes]) -> dict[str, Any]:
    """What the artifact needs of a machine: the capability of each CUDA device its
    inputs are on and, with C++ kernels, the CPU's architecture and features."""
    needs: dict[str, Any] = {}
    for device in sorted({r.device for r in inputs if r.device.startswith("cuda")}):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        needs.setdefault("cuda", {})[device] = f"sm_{major}{minor}"
    if any(path.endswith(".so") for path in files):
        needs["cpu"] = {"machine": platform.machine(), "features": sorted(cpu_features())}
    return needs


def cpu_features() -> set[str]:
    """The instruction-set extensions of this CPU that compiled kernels may use
    (/proc/cpuinfo's flags; an empty set where it cannot be read)."""
    from ember.runtime.cpp_kernels import cpu_flags

    prefixes = ("sse", "ssse", "avx", "fma", "f16c", "bmi", "amx", "popcnt", "asimd", "sve")
    return {f for f in cpu_flags() if f.startswith(prefixes)}


def check_requirements(manifest: dict[str, Any], where: Path | str) -> None:
    """Raise `ArtifactError` naming both sides where the artifact does not fit here
    (`where` names the manifest in the message)."""
    here = versions()
    for name in CHECKED_VERSIONS:
        wanted = manifest["versions"].get(name)
        if wanted != here[name]:
            if name == "ember-source":
                raise ArtifactError(
                    f"{where}: compiled by other ember source (fingerprint {wanted}); this "
                    f"process's is {here[name]} (ember.runtime.fingerprint)"
                )
            raise ArtifactError(
                f"{where}: compiled with {name} {wanted}; this process has {name} {here[name]}"
            )
    needs = manifest["requires"]
    for device, capability in needs.get("cuda", {}).items():
        if not torch.cuda.is_available():
            raise ArtifactError(f"{where}: needs CUDA device {device} ({capability}); none here")
        index = torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            raise ArtifactError(
                f"{where}: needs CUDA device {device}; this machine has {torch.cuda.device_count()}"
            )
        major, minor = torch.cuda.get_device_capability(index)
        if f"sm_{major}{minor}" != capability:
            raise ArtifactError(
                f"{where}: compiled for {capability} on {device}; this device is sm_{major}{minor}"
            )
    cpu = needs.get("cpu")
    if cpu is not None:
        if cpu["machine"] != platform.machine():
            raise ArtifactError(
                f"{where}: C++ kernels built for {cpu['machine']}; this CPU is {platform.machine()}"
            )
        missing = set(cpu["features"]) - cpu_features()
        if missing:
            raise ArtifactError(
                f"{where}: C++ kernels use CPU features {sorted(missing)} that this CPU lacks"
            )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verified_files(root: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
    """Every file the manifest lists, read once and checked against its hash."""
    files: dict[str, bytes] = {}
    for path in manifest["files"]:
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ArtifactError(f"{root / MANIFEST}: file {path!r} lies outside the artifact")
        try:
            files[path] = (root / path).read_bytes()
        except OSError as exc:
            raise ArtifactError(
                f"{root / path}: listed in the manifest, cannot be read: {exc}"
            ) from exc
    verify_files(manifest, files, str(root))
    return files


# -- kernels ------------------------------------------------------------------------


def _export_kernel(name: str, launcher: Any, files: dict[str, bytes], units: dict[int, str]) -> Any:
    from ember.runtime.triton_kernels import TritonLauncher

    if isinstance(launcher, TritonLauncher):
        spec, binaries = launcher.export()
        spec["files"] = {}
        for file_name, data in binaries.items():
            path = f"kernels/{file_name}"
            files[path] = data
            spec["files"][file_name] = path
        files[f"kernels/{name}.json"] = json.dumps(spec, indent=1).encode()
        return {"type": "triton", "spec": f"kernels/{name}.json"}
    from ember.runtime.cpp_kernels import CppKernel

    if isinstance(launcher, CppKernel):
        unit = launcher.unit
        prefix = units.get(id(unit))
        if prefix is None:
            prefix = units[id(unit)] = f"kernels/cpp-{len(units)}"
            files[f"{prefix}.so"] = Path(unit.path).read_bytes()
            infos = [dataclasses.asdict(info) for info in unit.source.kernels]
            for info in infos:
                for argument in info["arguments"]:
                    argument["dtype"] = str(argument["dtype"]).removeprefix("torch.")
            description = {
                "kernels": infos,
                "flags": list(unit.flags),
                "source": unit.source.source,
            }
            files[f"{prefix}.json"] = json.dumps(description, indent=1).encode()
        return {"type": "cpp", "unit": prefix, "kernel": launcher.info.name}
    raise ArtifactError(
        f"kernel {name} runs through {type(launcher).__name__}, which has no saved form "
        "(EMBER_KERNELS=reference?)"
    )


def _restore_kernel(
    entry: dict[str, Any], files: dict[str, bytes], private: Path, units: dict[str, Any]
) -> Any:
    if entry["type"] == "triton":
        from ember.runtime.triton_kernels import TritonLauncher

        spec = json.loads(files[entry["spec"]])
        binaries = {name: files[path] for name, path in spec["files"].items()}
        return TritonLauncher.restore(spec, binaries)
    if entry["type"] == "cpp":
        return _restore_cpp(entry, files, private, units)
    raise ArtifactError(f"unknown kernel type {entry['type']!r}")


def _restore_cpp(
    entry: dict[str, Any], files: dict[str, bytes], private: Path, units: dict[str, Any]
) -> Any:

    from ember.codegen.cpp import CppSource, KernelArgument, KernelCheck, KernelInfo
    from ember.runtime.cpp_kernels import CompiledUnit, CppKernel, load_library

    prefix = entry["unit"]
    unit = units.get(prefix)
    if unit is None:
        library = private / f"{Path(prefix).name}.so"
        library.write_bytes(files[f"{prefix}.so"])  # a private copy of the checked bytes
        description = json.loads(files[f"{prefix}.json"])
        infos = tuple(
            KernelInfo(
                name=info["name"],
                arguments=tuple(
                    KernelArgument(**{**a, "dtype": getattr(torch, a["dtype"])})
                    for a in info["arguments"]
                ),
                checks=tuple(KernelCheck(**c) for c in info["checks"]),
            )
            for info in description["kernels"]
        )
        loaded = load_library(library)
        source = CppSource(description["source"], infos)
        unit = units[prefix] = CompiledUnit(
            library, loaded, source, 0.0, tuple(description["flags"])
        )
    info = next(i for i in unit.source.kernels if i.name == entry["kernel"])
    return CppKernel(unit, info)


# -- constants ----------------------------------------------------------------------


def _export_constants(
    constants: dict[str, torch.Tensor], files: dict[str, bytes]
) -> dict[str, Any]:
    """Each distinct storage as one flat byte tensor, and per constant where in it
    it lies (dtype, sizes, strides, offset, device)."""
    if not constants:
        return {}
    from safetensors.torch import save

    storages: dict[int, str] = {}
    flat: dict[str, torch.Tensor] = {}
    described = {}
    for name, tensor in constants.items():
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in storages:
            storages[key] = f"storage{len(storages)}"
            data = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            flat[storages[key]] = data.detach().cpu().clone()
        described[name] = {
            "storage": storages[key],
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "size": list(tensor.shape),
            "stride": list(tensor.stride()),
            "offset": tensor.storage_offset(),
            "device": str(tensor.device),
            "requires_grad": tensor.requires_grad,
        }
    files[CONSTANTS] = save(flat)
    return described


def _restore_constants(
    described: dict[str, Any], data: bytes | None, where: str
) -> dict[str, torch.Tensor]:
    if not described:
        return {}
    if data is None:
        raise ArtifactError(f"{where}: the manifest lists constants but {CONSTANTS} is missing")
    from safetensors.torch import load

    flat = load(data)
    storages: dict[tuple[str, str], torch.Tensor] = {}
    constants = {}
    for name, d in described.items():
        key = (d["storage"], d["device"])
        if key not in storages:
            storages[key] = flat[d["storage"]].to(d["device"])
        dtype = getattr(torch, d["dtype"])
        storage = storages[key].untyped_storage()
        tensor = torch.empty(0, dtype=dtype, device=d["device"])
        tensor.set_(storage, d["offset"], d["size"], d["stride"])
        constants[name] = (
            tensor.requires_grad_(d["requires_grad"]) if dtype.is_floating_point else tensor
        )
    return constants


__all__ = [
    "Artifact",
    "ArtifactError",
    "load_artifact",
    "runner",
]
