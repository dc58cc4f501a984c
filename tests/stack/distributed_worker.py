"""One rank of the distributed tests in test_distributed.py, run as its own process.

    python distributed_worker.py CASE RANK WORLD_SIZE STORE_FILE OUT_DIR DEVICE

CASE is one of `CASES`. The rank joins its group through a file store (no port to
pick, so parallel runs cannot collide), runs the case twice from the same seed, once
eagerly and once compiled with backend="ember" (inside `no_eager_fallback()`), and
saves what the test compares into OUT_DIR/rank<RANK>.pt: per-step losses, the last
step's gradients and the final parameters, each gathered whole on every rank.

The process ends with `os._exit(0)` once the results are written: see `finish`.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember.runtime import compile_records  # importing it registers backend="ember"
from ember.runtime.config import config
from ember.runtime.models import TransformerBlock
from ember.runtime.testing import no_eager_fallback

VOCAB, SEQ, BATCH, STEPS = 128, 16, 2, 4
LM_DIM = 128  # 1.2 MB of parameters: two DDP buckets of the smallest size Dynamo allows
DIM, HEADS = 32, 4  # the tensor-parallel modules

Result = dict[str, Any]
Case = Callable[[int, torch.device, bool], Result]


class TinyLM(nn.Module):
    """Embedding, two pre-norm transformer blocks, a norm and a head; returns the
    mean cross-entropy of next tokens, so a training step is `model(ids, labels)`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, LM_DIM)
        blocks = (TransformerBlock(LM_DIM, HEADS, 2 * LM_DIM) for _ in range(2))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(LM_DIM)
        self.head = nn.Linear(LM_DIM, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


class FeedForward(nn.Module):
    """A transformer MLP: up-projection, GELU, down-projection."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.gelu(self.up(x)))
        return out


class Attention(nn.Module):
    """Pre-norm causal self-attention with a residual. The head count comes from the
    projections' width (`view(..., -1, head_dim)`), so under tensor parallelism each
    rank runs its own share of the heads."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.norm = nn.LayerNorm(DIM)
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm(x)
        q, k, v = (
            proj(h).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        attended = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        out: torch.Tensor = self.out(attended.transpose(1, 2).reshape(batch, seq, -1))
        return x + out


def whole(t: torch.Tensor) -> torch.Tensor:
    """A plain CPU copy of `t`, gathered whole when it is a DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone()


def named_state(model: nn.Module, *, grads: bool) -> dict[str, torch.Tensor]:
    """Parameters (or their gradients) by name, without the `_orig_mod.` that
    compiling a submodule adds, so eager and compiled runs line up."""
    state = {}
    for name, p in model.named_parameters():
        value = p.grad if grads else p
        if value is not None:
            state[name.replace("_orig_mod.", "")] = whole(value)
    return state


def lm_batches(rank: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own token batches (data parallelism splits the data)."""
    g = torch.Generator().manual_seed(1000 + rank)
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        batches.append((ids[:, :-1].to(device), ids[:, 1:].to(device)))
    return batches


def train(
    model: nn.Module,
    step: Callable[[Any], torch.Tensor],
    batches: list[Any],
    params: list[nn.Parameter],
) -> Result:
    # SGD with momentum: parameters stay as close as the gradients are. (AdamW divides
    # by each gradient's running RMS, which turns rounding in a gradient near zero
    # into a step of up to lr: the parameters would say little about the compiler.)
    optimizer = torch.optim.SGD(params, lr=0.2, momentum=0.9)
    losses, grads = [], {}
    for i, batch in enumerate(batches):
        loss = step(batch)
        loss.backward()  # type: ignore[no-untyped-call]
        losses.append(float(loss))
        if i == len(batches) - 1:
            grads = named_state(model, grads=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"losses": losses, "grads": grads, "params": named_state(model, grads=False)}


def ddp(rank: int, device: torch.device, compiled: bool) -> Result:
    """DistributedDataParallel around the whole model, the wrapper compiled: Dynamo's
    DDP support splits the graph at the gradient buckets (1 MiB, the least it allows,
    makes two) and ember compiles each piece."""
    torch.manual_seed(0)
    model = TinyLM().to(device)
    wrapped = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    run = torch.compile(wrapped, backend="ember") if compiled else wrapped
    return train(model, lambda b: run(*b), lm_batches(rank, device), list(model.parameters()))


def fsdp(rank: int, device: torch.device, compiled: bool) -> Result:
    """FSDP2 (`fully_shard`) per transformer block and at the root, each block
    compiled before it is sharded (as torchtitan does): the sharding hooks run
    eagerly around the compiled blocks, which see whole, gathered parameters."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLM().to(device)
    for i, block in enumerate(model.blocks):
        if compiled:
            model.blocks[i] = torch.compile(block, backend="ember", fullgraph=True)  # type: ignore[assignment]
        fully_shard(model.blocks[i])
    fully_shard(model)
    return train(model, lambda b: model(*b), lm_batches(rank, device), list(model.parameters()))


def tensor_parallel(module: type[nn.Module], plan: Callable[[], dict[str, Any]]) -> Case:
    """A case: `module` split across the ranks by `parallelize_module` (DTensor
    parameters), compiled whole with fullgraph=True, its collectives traced into the
    graph. Every rank feeds the same input; the outputs are replicated. Inference
    first, then two training steps."""

    def case(rank: int, device: torch.device, compiled: bool) -> Result:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        torch.manual_seed(0)
        model = module().to(device)
        reference = None
        if not compiled:  # the same module on one rank, for the test's sanity check
            reference = module().to(device)
            reference.load_state_dict(model.state_dict())
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        parallelize_module(model, mesh, plan())
        run = torch.compile(model, backend="ember", fullgraph=True) if compiled else model
        g = torch.Generator().manual_seed(7)
        inputs = [torch.randn(BATCH, SEQ, DIM, generator=g).to(device) for _ in range(2)]
        with torch.no_grad():
            inference = whole(run(inputs[0]))
            unsplit = None if reference is None else whole(reference(inputs[0]))
        result = train(model, lambda x: run(x).square().mean(), inputs, list(model.parameters()))
        return {**result, "inference": inference, "unsplit": unsplit}

    return case


def overlap(rank: int, device: torch.device, compiled: bool) -> Result:
    """A functional all-reduce, waited for at once as eager code would, then compute
    that does not need its result: compiled, the wait moves below that compute
    (ember.scheduler.collectives). Returns the outputs and, compiled, the schedule."""
    c10d = torch.ops._c10d_functional
    group = dist.group.WORLD.group_name  # type: ignore[union-attr]

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", group))
        independent = torch.relu(y @ y.t()).sum(0)
        return reduced + 1, independent

    g = torch.Generator().manual_seed(rank)  # each rank its own x: the sum is not 2x
    x, y = (torch.randn(*size, generator=g).to(device) for size in ((8, 8), (16, 16)))
    if not compiled:
        return {"outputs": [whole(t) for t in step(x, y)]}
    with tempfile.TemporaryDirectory() as debug, config.scope(debug_dir=debug):
        outputs = torch.compile(step, backend="ember", fullgraph=True)(x, y)
        schedules = [(Path(r.debug_dir) / "schedule.txt").read_text()
                     for r in compile_records if r.debug_dir is not None]  # fmt: skip
    return {"outputs": [whole(t) for t in outputs], "schedule": schedules[-1]}


def mlp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def attention_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "out": RowwiseParallel()}  # fmt: skip


CASES: dict[str, Case] = {
    "ddp": ddp,
    "fsdp": fsdp,
    "tp_mlp": tensor_parallel(FeedForward, mlp_plan),
    "tp_attention": tensor_parallel(Attention, attention_plan),
    "overlap": overlap,
}


def finish(code: int) -> None:
    """End the process without the interpreter's shutdown, the results being written.

    With gloo, an interpreter exit after `destroy_process_group` aborts now and then
    ("terminate called without an active exception"). The cause is in torch, not in
    ember's kernels: every backward stashes a `contextvars.Context` in the thread-local
    state (`torch.autograd.graph._engine_run_backward`), and each collective that DDP
    issues from a backward hook copies that state into its gloo work. A gloo worker
    thread marks a work done before it drops its own reference, so it can hold the
    last one while the main thread is already in `Py_FinalizeEx`: the DDP module, alive
    until then, keeps the process group and its threads (its reducer holds the group,
    so `destroy_process_group` cannot join them). Dropping the work decrefs the
    Context; taking the GIL in a finalizing interpreter makes the thread call
    `pthread_exit`, and that unwind through the work's noexcept destructor is
    `std::terminate` (the core dump's stack: ProcessGroupGloo::runLoop ->
    ~AsyncWork -> ~ThreadLocalState -> SafePyObject decref -> take_gil ->
    pthread_exit). Ember's OpenMP threads, spinning after each parallel kernel, only
    widen the window on a machine with few cores. Measured with a one-rank DDP
    script, fresh caches, 2 cores: 6 aborts in 30 runs; none in 30 with the stash
    replaced by a no-op; none in 30 with the DDP module deleted and collected before
    `destroy_process_group` (the fix for a program that must exit normally)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    case, rank, world, store, out, device_type = argv
    rank_index, world_size = int(rank), int(world)
    device = torch.device(device_type)
    if device.type == "cuda":
        device = torch.device("cuda", rank_index)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank_index, world_size=world_size
    )
    results: Result = {"compile_workers": config.compile_workers}
    results["eager"] = CASES[case](rank_index, device, False)
    torch._dynamo.reset()
    with no_eager_fallback() as graphs:
        results["ember"] = CASES[case](rank_index, device, True)
    results["graphs"] = [g.graph for g in graphs]
    torch.save(results, Path(out) / f"rank{rank_index}.pt")
    dist.barrier()
    dist.destroy_process_group()
    finish(0)


if __name__ == "__main__":
    main(sys.argv[1:])
