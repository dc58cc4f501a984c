"""Debug dumps: one directory per process run, and a runnable repro script per graph.

With `EMBER_DEBUG_DIR=ROOT`, each process writes under its own
`ROOT/run-<date>-<time>-<pid>/` (`run_directory`), so a second process never
overwrites the first one's dumps, and `ROOT/LATEST` names the newest run. Inside it,
each compiled graph has a directory of its own (`<graph>/`: its stages, see
ember.runtime.compiler, and `repro.py`).

`repro.py` is the ATen graph as Python, its inputs' metadata (sizes, strides, dtype,
device) and the code to build random inputs of the same layout, compile the graph
with ember and compare it with eager under the accuracy rule: `python repro.py`
exits 1 when they differ. Graph inputs' values are not kept (they may be large, or
private): a failure that needs particular values shows in check mode
(EMBER_CHECK), not here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

_runs: dict[tuple[Path, int], Path] = {}
LATEST = "LATEST"


def run_directory(root: Path) -> Path:
    """This process's run directory under `root` (made at the first call; a forked
    child gets its own)."""
    key = (root.resolve(), os.getpid())
    found = _runs.get(key)
    if found is not None:
        return found
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(100):
        suffix = f"-{attempt}" if attempt else ""
        directory = root / f"run-{stamp}-{os.getpid()}{suffix}"
        try:
            directory.mkdir()
            break
        except FileExistsError:  # the same pid in the same second: a reused pid
            continue
    else:  # pragma: no cover - a hundred runs of one pid within a second
        raise FileExistsError(f"no free run directory under {root}")
    latest = root / f".{LATEST}.{os.getpid()}"
    latest.write_text(directory.name + "\n")
    latest.replace(root / LATEST)  # atomic: readers see one name or the other
    _runs[key] = directory
    return directory


def _tensor_line(name: str, value: torch.Tensor) -> str:
    sizes, strides = tuple(value.shape), tuple(value.stride())
    return (
        f"    {name!r}: ({sizes}, {strides}, {value.storage_offset()}, {value.dtype}, "
        f"{str(value.device)!r}),"
    )


def _hint(value: Any) -> Any:
    """A concrete value for a symbolic size (its hint), else the value itself."""
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value.node.hint
    return value


def repro_source(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph: str) -> str:
    """A script that rebuilds `gm`, makes random inputs of the example inputs' layouts,
    compiles the graph with ember and compares it with eager (see the module's
    docstring)."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    tensors, others = [], []
    for index, name in enumerate(placeholders):
        value = example_inputs[index] if index < len(example_inputs) else None
        if value is None:
            value = next(n for n in gm.graph.nodes if n.name == name).meta.get("val")
        if isinstance(value, torch.Tensor):
            tensors.append(_tensor_line(name, value))
        else:
            others.append(f"    {name!r}: {_hint(value)!r},")
    attributes = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, str(node.target), None)
            if isinstance(value, torch.Tensor):
                attributes.append(_tensor_line(str(node.target), value))
    code = gm.code.strip("\n")
    body = "\n".join("    " + line if line else "" for line in code.splitlines())
    return f'''"""Repro for ember graph {graph!r}: python repro.py

The ATen graph ember compiled, with random inputs of the same sizes, strides, dtypes
and devices; compiles it with ember, runs it eagerly too, and compares the outputs
(exit status 1 when they differ)."""

import copy
import sys

import torch
from torch import device, inf, nan  # noqa: F401  # the graph's code may name them

import ember.runtime  # noqa: F401
from ember.runtime.accuracy import compare_outputs
from ember.runtime.compiler import compile_graph

# name: (sizes, strides, storage offset, dtype, device)
TENSORS = {{
{chr(10).join(tensors)}
}}
OTHERS = {{
{chr(10).join(others)}
}}
ATTRIBUTES = {{
{chr(10).join(attributes)}
}}
ORDER = {placeholders!r}


def random_tensor(sizes, strides, offset, dtype, where):
    """Random values in a tensor of exactly this layout (integers small and >= 0, so
    that indices stay in range for small dimensions)."""
    needed = offset + sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0) + 1
    if dtype.is_floating_point or dtype.is_complex:
        flat = torch.randn(needed, dtype=dtype, device=where)
    elif dtype == torch.bool:
        flat = torch.rand(needed, device=where) < 0.5
    else:
        flat = torch.randint(0, 2, (needed,), dtype=dtype, device=where)
    return flat.as_strided(sizes, strides, offset)


class Repro(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, layout in ATTRIBUTES.items():
            setattr(self, name, random_tensor(*layout))

{body}


def main():
    torch.manual_seed(0)
    module = Repro()
    inputs = [
        random_tensor(*TENSORS[name]) if name in TENSORS else OTHERS[name] for name in ORDER
    ]
    expected = module(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    gm = torch.fx.symbolic_trace(module)
    # compile_graph reads each node's example value (meta["val"])
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    compiled = compile_graph(gm, inputs, name={graph!r})
    actual = compiled(list(inputs))
    # the accuracy rule's reference: the same graph in float64
    exact = copy.deepcopy(module).to(torch.float64)
    upcast = [
        t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in inputs
    ]
    try:
        reference = exact(*upcast)
    except Exception:  # an op without float64 kernels: compare with eager alone
        reference = None
    verdict = compare_outputs(actual, expected, reference=reference)
    if verdict is None:
        print("ember matches eager")
        return 0
    print(f"ember differs from eager at output {{verdict[1]}}: {{verdict[0].describe()}}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''
