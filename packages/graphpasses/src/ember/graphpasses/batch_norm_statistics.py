"""Batch norm's backward in training takes no running statistics.

`aten.native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
save_mean, save_invstd, train, eps, output_mask)` reads the running statistics only in
eval mode; in training it uses the batch statistics the forward saved. Yet the joint
graph AOTAutograd traces passes the running statistics (their updated values, in fact)
to every training-mode call, so the forward/backward partitioner keeps two per-channel
tensors per batch norm alive from the forward to the backward for nothing.

Each value kept is a forward output the runtime hands over and autograd saves and
unpacks on every step: MobileNetV3's training forward returned 437 values, 92 of
them these (46 batch norms), and at its batch size the step's host time (about a
microsecond or more per value at each of those stages) is what bounds it on a GPU.
Passing None in their place, as a batch norm without running statistics
(`track_running_stats=False`) does, gives the same gradients: eager's CPU and CUDA
kernels and ember's lowering (ember.ir.norms) ignore them in training.

Run it on a joint graph before the partitioner. It only rewrites arguments: the nodes
that computed the statistics stay for their other users (the in-place updates of the
buffers), and the partitioner keeps for the backward only what the backward reads.
"""

from __future__ import annotations

import torch
import torch.fx

_BACKWARD = torch.ops.aten.native_batch_norm_backward.default
_RUNNING_MEAN, _RUNNING_VAR, _TRAIN = 3, 4, 7


def drop_training_running_statistics(gm: torch.fx.GraphModule) -> int:
    """Replace the running statistics of every training-mode
    `native_batch_norm_backward` in `gm` with None; returns how many calls changed.
    Calls whose mode is not a literal True (eval, or a mode that is a graph value)
    keep theirs: eval mode reads them."""
    changed = 0
    for node in gm.graph.find_nodes(op="call_function", target=_BACKWARD):
        args = list(node.args)
        if len(args) <= _TRAIN or args[_TRAIN] is not True or node.kwargs:
            continue
        if args[_RUNNING_MEAN] is None and args[_RUNNING_VAR] is None:
            continue
        args[_RUNNING_MEAN] = args[_RUNNING_VAR] = None
        node.args = tuple(args)
        changed += 1
    if changed:
        gm.recompile()
    return changed
