"""Errors raised by graph passes: each names the pass and, where known, the node."""

from __future__ import annotations

import torch.fx


class GraphPassError(RuntimeError):
    """A pass failed or left the graph broken.

    The message always names the pass, and the node when one is to blame, so a user
    can find it in the dumped graph (see `PassManager(dump_dir=...)`).
    """

    def __init__(self, pass_name: str, message: str, node: torch.fx.Node | None = None) -> None:
        where = f" at node {node.name!r} ({node.op} {node.target})" if node is not None else ""
        super().__init__(f"graph pass {pass_name!r}{where}: {message}")
        self.pass_name = pass_name
        self.node_name = node.name if node is not None else None
