"""Ahead-of-time packages of `torch.export` programs.

    ep = torch.export.export(model, args, dynamic_shapes=...)
    compile_and_package(ep, "model.ember")      # compiles; writes a directory
    model = load_package("model.ember")         # elsewhere: no compiler needed
    out = model(*args)                          # as ep.module()(*args)

A package is a directory:

    package.json          what the package takes and returns (the inputs, as the
                          program's pytree spec flattens them: dtype, device, sizes,
                          the range of each dynamic dimension and where it is read,
                          the conditions the program puts on sizes; the outputs and
                          their spec; the weights; the buffers a call writes back),
                          the versions it was built with (and the fingerprint of
                          ember's source, ember.runtime.fingerprint), the custom
                          operators it calls, the SHA-256 of the other two entries
                          and its own digest
    weights.safetensors   the program's parameters, buffers and constant tensors,
                          each under its name in the module (`ln.weight`)
    graph/                the compiled graph: an artifact (ember.runtime.artifact),
                          which lists and hashes its own files

Why a directory and not one zip file: the compiled graph already is a checked
directory (`Artifact.save`, `load_artifact`), and a package that holds it as it is
reuses that format and its checks unchanged; C++ kernels must be files to be
dlopen'ed, so a zip would be unpacked at every load anyway; and a directory can be
read and compared file by file (`ember package PATH`, `diff -r`). To ship one as a
single file, archive it: the hashes travel inside.

`compile_and_package`:

- refuses what a package cannot hold (opaque script objects, effect tokens, training
  outputs such as gradients), naming it;
- decomposes the program to the ATen ops ember lowers:
  `run_decompositions(ember_decompositions())`, the full table, since export
  decomposes above autograd (`aot_decompositions` is the table for AOTAutograd,
  which the `torch.compile` backend uses);
- runs the export passes (ember.graphpasses.export): leftover module-call
  tracepoints are erased (`collect_module_call_signatures`); the custom operators the
  graph calls are profiled (`collect_custom_op_profiles`, kept in the manifest so that
  a load in a process that has not registered one says which) and their tensor inputs
  guarded (`insert_custom_op_guards`: a call that reaches one with another dtype,
  device or layout fails there, clearly);
- runtime assertions: the conditions over input sizes alone (the guards export put
  on the program's dynamic dimensions, e.g. `x.shape[0] % 2 == 0` from a
  `torch._check`, and any `_assert_scalar` over those sizes) are checked by the
  package before each call, with the ranges, and their nodes removed from the graph
  (`remove_runtime_assertions(only=...)`); data-dependent assertions (over sizes or
  values read from tensors, `.item()`) stay in the graph and run there;
- lifts the weights: the graph takes them as leading inputs; compiled with their
  positions as `static_inputs`, stored in `weights.safetensors` and passed at every
  call from the loaded package;
- compiles the graph with `compile_graph` under `EMBER_STRICT` (a graph that would
  run eagerly has nothing to save: its compile error is raised) and saves it.

Calls: a loaded package flattens its arguments with the program's input spec (a
structure that differs is an error saying both), checks every input against the
manifest (type, dtype, device, rank, static sizes, dynamic sizes within their
range and equal where the program made them one symbol, derived sizes, the size
conditions) before calling the compiled graph, and raises `PackageInputError`
naming the input, the dimension and what the package accepts. One compiled graph
serves every size in range: nothing is compiled at load or at call.

What the loading process must provide: the same torch and ember versions, the same
ember source (its fingerprint: a package built by edited ember code is refused as
one built by another ember version is) and a machine the graph fits
(ember.runtime.artifact checks these), the custom operators
the program calls (registered before loading: the manifest lists them and the load
names any missing), and the pytree node types of its input and output structures
where they are not Python's own (a library's output class: `transformers`' model
outputs register when `transformers.modeling_outputs` is imported).

Mutated buffers (batch norm's running statistics in training mode) are written back
into the package's loaded buffers after each call, in place, as
`exported_program.module()` updates its own; `LoadedPackage.state_dict()` shows
them. Inputs the program mutates are written back into the caller's tensors, as
`module()` does. Outputs carry no autograd history: a package is for inference.

A package's files are checked against the SHA-256 its manifest lists, and the
manifest against its own digest, before anything is loaded or executed: that finds
corrupted and edited files, not a forgery, since whoever can write a package can
write its digests too. A package runs code (its wrapper, its C++ libraries): load
only packages from people you trust, as with any Python module. No file is a pickle:
the pytree specs are JSON (`treespec_dumps`), the weights safetensors.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ember.graphpasses import PassManager, ember_decompositions
from ember.graphpasses.export import (
    Constant,
    collect_custom_op_profiles,
    collect_module_call_signatures,
    insert_custom_op_guards,
    remove_runtime_assertions,
)
from ember.ir import conforms, laid_out
from ember.runtime.artifact import (
    MANIFEST,
    ArtifactError,
    check_requirements,
    load_artifact,
    read_manifest,
    verified_files,
    versions,
)
from ember.runtime.collection import full_collections_deferred
from ember.runtime.dtype_gaps import first_gap
from ember.runtime.pyexpr import pyexpr, symbol_name

FORMAT = 1
PACKAGE_MANIFEST = "package.json"
WEIGHTS = "weights.safetensors"
GRAPH = "graph"

aten = torch.ops.aten

_WEIGHT_KINDS = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
}
_MUTATIONS = {OutputKind.BUFFER_MUTATION: "buffer", OutputKind.USER_INPUT_MUTATION: "input"}
# what the size expressions of a manifest may call (ember.runtime.pyexpr prints these)
_EXPRESSION_GLOBALS: dict[str, Any] = {
    "__builtins__": {"min": min, "max": max, "int": int, "float": float, "abs": abs}
}
_SYMBOL = re.compile(r"sym_[A-Za-z0-9_]+")


class PackageError(ArtifactError):
    """A program cannot be packaged, or a package cannot be loaded here; the message
    names the file, the part of the program or the mismatch."""


class PackageInputError(ValueError):
    """A call's inputs do not fit the package: the message names the input, the
    dimension and what the package accepts."""


# -- packaging ------------------------------------------------------------------------


def compile_and_package(
    exported_program: ExportedProgram, package_path: str | os.PathLike[str]
) -> str:
    """Compile `exported_program` and write it as a package directory at
    `package_path` (replaced where it is a package already); return its path."""
    from ember.runtime.compiler import compile_graph
    from ember.runtime.config import config

    _refuse_unsupported(exported_program)
    gap = first_gap(exported_program.graph_module)
    if gap is not None:  # a package would return values where the program raises
        raise PackageError(f"the program cannot run eagerly: {gap.describe()}")
    _check_replaceable(Path(package_path))
    ep = exported_program.run_decompositions(ember_decompositions())
    _refuse_unsupported(ep)
    gm = ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    input_specs = ep.graph_signature.input_specs
    if len(placeholders) != len(input_specs):
        raise PackageError(
            f"the program's graph has {len(placeholders)} inputs, its signature {len(input_specs)}"
        )
    weight_positions = [i for i, s in enumerate(input_specs) if s.kind in _WEIGHT_KINDS]
    user_positions = [i for i, s in enumerate(input_specs) if s.kind == InputKind.USER_INPUT]
    if weight_positions + user_positions != list(range(len(input_specs))):
        raise PackageError("the program's graph does not take its weights before its inputs")
    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
    if in_spec is None or out_spec is None:
        raise PackageError("the program has no input or output spec (call_spec)")
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    labels = _input_labels(in_spec, signature.forward_arg_names if signature else None)
    users = [placeholders[i] for i in user_positions]
    if len(labels) != len(users):
        raise PackageError(
            f"the program's input spec has {len(labels)} leaves, its graph {len(users)} inputs"
        )

    inputs, sources = _describe_inputs(users, labels)
    shape_env = _shape_env(placeholders)
    conditions, covered = _size_conditions(gm, shape_env, sources)
    module_calls = collect_module_call_signatures(gm)
    profiles = collect_custom_op_profiles(gm)
    passes = [insert_custom_op_guards(sorted(profiles))] if profiles else []
    passes.append(remove_runtime_assertions(only=covered.__contains__))
    gm, _ = PassManager(passes, name="package").run(gm)

    weights, weight_entries = _lift_weights(ep, placeholders, weight_positions)
    mutations, user_outputs, outputs = _describe_outputs(ep, gm, users, weight_positions)
    example_inputs = [n.meta.get("val") for n in placeholders]
    with config.scope(strict=True), full_collections_deferred():
        compiled = compile_graph(gm, example_inputs, name="package", static_inputs=weight_positions)
    artifact = compiled.record.artifact
    if artifact is None:
        raise PackageError(f"graph {compiled.record.graph} compiled to nothing that can be saved")

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "kind": "ember-package",
        "versions": versions(),
        "graph": GRAPH,
        "compiled_graph": artifact.graph,
        "inputs": inputs,
        "dynamic_dims": _dynamic_dims(ep, sources),
        "data_dependent_sizes": _data_dependent_sizes(ep, sources),
        "conditions": conditions,
        "in_spec": json.loads(_dumps(in_spec, "input")),
        "outputs": outputs,
        "user_outputs": user_outputs,
        "out_spec": json.loads(_dumps(out_spec, "output")),
        "weights": weight_entries,
        "mutations": mutations,
        "custom_ops": {
            name: [_profile_json(p) for p in sorted(found, key=repr)]
            for name, found in sorted(profiles.items())
        },
        "module_calls": {
            path: {
                "inputs": [_call_value(v) for v in record.inputs],
                "outputs": [_call_value(v) for v in record.outputs],
            }
            for path, record in sorted(module_calls.calls.items())
        },
    }
    return str(_write_package(Path(package_path), manifest, weights, artifact.save))


def _refuse_unsupported(ep: ExportedProgram) -> None:
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.CUSTOM_OBJ, InputKind.TOKEN):
            what = (
                "an opaque script object"
                if spec.kind == InputKind.CUSTOM_OBJ
                else "an effect token"
            )
            raise PackageError(
                f"the program takes {what} ({spec.target or spec.arg}); a package holds "
                "tensors and plain values only"
            )
    for out in ep.graph_signature.output_specs:
        if out.kind not in (OutputKind.USER_OUTPUT, *_MUTATIONS):
            raise PackageError(
                f"the program returns a {out.kind.name} ({out.target or out.arg}); a package "
                "runs inference programs: export the model without its training outputs"
            )


def _input_labels(in_spec: pytree.TreeSpec, names: Sequence[str] | None) -> list[str]:
    """A readable name per leaf of the (args, kwargs) spec: `x`, `d['a']`, `args[3]`."""
    template = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    leaves, _ = pytree.tree_flatten_with_path(template)
    labels = []
    for path, _leaf in leaves:
        head, rest = path[0], path[1:]
        first = rest[0] if rest else None
        if isinstance(head, pytree.SequenceKey) and head.idx == 0 and first is not None:
            index = getattr(first, "idx", None)
            if isinstance(index, int):
                base = names[index] if names is not None and index < len(names) else None
                labels.append((base or f"args[{index}]") + pytree.keystr(rest[1:]))
                continue
        if first is not None and isinstance(first, pytree.MappingKey):
            labels.append(str(first.key) + pytree.keystr(rest[1:]))
            continue
        labels.append("inputs" + pytree.keystr(path))
    return labels


def _shape_env(placeholders: Sequence[torch.fx.Node]) -> Any:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    return None if mode is None else mode.shape_env


def _dumps(spec: pytree.TreeSpec, what: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception as exc:
        raise PackageError(
            f"the program's {what} structure cannot be saved as JSON ({exc}); register "
            "its pytree node types with a serialized name"
        ) from exc


def _describe_inputs(
    users: Sequence[torch.fx.Node], labels: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[sympy.Symbol, str]]:
    """Each user input as the manifest keeps it, and, per size symbol some input's
    dimension (or int input) is, where it is first read (`x.shape[0]`)."""
    inputs: list[dict[str, Any]] = []
    sources: dict[sympy.Symbol, str] = {}
    for node, label in zip(users, labels, strict=True):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            shape: list[int | str] = []
            for dim, size in enumerate(value.shape):
                expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)
                if isinstance(expr, sympy.Symbol):
                    sources.setdefault(expr, f"{label}.shape[{dim}]")
                shape.append(int(expr) if isinstance(expr, sympy.Integer) else pyexpr(expr))
            inputs.append(
                {
                    "name": label,
                    "placeholder": node.name,
                    "kind": "tensor",
                    "dtype": str(value.dtype).removeprefix("torch."),
                    "device": str(value.device),
                    "shape": shape,
                }
            )
        elif isinstance(value, torch.SymInt):
            expr = value.node.expr
            if isinstance(expr, sympy.Symbol):
                sources.setdefault(expr, label)
            inputs.append(
                {"name": label, "placeholder": node.name, "kind": "int", "value": pyexpr(expr)}
            )
        elif value is None or isinstance(value, bool | int | float | str):
            inputs.append(
                {"name": label, "placeholder": node.name, "kind": "constant", "value": value}
            )
        else:
            raise PackageError(
                f"input {label} is a {type(value).__name__}; a package takes tensors, ints, "
                "floats, bools, strings and None"
            )
    for entry in inputs:  # every dynamic size must be computable from the bound symbols
        exprs = entry["shape"] if entry["kind"] == "tensor" else [entry["value"]]
        for expr in exprs:
            if isinstance(expr, str):
                unbound = set(_SYMBOL.findall(expr)) - {symbol_name(s) for s in sources}
                if unbound:
                    raise PackageError(
                        f"input {entry['name']}: size {_readable(expr, {})} depends on "
                        f"{', '.join(sorted(unbound))}, which no input dimension is on its "
                        "own; a package reads every dynamic dimension off some input"
                    )
    return inputs, sources


def _size_conditions(
    gm: torch.fx.GraphModule, shape_env: Any, sources: dict[sympy.Symbol, str]
) -> tuple[list[dict[str, str]], set[torch.fx.Node]]:
    """The conditions the program puts on input sizes alone (export's guards, and
    the graph's `_assert_scalar` nodes over those sizes), as Python expressions over
    the size symbols, and the assertion nodes they cover."""
    bound = set(sources)
    names = {symbol_name(s): text for s, text in sources.items()}
    found: dict[str, dict[str, str]] = {}

    def add(expr: sympy.Basic) -> bool:
        if shape_env is not None:
            expr = shape_env.replace(expr)
        symbols = expr.free_symbols
        if expr in (sympy.true, True) or not symbols or not symbols <= bound:
            return False
        check = pyexpr(expr)
        found.setdefault(check, {"check": check, "text": _readable(check, names)})
        return True

    for guard in getattr(shape_env, "guards", ()):
        add(guard.expr)
    covered: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten._assert_scalar.default:
            continue
        condition = node.args[0]
        value = condition.meta.get("val") if isinstance(condition, torch.fx.Node) else None
        if isinstance(value, torch.SymBool) and add(value.node.expr):
            covered.add(node)
    return list(found.values()), covered


def _readable(check: str, names: dict[str, str]) -> str:
    """A size expression with its symbols named by where they are read."""
    text = _SYMBOL.sub(lambda m: names.get(m.group(0), m.group(0).removeprefix("sym_")), check)
    try:
        return ast.unparse(ast.parse(text, mode="eval"))
    except (SyntaxError, RecursionError):
        return text


def _range(value: Any) -> int | None:
    """A range bound as an int; None for an unbounded one (torch's int_oo)."""
    try:
        return int(value) if bool(value.is_finite) else None
    except (AttributeError, TypeError, ValueError):
        return None


def _dynamic_dims(ep: ExportedProgram, sources: dict[sympy.Symbol, str]) -> dict[str, Any]:
    dims = {}
    for symbol, source in sorted(sources.items(), key=lambda item: str(item[0])):
        ranges = ep.range_constraints.get(symbol)
        dims[symbol.name] = {
            "min": _range(ranges.lower) if ranges is not None else None,
            "max": _range(ranges.upper) if ranges is not None else None,
            "from": source,
        }
    return dims


def _data_dependent_sizes(ep: ExportedProgram, sources: dict[sympy.Symbol, str]) -> dict[str, Any]:
    return {
        str(symbol): {"min": _range(ranges.lower), "max": _range(ranges.upper)}
        for symbol, ranges in sorted(ep.range_constraints.items(), key=lambda item: str(item[0]))
        if symbol not in sources
    }


def _lift_weights(
    ep: ExportedProgram, placeholders: Sequence[torch.fx.Node], positions: Sequence[int]
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """The weights as the safetensors file stores them (CPU, contiguous, no storage
    shared between two names) and their manifest entries."""
    weights: dict[str, torch.Tensor] = {}
    entries: list[dict[str, Any]] = []
    storages: set[int] = set()
    for position in positions:
        spec = ep.graph_signature.input_specs[position]
        name = str(spec.target)
        value = ep.state_dict[name] if name in ep.state_dict else ep.constants.get(name)
        if not isinstance(value, torch.Tensor):
            raise PackageError(
                f"weight {name} is a {type(value).__name__}; a package holds tensors only"
            )
        if value.is_sparse or value.layout != torch.strided or value.is_quantized:
            raise PackageError(
                f"weight {name} is a {value.layout} tensor; packages hold strided ones"
            )
        tensor = value.detach().to("cpu").contiguous()
        key = tensor.untyped_storage().data_ptr()
        if key in storages or tensor.untyped_storage().nbytes() != tensor.nbytes:
            tensor = tensor.clone()  # safetensors stores no shared or partial storages
        storages.add(tensor.untyped_storage().data_ptr())
        weights[name] = tensor
        fake = placeholders[position].meta.get("val")
        entries.append(
            {
                "name": name,
                "kind": _WEIGHT_KINDS[spec.kind],
                "input": position,
                "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
                "device": str(fake.device if isinstance(fake, torch.Tensor) else value.device),
            }
        )
    return weights, entries


def _describe_outputs(
    ep: ExportedProgram,
    gm: torch.fx.GraphModule,
    users: Sequence[torch.fx.Node],
    weight_positions: Sequence[int],
) -> tuple[list[dict[str, Any]], list[int], list[dict[str, Any]]]:
    """The writes back (mutations), the graph outputs that are the user's, and those
    outputs as the manifest describes them."""
    specs = ep.graph_signature.output_specs
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0]) if isinstance(output.args[0], list | tuple) else [output.args[0]]
    if len(values) != len(specs):
        raise PackageError(
            f"the program's graph has {len(values)} outputs, its signature {len(specs)}"
        )
    buffers = {str(ep.graph_signature.input_specs[p].target): p for p in weight_positions}
    user_inputs = {node.name: i for i, node in enumerate(users)}
    mutations: list[dict[str, Any]] = []
    user_outputs: list[int] = []
    for index, spec in enumerate(specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            user_outputs.append(index)
            continue
        target = str(spec.target)
        table = buffers if spec.kind == OutputKind.BUFFER_MUTATION else user_inputs
        if target not in table:
            raise PackageError(f"the program writes {target}, which is not among its inputs")
        mutations.append(
            {
                "output": index,
                "kind": _MUTATIONS[spec.kind],
                "target": target,
                "index": table[target],
            }
        )
    leaves = pytree.tree_flatten_with_path(
        pytree.tree_unflatten(list(range(len(user_outputs))), ep.call_spec.out_spec)
    )[0]
    outputs = []
    for (path, _leaf), index in zip(leaves, user_outputs, strict=True):
        value = values[index]
        meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
        entry: dict[str, Any] = {"name": "output" + pytree.keystr(path)}
        if isinstance(meta, torch.Tensor):
            entry.update(
                dtype=str(meta.dtype).removeprefix("torch."),
                device=str(meta.device),
                shape=[
                    int(s) if not isinstance(s, torch.SymInt) else pyexpr(s.node.expr)
                    for s in meta.shape
                ],
            )
        else:
            entry["value"] = repr(meta)
        outputs.append(entry)
    return mutations, user_outputs, outputs


def _profile_json(profile: Any) -> dict[str, Any]:
    def tensor(p: Any) -> Any:
        if p is None:
            return None
        return {
            "rank": p.rank,
            "dtype": str(p.dtype).removeprefix("torch."),
            "device": str(p.device),
            "layout": str(p.layout).removeprefix("torch."),
        }

    return {
        "args": [tensor(a) for a in profile.args],
        "outputs": [tensor(o) for o in profile.outputs],
    }


def _call_value(value: str | Constant) -> Any:
    return value if isinstance(value, str) else {"constant": repr(value.value)}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_digest(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return _digest(json.dumps(body, sort_keys=True).encode())


def _check_replaceable(root: Path) -> None:
    """Refuse to replace anything at `root` but an empty directory or a package."""
    if (
        root.exists()
        and not (root / PACKAGE_MANIFEST).is_file()
        and (not root.is_dir() or any(root.iterdir()))
    ):
        raise PackageError(f"{root} exists and is not an ember package; it is not replaced")


def _write_package(
    root: Path,
    manifest: dict[str, Any],
    weights: dict[str, torch.Tensor],
    save_graph: Callable[[Path], Path],
) -> Path:
    """Write the package beside `root` and move it into place in one step."""
    from safetensors.torch import save

    _check_replaceable(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = root.parent / f".{root.name}.{uuid.uuid4().hex[:12]}.tmp"
    staging.mkdir()
    try:
        save_graph(staging / GRAPH)
        data = save(weights, metadata={"format": "pt"})
        (staging / WEIGHTS).write_bytes(data)
        manifest["files"] = {
            WEIGHTS: _digest(data),
            f"{GRAPH}/{MANIFEST}": _digest((staging / GRAPH / MANIFEST).read_bytes()),
        }
        manifest["digest"] = _manifest_digest(manifest)
        text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
        (staging / PACKAGE_MANIFEST).write_text(text)
        if root.exists():
            old = root.parent / f".{root.name}.{uuid.uuid4().hex[:12]}.old"
            root.rename(old)
            staging.rename(root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root


# -- loading --------------------------------------------------------------------------


def read_package_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the package at `root`, checked against its digest."""
    path = Path(root) / PACKAGE_MANIFEST
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackageError(
            f"{root} is not an ember package: {PACKAGE_MANIFEST} is missing"
        ) from None
    except (OSError, ValueError) as exc:
        raise PackageError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != "ember-package":
        raise PackageError(f"{path} is not an ember package manifest")
    if manifest.get("format") != FORMAT:
        raise PackageError(
            f"{path}: package format {manifest.get('format')!r}; this ember reads {FORMAT}"
        )
    if manifest.get("digest") != _manifest_digest(manifest):
        raise PackageError(f"{path}: its contents do not match its digest (the file was altered)")
    return manifest


def _verified(root: Path, manifest: dict[str, Any], name: str) -> bytes:
    expected = manifest["files"].get(name)
    path = root / name
    if expected is None:
        raise PackageError(f"{root / PACKAGE_MANIFEST}: lists no hash for {name}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PackageError(f"{path}: listed in the package, cannot be read: {exc}") from exc
    if _digest(data) != expected:
        raise PackageError(f"{path}: its contents do not match the package manifest's hash")
    return data


def _missing_custom_ops(names: Sequence[str]) -> list[str]:
    missing = []
    for name in names:
        namespace, _, rest = name.partition("::")
        op, _, overload = rest.partition(".")
        try:
            getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        except (AttributeError, RuntimeError):
            missing.append(name)
    return missing


def load_package(package_path: str | os.PathLike[str]) -> LoadedPackage:
    """The package at `package_path`, ready to call as `exported_program.module()`.

    Raises `PackageError` (an `ArtifactError`) where a file is missing or altered, the
    package was built by another torch or ember (version or source), needs another
    device, or calls custom operators this process has not registered."""
    root = Path(package_path)
    manifest = read_package_manifest(root)
    _verified(root, manifest, f"{GRAPH}/{MANIFEST}")  # it pins the graph's own files
    weights_data = _verified(root, manifest, WEIGHTS)
    missing = _missing_custom_ops(list(manifest["custom_ops"]))
    if missing:
        raise PackageError(
            f"{root / PACKAGE_MANIFEST}: the program calls custom operators this process "
            f"has not registered: {', '.join(missing)} (import the library that defines them "
            "before loading the package)"
        )
    specs = (
        _loads(root, manifest["in_spec"], "input"),
        _loads(root, manifest["out_spec"], "output"),
    )
    artifact, call = load_artifact(root / GRAPH)
    from safetensors.torch import load

    stored = load(weights_data)
    records = {r.index: r for r in artifact.inputs}
    weights: list[torch.Tensor] = []
    for entry in manifest["weights"]:
        name = entry["name"]
        tensor = stored.get(name)
        if tensor is None:
            raise PackageError(f"{root / WEIGHTS}: weight {name} is missing")
        if (
            str(tensor.dtype).removeprefix("torch.") != entry["dtype"]
            or list(tensor.shape) != entry["shape"]
        ):
            raise PackageError(
                f"{root / WEIGHTS}: weight {name} is {tensor.dtype} {list(tensor.shape)}; "
                f"the manifest says {entry['dtype']} {entry['shape']}"
            )
        tensor = tensor.to(entry["device"])
        record = records.get(int(entry["input"]))
        if record is not None and record.kind == "tensor" and record.static:
            size = [int(v) for v in record.size]
            stride = [int(v) for v in record.stride]
            offset = int(record.offset)
            if not conforms(tensor, size, stride, offset):  # as the kernels read it
                tensor = laid_out(tensor, size, stride, offset)
        weights.append(tensor)
    return LoadedPackage(root, manifest, call, weights, specs)


def _loads(root: Path, spec: Any, what: str) -> pytree.TreeSpec:
    """A pytree spec of the manifest; a node type this process has not registered
    (a library's output class, say) is a `PackageError` saying so."""
    try:
        return pytree.treespec_loads(json.dumps(spec))
    except (NotImplementedError, TypeError, ValueError, KeyError) as exc:
        raise PackageError(
            f"{root / PACKAGE_MANIFEST}: the program's {what} structure: {exc}"
        ) from exc


class LoadedPackage:
    """A loaded package: call it as `exported_program.module()`."""

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        call: Callable[[list[Any]], Any],
        weights: list[torch.Tensor],
        specs: tuple[pytree.TreeSpec, pytree.TreeSpec],
    ) -> None:
        self.path = root
        self.manifest = manifest
        self._call = call
        self._weights = weights
        self._names = [str(w["name"]) for w in manifest["weights"]]
        self._in_spec, self._out_spec = specs
        kwargs_spec = self._in_spec.child(1) if self._in_spec.num_children == 2 else None
        self._kwarg_names = list(kwargs_spec.context) if kwargs_spec is not None else []
        self._user_outputs = [int(i) for i in manifest["user_outputs"]]
        positions = {int(w["input"]): i for i, w in enumerate(manifest["weights"])}
        self._writes = [
            (int(m["output"]), m["kind"] == "buffer", int(m["index"]))
            for m in manifest["mutations"]
        ]
        self._writes = [
            (out, is_buffer, positions[index] if is_buffer else index)
            for out, is_buffer, index in self._writes
        ]
        self._check = _input_checker(manifest)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The package's weights by name (buffers as the calls so far left them)."""
        return dict(zip(self._names, self._weights, strict=True))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and list(kwargs) != self._kwarg_names and set(kwargs) == set(self._kwarg_names):
            kwargs = {name: kwargs[name] for name in self._kwarg_names}
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise PackageInputError(
                f"package {self.path}: the inputs' structure\n{spec}\ndiffers from the "
                f"program's\n{self._in_spec}"
            )
        self._check(flat)
        outputs = self._call([*self._weights, *flat])
        if self._writes:
            with torch.no_grad():
                for out, is_buffer, index in self._writes:
                    target = self._weights[index] if is_buffer else flat[index]
                    target.copy_(outputs[out])
        return pytree.tree_unflatten([outputs[i] for i in self._user_outputs], self._out_spec)


def _expression(source: str, names: Sequence[str]) -> Callable[..., Any]:
    """A function of the size symbols `names` evaluating a manifest's expression
    (ember's own printing, `pyexpr`), compiled once."""
    function: Callable[..., Any] = eval(
        f"lambda {', '.join([*names, '**_'])}: ({source})", dict(_EXPRESSION_GLOBALS)
    )
    return function


def _input_checker(manifest: dict[str, Any]) -> Callable[[list[Any]], None]:
    """A function that raises `PackageInputError` where a call's flat inputs do not
    fit the manifest's: built once per load, with the checks in lists."""
    dims = manifest["dynamic_dims"]
    ranges = {symbol_name(sympy.Symbol(s)): (d["min"], d["max"]) for s, d in dims.items()}
    names = sorted(ranges)
    readable = {symbol_name(sympy.Symbol(s)): d["from"] for s, d in dims.items()}
    tensors: list[tuple[int, str, torch.dtype, torch.device, int]] = []
    static: list[tuple[int, str, int, int]] = []
    binds: list[tuple[int, str, int | None, str]] = []
    equal: list[tuple[int, str, int | None, str]] = []
    derived: list[tuple[int, str, int | None, Callable[..., Any], str]] = []
    constants: list[tuple[int, str, Any]] = []
    seen: set[str] = set()

    def symbolic(index: int, label: str, dim: int | None, expr: str) -> None:
        if expr in ranges:
            (equal if expr in seen else binds).append((index, label, dim, expr))
            seen.add(expr)
        else:
            derived.append((index, label, dim, _expression(expr, names), _readable(expr, readable)))

    for index, entry in enumerate(manifest["inputs"]):
        label, kind = entry["name"], entry["kind"]
        if kind == "tensor":
            dtype = getattr(torch, entry["dtype"])
            tensors.append(
                (index, label, dtype, torch.device(entry["device"]), len(entry["shape"]))
            )
            for dim, extent in enumerate(entry["shape"]):
                if isinstance(extent, int):
                    static.append((index, label, dim, extent))
                else:
                    symbolic(index, label, dim, extent)
        elif kind == "int":
            symbolic(index, label, None, entry["value"])
        else:
            constants.append((index, label, entry["value"]))
    conditions = [(_expression(c["check"], names), c["text"]) for c in manifest["conditions"]]

    def size(arg: Any, dim: int | None) -> int:
        return int(arg) if dim is None else int(arg.shape[dim])

    def where(label: str, dim: int | None) -> str:
        return f"input {label}" if dim is None else f"input {label}: dimension {dim}"

    def check(flat: list[Any]) -> None:
        for index, label, dtype, device, rank in tensors:
            x = flat[index]
            if not isinstance(x, torch.Tensor):
                raise PackageInputError(f"input {label}: expected a tensor, got {type(x).__name__}")
            if x.dtype != dtype or x.device != device or x.dim() != rank:
                raise PackageInputError(
                    f"input {label}: a {x.dim()}-d {str(x.dtype).removeprefix('torch.')} "
                    f"tensor on {x.device}; the package takes a {rank}-d "
                    f"{str(dtype).removeprefix('torch.')} tensor on {device}"
                )
        for index, label, axis, expected in static:
            n = flat[index].shape[axis]
            if n != expected:
                raise PackageInputError(
                    f"input {label}: dimension {axis} has size {n}; the package was exported "
                    f"for size {expected} there (a static dimension)"
                )
        values: dict[str, int] = {}
        for index, label, dim, symbol in binds:
            n = size(flat[index], dim)
            low, high = ranges[symbol]
            if (low is not None and n < low) or (high is not None and n > high):
                raise PackageInputError(
                    f"{where(label, dim)} has size {n}, outside the range {_span(low, high)} "
                    f"the package accepts (the program's dynamic dimension "
                    f"{symbol.removeprefix('sym_')})"
                )
            values[symbol] = n
        for index, label, dim, symbol in equal:
            n = size(flat[index], dim)
            if n != values[symbol]:
                raise PackageInputError(
                    f"{where(label, dim)} has size {n}; the program needs it equal to "
                    f"{readable[symbol]}, which is {values[symbol]}"
                )
        for index, label, dim, evaluate, text in derived:
            n, expected = size(flat[index], dim), evaluate(**values)
            if n != expected:
                raise PackageInputError(
                    f"{where(label, dim)} has size {n}; the program needs {text}, which is "
                    f"{expected}"
                )
        for evaluate, text in conditions:
            if not evaluate(**values):
                given = ", ".join(f"{readable[s]} = {v}" for s, v in sorted(values.items()))
                raise PackageInputError(
                    f"the inputs' sizes fail the program's condition {text} ({given})"
                )
        for index, label, value in constants:
            if flat[index] != value:
                raise PackageInputError(
                    f"input {label} is {flat[index]!r}; the program was exported with "
                    f"{value!r} there (a constant of the program)"
                )

    return check


# -- describing -----------------------------------------------------------------------


def describe_package(package_path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """The package's manifest as text for people (`ember package PATH`), saying
    whether its files match their hashes and it fits this machine; and the problem
    found, if any."""
    root = Path(package_path)
    manifest = read_package_manifest(root)
    lines = [f"ember package {root}"]
    v = manifest["versions"]
    lines.append(
        f"  built with: ember {v.get('ember')}, torch {v.get('torch')}, "
        f"Python {v.get('python')}, Triton {v.get('triton')}; format {manifest['format']}"
    )
    lines.append(f"  ember source fingerprint: {v.get('ember-source', 'not recorded')}")
    lines.append("  inputs:")
    for entry in manifest["inputs"]:
        if entry["kind"] == "tensor":
            lines.append(f"    {entry['name']}: {_tensor_text(entry)}")
        elif entry["kind"] == "int":
            lines.append(f"    {entry['name']}: int {_readable(entry['value'], {})}")
        else:
            lines.append(f"    {entry['name']}: constant {entry['value']!r}")
    if manifest["dynamic_dims"]:
        lines.append("  dynamic dimensions:")
        for symbol, d in manifest["dynamic_dims"].items():
            lines.append(f"    {symbol}: {_span(d['min'], d['max'])} (read from {d['from']})")
    for condition in manifest["conditions"]:
        lines.append(f"  condition: {condition['text']}")
    lines.append("  outputs:")
    for entry in manifest["outputs"]:
        if "dtype" in entry:
            lines.append(f"    {entry['name']}: {_tensor_text(entry)}")
        else:
            lines.append(f"    {entry['name']}: {entry['value']}")
    total = sum(
        _numel(w["shape"]) * torch.empty(0, dtype=getattr(torch, w["dtype"])).element_size()
        for w in manifest["weights"]
    )
    count = len(manifest["weights"])
    lines.append(f"  weights: {count} tensors, {total / 2**20:.2f} MiB ({WEIGHTS})")
    for w in manifest["weights"]:
        lines.append(f"    {w['name']}: {w['kind']} {w['dtype']}{w['shape']} on {w['device']}")
    for m in manifest["mutations"]:
        lines.append(f"  each call writes back the {m['kind']} {m['target']}")
    for name in manifest["custom_ops"]:
        lines.append(f"  calls custom operator {name} (register it before loading)")
    if manifest["data_dependent_sizes"]:
        sizes = ", ".join(
            f"{s} {_span(d['min'], d['max'])}" for s, d in manifest["data_dependent_sizes"].items()
        )
        lines.append(f"  data-dependent sizes: {sizes}")
    lines.append(f"  graph: {manifest['compiled_graph']} in {GRAPH}/")
    problem = None
    try:
        _verified(root, manifest, f"{GRAPH}/{MANIFEST}")
        graph = read_manifest(root / GRAPH)
        kinds = sorted({k["type"] for k in graph["kernels"].values()})
        lines.append(f"    kernels: {len(graph['kernels'])} ({', '.join(kinds) or 'none'})")
        needs = graph["requires"]
        for device, capability in needs.get("cuda", {}).items():
            lines.append(f"    needs CUDA device {device}: {capability}")
        if "cpu" in needs:
            features = " ".join(needs["cpu"]["features"])
            lines.append(f"    needs a CPU: {needs['cpu']['machine']} with {features}")
        _verified(root, manifest, WEIGHTS)
        verified_files(root / GRAPH, graph)
        lines.append("  files: each matches its hash")
        check_requirements(graph, root / GRAPH)
        lines.append("  fits this machine and process: yes")
    except ArtifactError as exc:
        problem = str(exc)
        lines.append(f"  PROBLEM: {problem}")
    return "\n".join(lines), problem


def print_package(package_path: str | os.PathLike[str], as_json: bool = False) -> int:
    """`ember package PATH [--json]`: print the package's manifest, readably or as
    JSON; exit status 1 where it cannot be read, a file fails its hash or it does
    not fit this machine (the text says which)."""
    import sys

    try:
        if as_json:
            manifest = read_package_manifest(package_path)
            print(json.dumps(manifest, indent=1, sort_keys=True))
            return 0
        text, problem = describe_package(package_path)
    except ArtifactError as exc:
        print(f"ember package: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0 if problem is None else 1


def _span(low: int | None, high: int | None) -> str:
    return f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"


def _tensor_text(entry: dict[str, Any]) -> str:
    shape = ", ".join(_readable(s, {}) if isinstance(s, str) else str(s) for s in entry["shape"])
    return f"{entry['dtype']}[{shape}] on {entry['device']}"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


__all__ = [
    "LoadedPackage",
    "PackageError",
    "PackageInputError",
    "compile_and_package",
    "describe_package",
    "load_package",
    "print_package",
    "read_package_manifest",
]
