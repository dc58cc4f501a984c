"""Distributed training with backend="ember": DDP, FSDP2 and tensor parallelism on two
ranks, each compared step by step with the same wrapper run eagerly.

Each test starts two processes running `distributed_worker.py` (one per rank; they meet
through a file store in the test's temporary directory, so no port is chosen and runs
in parallel cannot collide), gloo on the CPU or NCCL on two GPUs (`cuda` tests). Every
rank runs its case eagerly and compiled, from the same seed and data, with
EMBER_STRICT=1 and inside `no_eager_fallback()`: a graph that ember failed to compile
fails the test instead of running eagerly. The test compares each rank's losses, last
gradients and final parameters (DTensors gathered whole) between the two runs.

The workers end with `os._exit(0)` after writing their results: an interpreter exit
after `destroy_process_group` aborts now and then with gloo, in about a fifth of runs
here (a race in torch at shutdown between a gloo thread and the finalizing interpreter,
made likelier by ember's OpenMP kernels on few cores; `distributed_worker.finish` gives
the cause and the numbers). The tests check values, so a worker stops once its results
are written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

WORKER = Path(__file__).with_name("distributed_worker.py")
WORLD = 2
TIMEOUT_S = 240
# The accuracy rule's float32 tolerance (ember.runtime.accuracy) on the CPU. On GPUs,
# ember's Triton reductions sum in another order than ATen's kernels, and a few steps
# of training carry the differences into everything after them.
CPU_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
CUDA_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}


def launch(case: str, tmp_path: Path, device: str) -> list[dict[str, Any]]:
    """Run `case` on WORLD ranks and return each rank's results."""
    out = tmp_path / "out"
    out.mkdir()
    env = dict(
        os.environ,
        EMBER_STRICT="1",
        EMBER_CACHE_DIR=str(tmp_path / "cache"),
        LOCAL_WORLD_SIZE=str(WORLD),
        # One OpenMP thread per rank and core, as torchrun would give them.
        OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // WORLD)),
    )
    if sys.platform == "linux" and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: the host name may not resolve
    procs = []
    for rank in range(WORLD):
        argv = [case, str(rank), str(WORLD), str(tmp_path / "store"), str(out), device]
        with (tmp_path / f"rank{rank}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), *argv], env=env, stdout=log, stderr=log
                )
            )
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "\n".join(
        f"--- rank {r} ---\n" + (tmp_path / f"rank{r}.log").read_text()[-3000:]
        for r in range(WORLD)
    )
    assert codes is not None, f"{case} did not finish in {TIMEOUT_S} s\n{logs}"
    assert codes == [0] * WORLD, f"{case} exited with {codes}\n{logs}"
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def assert_close(actual: Any, expected: Any, tol: dict[str, float], what: str) -> None:
    rtol, atol = tol["rtol"], tol["atol"]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_same_run(
    actual: dict[str, Any], expected: dict[str, Any], tol: dict[str, float], what: str
) -> None:
    """Per-step losses, the last step's gradients and the final parameters."""
    losses = torch.tensor(actual["losses"]), torch.tensor(expected["losses"])
    assert_close(*losses, tol, f"{what}: losses")
    for key in ("grads", "params"):
        assert actual[key].keys() == expected[key].keys(), f"{what}: {key} names"
        for name, value in expected[key].items():
            assert_close(actual[key][name], value, tol, f"{what}: {key} {name}")


