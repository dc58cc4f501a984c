"""`ember demo`: compile two built-in models with ember and compare them with eager.

For a transformer block and an MLP, in inference and for a training step (forward +
backward), it checks ember's outputs (and gradients) against eager, times both, and
prints one table row per case: compile seconds, eager and ember milliseconds, the
speedup, the largest error, and the number of kernels ember launches.

Times come from `ember.runtime.timing.compare_ms`: eager and ember run in turn, ten
rounds of ten calls, and each side's time is its fastest round's median, so that a
neighbour taking a core of a small shared machine for a while slows both sides alike
or neither (one median over 20 calls once printed 0.04x on a busy 2-core machine, and
1.42x on the next run). Both use `torch.get_num_threads()` threads (`--threads` sets
it), in one OpenMP pool (ember.runtime.threads).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ember.runtime.compiler import compile_records
from ember.runtime.config import config
from ember.runtime.models import MLP, TransformerBlock
from ember.runtime.table import format_table
from ember.runtime.timing import compare_ms, synchronize


@dataclass
class DemoRow:
    model: str
    mode: str
    compile_s: float
    eager_ms: float
    ember_ms: float
    max_err: float
    kernels: int
    ok: bool
    ran_eagerly: list[str]


def _cases(device: torch.device) -> list[tuple[str, Callable[[], nn.Module], tuple[int, ...]]]:
    return [
        ("transformer_block", lambda: TransformerBlock(64, 4, 256), (8, 32, 64)),
        ("mlp", lambda: MLP(256, 512, 64), (64, 256)),
    ]


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.detach().float(), b.detach().float(), rtol=1e-4, atol=1e-5)


def run_case(
    name: str,
    make: Callable[[], nn.Module],
    shape: tuple[int, ...],
    mode: str,
    device: torch.device,
) -> DemoRow:
    torch.manual_seed(0)
    eager = make().to(device)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(shape, device=device)
    first_record = len(compile_records)

    if mode == "inference":
        eager.eval()
        model.eval()
        with torch.no_grad():
            ref = eager(x)
            start = time.perf_counter()
            out = compiled(x)
            synchronize(device)
            compile_s = time.perf_counter() - start
            errs = [_max_err(out, ref)]
            ok = _close(out, ref)
            times = compare_ms({"eager": lambda: eager(x), "ember": lambda: compiled(x)}, device)
    else:

        def step(
            m: Callable[[torch.Tensor], torch.Tensor], params: list[nn.Parameter]
        ) -> torch.Tensor:
            for p in params:
                p.grad = None
            loss = m(x).square().mean()
            loss.backward()  # type: ignore[no-untyped-call]  # torch's stub is untyped
            return loss

        eager_params, ember_params = list(eager.parameters()), list(model.parameters())
        ref = step(eager, eager_params)
        start = time.perf_counter()
        out = step(compiled, ember_params)
        synchronize(device)
        compile_s = time.perf_counter() - start
        pairs = [(out, ref)] + [
            (p.grad, q.grad)
            for p, q in zip(ember_params, eager_params, strict=True)
            if p.grad is not None and q.grad is not None
        ]
        errs = [_max_err(a, b) for a, b in pairs]
        ok = all(_close(a, b) for a, b in pairs) and len(pairs) == len(eager_params) + 1
        times = compare_ms(
            {
                "eager": lambda: step(eager, eager_params),
                "ember": lambda: step(compiled, ember_params),
            },
            device,
        )

    records = compile_records[first_record:]
    return DemoRow(
        model=name,
        mode=mode,
        compile_s=compile_s,
        eager_ms=times["eager"],
        ember_ms=times["ember"],
        max_err=max(errs),
        kernels=sum(r.kernels for r in records),
        ok=ok,
        ran_eagerly=[r.graph for r in records if r.ran_eagerly],
    )


def run_demo(device_name: str | None = None, threads: int | None = None) -> int:
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "ember demo: --device cuda was asked for, but torch sees no CUDA device",
            file=sys.stderr,
        )
        return 2
    cases = [(n, m, s, mode) for n, m, s in _cases(device) for mode in ("inference", "train")]
    print(
        f"ember demo on {device} (torch {torch.__version__}), float32, "
        f"{torch.get_num_threads()} CPU thread(s)",
        file=sys.stderr,
    )
    rows: list[DemoRow] = []
    for index, (name, make, shape, mode) in enumerate(cases, start=1):
        print(f"[{index}/{len(cases)}] compiling {name} ({mode}) ...", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        rows.append(run_case(name, make, shape, mode, device))
        row = rows[-1]
        print(
            f"      done: {row.compile_s:.2f} s compile, "
            f"{'matches eager' if row.ok else 'MISMATCH'}",
            file=sys.stderr,
            flush=True,
        )
    headers = [
        "model",
        "mode",
        "compile s",
        "eager ms",
        "ember ms",
        "speedup",
        "max err",
        "kernels",
        "matches eager",
    ]
    table = [
        [
            r.model,
            r.mode,
            f"{r.compile_s:.2f}",
            f"{r.eager_ms:.3f}",
            f"{r.ember_ms:.3f}",
            f"{r.eager_ms / r.ember_ms:.2f}x",
            f"{r.max_err:.1e}",
            str(r.kernels),
            "yes" if r.ok else "NO",
        ]
        for r in rows
    ]
    print(format_table(headers, table))
    for r in rows:
        if r.ran_eagerly:
            print(
                f"note: {r.model} ({r.mode}) ran graphs eagerly after a compile failure: "
                f"{r.ran_eagerly}"
            )
    print(f"generated code: {config.cache_dir / 'wrappers'}")
    if config.debug_dir is not None:
        print(f"debug dump: {config.debug_dir}")
    else:
        print("set EMBER_DEBUG_DIR=<dir> to also dump graphs, IR and schedules")
    return 0 if all(r.ok and not r.ran_eagerly for r in rows) else 1
