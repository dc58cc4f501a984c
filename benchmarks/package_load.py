"""How long a fresh process takes to load an ahead-of-time package and make its first
call, and whether the load imported the compiler (Dynamo, ember's backend).

Builds GPT-2 (the CPU size of `ember bench`: 2 layers, hidden 128, sequence 64;
its logits as the output) as an exported program, packages it with
`compile_and_package`, then times fresh processes that run only

    import ember.runtime.aot
    package = ember.runtime.aot.load_package(path)
    package(input_ids)

reporting the import, the load, the first call, the whole process's wall time, and
which of `torch._dynamo`, `ember.runtime.backend` and `ember.runtime.compiler` were
imported.

    uv run python benchmarks/package_load.py [--runs 5]

Runs with PYTHONPATH over packages/*/src or without it (it adds them itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_PATHS = [str(p) for p in sorted((_ROOT / "packages").glob("*/src"))]

_CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
torch_done = time.perf_counter()
import ember.runtime.aot
imported = time.perf_counter()
package = ember.runtime.aot.load_package(sys.argv[1])
loaded = time.perf_counter()
ids = torch.load(sys.argv[2])
with torch.no_grad():
    package(ids)
called = time.perf_counter()
print(json.dumps({
    "torch": torch_done - start, "import": imported - torch_done, "load": loaded - imported,
    "first_call": called - loaded,
    "modules": [m for m in ("torch._dynamo", "ember.runtime.backend", "ember.runtime.compiler")
                if m in sys.modules],
}))
"""


def build(work: Path) -> tuple[Path, Path]:
    import torch

    from ember.runtime.aot import compile_and_package
    from ember.runtime.bench.registry import MODELS
    from ember.runtime.config import config

    class Logits(torch.nn.Module):
        """GPT-2 returning its logits alone: a loading process then needs no
        `transformers` to rebuild the output's structure."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.model(ids).logits
            return logits

    torch.manual_seed(0)
    gpt2, inputs = MODELS["gpt2"].build("cpu")
    model = Logits(gpt2).eval()
    ids = work / "ids.pt"
    torch.save(inputs[0], ids)
    with config.scope(cache_dir=work / "cache"):
        ep = torch.export.export(model, tuple(inputs), strict=False)
        path = Path(compile_and_package(ep, work / "gpt2.ember"))
    return path, ids


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.path[:0] = _PATHS
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*_PATHS, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="ember-load-") as tmp:
        package, ids = build(Path(tmp))
        runs = []
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(package), str(ids)],
                env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            wall = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            runs.append({**json.loads(done.stdout.splitlines()[-1]), "process": wall})
    for key in ("torch", "import", "load", "first_call", "process"):
        values = [float(r[key]) for r in runs]
        print(f"{key:<11} median {statistics.median(values):6.3f} s  min {min(values):6.3f} s")
    print("imported:", ", ".join(runs[-1]["modules"]) or "none of the compiler's modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