def check_data_parallel(case: str, tmp_path: Path, device: str, tol: dict[str, float]) -> None:
    ranks = launch(case, tmp_path, device)
    for rank, result in enumerate(ranks):
        assert_same_run(result["ember"], result["eager"], tol, f"{case} rank {rank}")
        names = result["graphs"]
        assert any(g.startswith("backward") for g in names), names
        if case == "ddp":  # one graph per gradient bucket
            assert sum(g.startswith("forward") for g in names) >= 2, names
    # Compile workers share the cores among the local ranks (LOCAL_WORLD_SIZE, as
    # torchrun sets it): one per core but one per rank, 16 at most.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    shared = max(0, min(16, ((cores or 1) - WORLD) // WORLD))
    assert [r["compile_workers"] for r in ranks] == [shared] * WORLD
    # The ranks saw different data but keep one model: the same parameters everywhere.
    assert ranks[0]["eager"]["losses"] != ranks[1]["eager"]["losses"]
    for name, value in ranks[0]["ember"]["params"].items():
        torch.testing.assert_close(ranks[1]["ember"]["params"][name], value, rtol=0, atol=0)


def check_tensor_parallel(case: str, tmp_path: Path, device: str, tol: dict[str, float]) -> None:
    ranks = launch(case, tmp_path, device)
    for rank, result in enumerate(ranks):
        eager, ember = result["eager"], result["ember"]
        what = f"{case} rank {rank}"
        # The split module computes what the whole one does (a check of the setup).
        assert_close(eager["inference"], eager["unsplit"], tol, f"{what}: unsplit")
        assert_close(ember["inference"], eager["inference"], tol, f"{what}: inference")
        assert_same_run(ember, eager, tol, what)
        names = result["graphs"]
        assert any(g.startswith("inference") for g in names), names
        assert any(g.startswith("backward") for g in names), names
    # Replicated outputs: every rank holds the same values.
    torch.testing.assert_close(ranks[1]["ember"]["inference"], ranks[0]["ember"]["inference"])
    assert ranks[1]["ember"]["losses"] == ranks[0]["ember"]["losses"]


@pytest.mark.parametrize("case", ["ddp", "fsdp"])
def test_data_parallel_training_on_cpu(case: str, tmp_path: Path) -> None:
    check_data_parallel(case, tmp_path, "cpu", CPU_TOLERANCE)


@pytest.mark.parametrize("case", ["tp_mlp", "tp_attention"])
def test_tensor_parallel_on_cpu(case: str, tmp_path: Path) -> None:
    check_tensor_parallel(case, tmp_path, "cpu", CPU_TOLERANCE)


def test_compiled_all_reduce_overlaps_independent_compute(tmp_path: Path) -> None:
    """Two gloo ranks compile a functional all-reduce that eager code waits for at once,
    then a matmul that does not need it: ember's schedule issues the all-reduce, runs
    the matmul and its kernel, and only then waits; the values are eager's."""
    ranks = launch("overlap", tmp_path, "cpu")
    for rank, result in enumerate(ranks):
        pairs = zip(result["ember"]["outputs"], result["eager"]["outputs"], strict=True)
        for actual, expected in pairs:
            assert_close(actual, expected, CPU_TOLERANCE, f"overlap rank {rank}")
        # The dump: the program, then "schedule <graph>:" and one line per step.
        steps = result["ember"]["schedule"].split("\nschedule ")[1]
        issue = steps.index("= _c10d_functional.all_reduce")
        wait = steps.index("= _c10d_functional.wait_tensor")
        assert issue < steps.index("= aten.mm") < wait, steps
        assert issue < steps.index("kernel k", issue) < wait, steps
    sums = [r["ember"]["outputs"][0] for r in ranks]
    torch.testing.assert_close(sums[0], sums[1])  # the all-reduce ran across both ranks


def two_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= WORLD


needs_two_gpus = pytest.mark.skipif(
    not two_gpus(), reason=f"NCCL tests need {WORLD} CUDA GPUs visible to torch"
)


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.parametrize("case", ["ddp", "fsdp"])
def test_data_parallel_training_with_nccl(case: str, tmp_path: Path) -> None:
    check_data_parallel(case, tmp_path, "cuda", CUDA_TOLERANCE)


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.parametrize("case", ["tp_mlp", "tp_attention"])
def test_tensor_parallel_with_nccl(case: str, tmp_path: Path) -> None:
    check_tensor_parallel(case, tmp_path, "cuda", CUDA_TOLERANCE)
