"""A fuzzing campaign: many seeds, bounded time, failures shrunk and written out.

`fuzz(seeds, ...)` generates and runs one program per seed until the seeds or the time
budget run out; each failure is shrunk and written as `repro_seed<N>.py` under the
output directory. `python -m ember.runtime.fuzz` prints one line per failure and a
summary line (`fuzz: N programs, F failures, ...`) and can write JSON.

With `--workers N` the seeds are shared among N worker processes (`parallel.py`): a
program that kills its process (a signal, as a wild write or an integer division trap
would) is then a 'crash' finding of its seed, and the campaign goes on.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ember.runtime.fuzz.generate import generate, hazards_for
from ember.runtime.fuzz.program import Program
from ember.runtime.fuzz.run import INVALID, CompileFn, Finding, compile_with_ember, run_program
from ember.runtime.fuzz.shrink import shrink, write_reproducer


@dataclass
class Failure:
    seed: int
    kind: str
    detail: str
    steps_before: int
    steps_after: int
    reproducer: str | None


@dataclass
class CampaignResult:
    programs: int = 0
    raised: int = 0  # programs with bad input where eager and ember both raised
    invalid: int = 0  # generator bugs: eager rejected the program
    dynamic: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"fuzz: {self.programs} programs ({self.dynamic} dynamic), "
            f"{self.raised} raised as eager did, {len(self.failures)} failures, "
            f"{self.invalid} invalid, {self.seconds:.0f} s"
        )


def fuzz(
    seeds: Iterable[int],
    *,
    out_dir: Path | None = None,
    time_budget_s: float = float("inf"),
    device: str = "cpu",
    max_steps: int = 10,
    compile_fn: CompileFn = compile_with_ember,
) -> CampaignResult:
    """Run one program per seed; shrink and write out each failure."""
    result = CampaignResult()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            if time.perf_counter() - start > time_budget_s:
                break
            record(result, *run_seed(seed, out_dir, device, max_steps, compile_fn))
    result.seconds = time.perf_counter() - start
    return result


def run_seed(
    seed: int,
    out_dir: Path | None,
    device: str,
    max_steps: int,
    compile_fn: CompileFn = compile_with_ember,
) -> tuple[str, bool, Failure | None]:
    """One seed's outcome ('ok', 'raised', 'invalid' or 'failure'), whether its
    program is dynamic, and its failure (shrunk and written out) if any."""
    program = generate(seed, max_steps, hazards_for(device))
    stats: dict[str, int] = {}
    finding = run_program(program, device=device, compile_fn=compile_fn, stats=stats)
    if finding is None:
        return ("raised" if stats.get("raised") else "ok"), program.dynamic, None
    if finding.kind == INVALID:
        return "invalid", program.dynamic, None

    def judge(candidate: Program) -> Finding | None:
        return run_program(candidate, device=device, compile_fn=compile_fn)

    small, small_finding = shrink(program, finding, judge)
    path = write_reproducer(small, small_finding, out_dir, device) if out_dir else None
    failure = Failure(
        seed,
        small_finding.kind,
        small_finding.detail,
        len(program.steps),
        len(small.steps),
        str(path) if path else None,
    )
    return "failure", program.dynamic, failure


def record(result: CampaignResult, outcome: str, dynamic: bool, failure: Failure | None) -> None:
    """Count one seed's outcome into `result`."""
    result.programs += 1
    result.dynamic += dynamic
    result.invalid += outcome == "invalid"
    result.raised += outcome == "raised"
    if failure is not None:
        result.failures.append(failure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.runtime.fuzz", description=__doc__)
    parser.add_argument("--seeds", default="0:200", help="START:STOP range of seeds")
    parser.add_argument("--time-budget", type=float, default=float("inf"), help="seconds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("fuzz_out"), help="reproducers go here")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: none)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    first, last = (int(part) for part in args.seeds.split(":"))
    seeds = range(first, last)
    if args.worker:
        from ember.runtime.fuzz.parallel import serve

        return serve(args.out, args.device, args.max_steps)
    run: Callable[..., CampaignResult] = fuzz
    if args.workers > 0:
        from ember.runtime.fuzz.parallel import fuzz_in_workers

        run = functools.partial(fuzz_in_workers, workers=args.workers)
    result = run(
        seeds,
        out_dir=args.out,
        time_budget_s=args.time_budget,
        device=args.device,
        max_steps=args.max_steps,
    )
    for f in result.failures:
        print(f"seed {f.seed}: {f.kind} ({f.steps_before} -> {f.steps_after} steps): {f.detail}")
        print(f"    reproducer: {f.reproducer}")
    print(result.summary())
    if args.json is not None:
        args.json.write_text(json.dumps([f.__dict__ for f in result.failures], indent=1))
    return 1 if result.failures else 0
