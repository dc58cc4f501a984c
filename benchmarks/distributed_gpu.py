"""Data-parallel training on several GPUs: eager, Inductor and ember under DDP and FSDP2.

    PYTHONPATH=$(printf '%s:' $PWD/packages/*/src) python3 benchmarks/distributed_gpu.py --out DIR
    uv run python benchmarks/distributed_gpu.py --device cpu --tiny --out bench_out/dist

A GPT-2-medium-class model (transformers' GPT2LMHeadModel from a config written here:
24 layers, width 1024, 16 heads, vocabulary 50257, 1024 tokens; no dropout) trains for
`--steps` steps with AdamW, fp32 parameters and bfloat16 autocast, on `--nproc` ranks
(NCCL on GPUs, gloo on the CPU), once per wrapper (DDP, FSDP2) and backend (eager,
inductor, ember). Each configuration runs in a fresh set of processes started by this
script, with fresh compile caches (so the first step's time is a cold compile), the
same seed and the same data: rank r's batches are drawn from seed 1000 + r.

- DDP: the DDP-wrapped model is compiled whole; Dynamo's DDP support splits the graph
  at the gradient buckets (25 MiB, DDP's default) and the backend compiles each piece.
- FSDP2: `fully_shard` per transformer block and at the root; each block is compiled
  before it is sharded (as torchtitan does), so the sharding hooks run eagerly around
  the compiled blocks; embeddings, final norm, head and loss run eagerly.

Per configuration: the mean loss over the ranks at every step, the step times (the
slowest rank's, synchronised), their median after `--warmup` steps, the first step's
time (it holds the compile) and the peak memory of rank 0. Losses are compared with
eager's: the largest relative difference over the steps, and whether every step is
within the accuracy rule's bfloat16 tolerance. Ember runs with EMBER_STRICT=1: a graph
it fails to compile ends the configuration with an error instead of running eagerly.

Each configuration has a time limit (`--timeout`), and the whole run one
(`--time-limit`): a configuration that hangs is killed and recorded, and those not
started in time are recorded as not run. Eager runs first, then ember, then Inductor.
Writes DIR/distributed.json and DIR/distributed.md, and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

BF16_RTOL = 1.6e-2  # ember.runtime.accuracy's bfloat16 tolerance, applied to the losses

SIZES = {  # layers, width, heads, vocabulary, tokens per sequence
    "medium": (24, 1024, 16, 50257, 1024),
    "tiny": (2, 64, 4, 512, 32),
}


class CausalLMLoss(nn.Module):
    """The language model and its next-token loss (fp32 cross-entropy) as one module,
    so that the compiled function covers the loss too."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=ids).logits
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_model(size: str, device: torch.device) -> nn.Module:
    import transformers

    layers, width, heads, vocab, seq = SIZES[size]
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    with device:
        model = transformers.GPT2LMHeadModel(config)
    return CausalLMLoss(model)


def batches(args: argparse.Namespace, rank: int, device: torch.device) -> list[Any]:
    """This rank's token batches for every step, on the device before the clock starts."""
    vocab, seq = SIZES[args.size][3], SIZES[args.size][4]
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(args.steps):
        ids = torch.randint(0, vocab, (args.batch, seq + 1), generator=g)
        out.append((ids[:, :-1].to(device), ids[:, 1:].to(device)))
    return out


