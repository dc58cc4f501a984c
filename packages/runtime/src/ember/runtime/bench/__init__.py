"""`ember bench`: ember against eager and TorchInductor (its default mode and, on the
GPU, `mode="reduce-overhead"`, CUDA graphs), side by side, one process per measurement.

Files in processing order: `blocks.py` (built-in blocks) and `registry.py` (every model,
its sizes and which set it is in), `measure.py` (one measurement in its own process),
`harness.py` (runs them, with progress and a time limit), `report.py` (table and chart).
`run_cli` is what `ember bench` calls; its exit status is 1 when any measurement asked
for did not give a time that matches eager (failed, skipped, not run). How to run it
and read the results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from ember.runtime.bench.harness import (
    BACKENDS,
    MODES,
    OPTIONAL_BACKENDS,
    BenchOptions,
    BenchRecord,
    default_backends,
    default_models,
    run_bench,
    unmeasured,
    write_json,
)
from ember.runtime.bench.registry import MODELS, ModelSpec
from ember.runtime.environment import environment

__all__ = [
    "MODELS",
    "BenchOptions",
    "BenchRecord",
    "ModelSpec",
    "add_arguments",
    "run_bench",
    "run_cli",
]


def _csv(text: str, allowed: object) -> list[str]:
    items = [item for item in text.split(",") if item]
    unknown = [item for item in items if item not in allowed]  # type: ignore[operator]  # any container
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {sorted(allowed)}")  # type: ignore[call-overload]  # any iterable
    return items


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--models",
        default="",
        help=f"comma-separated; default: the device's set; any of {', '.join(MODELS)}",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="inference,train")
    parser.add_argument(
        "--backends",
        default="",
        help="comma-separated; default: eager,inductor,ember on cpu, and inductor-ro "
        "(Inductor's mode='reduce-overhead', CUDA graphs) too on cuda; also aot_eager "
        "(the Dynamo + AOTAutograd compile floor)",
    )
    parser.add_argument(
        "--ember-mode",
        default=None,
        help="torch.compile's mode= for ember only (e.g. reduce-overhead; default: none)",
    )
    parser.add_argument("--dtype", default=None, help="default float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per measurement")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per measurement (default 1 on cpu; 0: torch's default)",
    )
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-compile runs")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--time-limit", type=float, default=float("inf"), help="seconds in all")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    parser.add_argument("--plot", type=Path, default=None, help="write a speedup chart (PNG)")
    parser.add_argument(
        "--prefetch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start the next measurement's process (imports) during the current one "
        "(default: on except on the CPU, where it would disturb one-thread timings)",
    )
    parser.add_argument("--list", action="store_true", help="list the models and exit")


def run_cli(args: argparse.Namespace) -> int:
    from ember.runtime.bench.report import format_records, plot_speedups

    if args.list:
        for spec in MODELS.values():
            where = "/".join(sorted(spec.sets))
            needs = f" (needs {spec.requires})" if spec.requires else ""
            print(f"{spec.name:<18} {where:<8} {spec.about}{needs}")
        return 0
    try:
        models = _csv(args.models, MODELS) or default_models(args.device)
        modes = _csv(args.modes, MODES)
        backends = _csv(args.backends, BACKENDS + OPTIONAL_BACKENDS) or default_backends(
            args.device
        )
    except argparse.ArgumentTypeError as exc:
        print(f"ember bench: {exc}", file=sys.stderr)
        return 2
    options = BenchOptions(
        models, modes, backends, args.device, args.dtype, args.runs, args.threads, not args.no_warm,
        args.timeout, args.time_limit, args.prefetch, args.ember_mode,
    )  # fmt: skip
    json_path = args.json
    about = {**environment(args.device), "options": asdict(options)} if json_path else None
    records = run_bench(
        options, (lambda rs: write_json(rs, json_path, about)) if json_path else None
    )
    print(format_records(records))
    status = 0
    if args.json is not None:
        write_json(records, args.json, about)
        print(f"records: {args.json}")
    if args.plot is not None:
        try:
            print(f"chart: {plot_speedups(records, args.plot)}")
        except ImportError:
            print("ember bench: --plot needs matplotlib (the bench group)", file=sys.stderr)
            status = 1
    missing = unmeasured(records)
    for r in missing:
        why = r.error or ("does not match eager" if r.matches_eager is False else "no time")
        print(f"ember bench: {r.model} {r.mode} {r.backend}: {why}", file=sys.stderr)
    return 1 if missing else status