def wrap(model: CausalLMLoss, wrapper: str, backend: str) -> Any:
    """The step's forward: the wrapped (and, unless eager, compiled) model."""
    compiled = backend != "eager"
    if wrapper == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        return torch.compile(ddp, backend=backend) if compiled else ddp
    from torch.distributed.fsdp import fully_shard

    blocks = model.lm.transformer.h
    for i, block in enumerate(blocks):
        if compiled:
            blocks[i] = torch.compile(block, backend=backend)
        fully_shard(blocks[i])
    fully_shard(model)
    return model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(rank: int, world: int, args: argparse.Namespace, wrapper: str, backend: str) -> Any:
    """One rank's run; returns what rank 0 reports."""
    if args.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if backend == "ember":
        import ember.runtime  # noqa: F401  # registers backend="ember"
    model = build_model(args.size, device)
    step_fn = wrap(model, wrapper, backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = batches(args, rank, device)
    losses, seconds = [], []
    dist.barrier()
    for ids, targets in data:
        synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.no_autocast):
            loss = step_fn(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        losses.append(loss.detach().float())
    mean_losses = torch.stack(losses)
    dist.all_reduce(mean_losses)  # gloo and NCCL both sum; divide below
    slowest = torch.tensor(seconds, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return {
        "losses": (mean_losses / world).tolist(),
        "step_s": slowest.tolist(),
        "peak_gb": peak / 2**30,
    }


def rank_main(rank: int, world: int, args: argparse.Namespace, job: dict[str, Any]) -> None:
    """A spawned rank: join the group, train, rank 0 writes the result file."""
    os.setsid()  # its own process group, so that a timeout also stops its compile workers
    result: dict[str, Any]
    try:
        dist.init_process_group(
            "nccl" if args.device == "cuda" else "gloo",
            init_method=f"file://{job['store']}",
            rank=rank,
            world_size=world,
        )
        result = {"status": "ok", **train(rank, world, args, job["wrapper"], job["backend"])}
    except BaseException as exc:
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        traceback.print_exc()
    if rank == 0 or result["status"] != "ok":
        Path(job["result"]).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's shutdown: with gloo it can abort after the group is gone
    # (a gloo thread dropping a finished work that holds Python state; see
    # tests/stack/distributed_worker.py), and the result is written.
    os._exit(0 if result["status"] == "ok" else 1)


def run_configuration(args: argparse.Namespace, wrapper: str, backend: str, limit: float) -> Any:
    """Start `--nproc` processes for one configuration and wait at most `limit` seconds."""
    scratch = Path(tempfile.mkdtemp(prefix=f"dist-{wrapper}-{backend}-"))
    env = {
        "EMBER_CACHE_DIR": str(scratch / "ember"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "LOCAL_WORLD_SIZE": str(args.nproc),
    }
    if backend == "ember":
        env["EMBER_STRICT"] = "1"
    job = {"wrapper": wrapper, "backend": backend,
           "store": str(scratch / "store"), "result": str(scratch / "result.json")}  # fmt: skip
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=rank_main, args=(rank, args.nproc, args, job))
        for rank in range(args.nproc)
    ]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the spawned ranks start with it (caches are read at import)
    start = time.perf_counter()
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = start + limit
    while any(p.is_alive() for p in procs) and time.perf_counter() < deadline:
        if any(p.exitcode not in (None, 0) for p in procs):
            time.sleep(5)  # let the other ranks write their errors, then stop them
            break
        time.sleep(0.5)
    timed_out = any(p.is_alive() for p in procs) and time.perf_counter() >= deadline
    for p in procs:
        if p.is_alive() and p.pid is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                p.kill()
        p.join()
    wall = time.perf_counter() - start
    results = sorted(scratch.glob("result.rank*.json"))
    reports = [json.loads(path.read_text()) for path in results]
    errors = [r["error"] for r in reports if r["status"] != "ok"]
    if timed_out:
        return {"status": f"timeout after {limit:.0f} s", "wall_s": wall}
    if errors or not reports:
        codes = [p.exitcode for p in procs]
        return {"status": "error", "error": errors[0] if errors else f"exit codes {codes}",
                "wall_s": wall}  # fmt: skip
    report: dict[str, Any] = reports[0]
    report["wall_s"] = wall
    timed = report["step_s"][args.warmup :]
    report["median_step_ms"] = 1000 * statistics.median(timed) if timed else math.nan
    report["first_step_s"] = report["step_s"][0]
    return report


def compare_losses(report: dict[str, Any], eager: dict[str, Any] | None) -> None:
    if report.get("status") != "ok" or not eager or eager.get("status") != "ok":
        return
    pairs = zip(report["losses"], eager["losses"], strict=True)
    rel = [abs(a - e) / max(abs(e), 1e-12) for a, e in pairs]
    report["max_rel_loss_diff"] = max(rel)
    report["losses_match"] = all(r <= BF16_RTOL for r in rel)


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "| wrapper | backend | status | median step ms | x eager | first step s | "
        "peak GB | max rel. loss diff | losses ok | final loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, r in results.items():
        wrapper, backend = key.split("/")
        eager = results.get(f"{wrapper}/eager", {})
        ok = r.get("status") == "ok"
        speedup = ""
        if ok and eager.get("status") == "ok":
            speedup = f"{eager['median_step_ms'] / r['median_step_ms']:.2f}x"
        cells = [
            wrapper,
            backend,
            r.get("status", "not run")[:40],
            f"{r['median_step_ms']:.1f}" if ok else "",
            speedup,
            f"{r['first_step_s']:.1f}" if ok else "",
            f"{r['peak_gb']:.2f}" if ok else "",
            f"{r['max_rel_loss_diff']:.2e}" if "max_rel_loss_diff" in r else "",
            {True: "yes", False: "NO"}.get(r.get("losses_match"), ""),  # type: ignore[call-overload]
            f"{r['losses'][-1]:.4f}" if ok else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment(args: argparse.Namespace) -> dict[str, Any]:
    def commit() -> str:
        try:
            out = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True, cwd=Path(__file__).parent, timeout=10,
            )  # fmt: skip
            return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
    }
    if args.device == "cuda":
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and table")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (checks, CPU)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (GPUs) per configuration")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--backends", default="eager,inductor,ember")
    parser.add_argument("--wrappers", default="ddp,fsdp")
    parser.add_argument("--no-autocast", action="store_true", help="train in float32")
    parser.add_argument(
        "--timeout", type=float, default=170, help="seconds one configuration may take"
    )
    parser.add_argument(
        "--time-limit", type=float, default=510, help="seconds the whole run may take"
    )
    args = parser.parse_args(argv)
    args.size = "tiny" if args.tiny else "medium"
    if args.steps <= args.warmup:
        parser.error("--steps must be more than --warmup")
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        parser.error(f"{args.nproc} ranks need {args.nproc} GPUs; {torch.cuda.device_count()} seen")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    wrappers = [w.strip() for w in args.wrappers.split(",") if w.strip()]
    # Eager first (the reference), then ember, then the rest, each for every wrapper.
    order = sorted(backends, key=lambda b: {"eager": 0, "ember": 1}.get(b, 2))
    if args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.nproc))
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {f"{w}/{b}": {} for w in wrappers for b in backends}
    for backend in order:
        for wrapper in wrappers:
            key = f"{wrapper}/{backend}"
            left = args.time_limit - (time.perf_counter() - started)
            if left < 30:
                results[key] = {"status": "not run (time limit)"}
                continue
            print(f"[{time.perf_counter() - started:6.0f} s] {key} ...", flush=True)
            results[key] = run_configuration(args, wrapper, backend, min(args.timeout, left))
            if backend != "eager":
                compare_losses(results[key], results.get(f"{wrapper}/eager"))
            r = results[key]
            summary = r["status"] if r["status"] != "ok" else (
                f"median {r['median_step_ms']:.1f} ms, first step {r['first_step_s']:.1f} s, "
                f"loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
            )  # fmt: skip
            if "max_rel_loss_diff" in r:
                summary += f", max rel. loss diff vs eager {r['max_rel_loss_diff']:.2e}"
            print(f"[{time.perf_counter() - started:6.0f} s] {key}: {summary}", flush=True)
            if r.get("error"):
                print(f"    {r['error'][:600]}", flush=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    document = {"settings": settings, "environment": environment(args), "results": results}
    (args.out / "distributed.json").write_text(json.dumps(document, indent=2))
    layers, width, heads, vocab, seq = SIZES[args.size]
    heading = (
        f"GPT-2 ({layers} layers, width {width}, {heads} heads, vocabulary {vocab}, "
        f"{seq} tokens), {args.nproc} ranks on {args.device}, batch {args.batch} per rank, "
        f"{'fp32' if args.no_autocast else 'bf16 autocast'}, AdamW, {args.steps} steps "
        f"(median over steps {args.warmup + 1}-{args.steps}); cold compile caches; "
        f"torch {document['environment']['torch']}, commit {document['environment']['commit']}"
    )
    text = table(results, args)
    (args.out / "distributed.md").write_text(f"{heading}\n\n{text}\n")
    print(f"\n{heading}\n\n{text}", flush=True)


if __name__ == "__main__":
    main()
