"""The pass manager: runs a named pipeline, lints, times and dumps.

After each pass it lints the graph (torch.fx's structural checks), so a pass that
breaks the graph is named at once instead of surfacing as a strange error in lowering.
It records time and node counts per pass for the debug log and the benchmarks, and,
given a directory, writes the graph before and after each pass as readable text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch.fx

from ember.graphpasses.cleanup import eliminate_dead_code
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.passes import GraphPass


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: its name, whether it changed the graph, time, node counts."""

    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int


@dataclass
class PassReport:
    """The records of one pipeline run, in order."""

    pipeline: str
    records: list[PassRecord] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def format(self) -> str:
        lines = [f"pipeline {self.pipeline}: {self.total_seconds * 1e3:.2f} ms"]
        for r in self.records:
            mark = "changed" if r.changed else "-"
            lines.append(
                f"  {r.name:<32} {r.seconds * 1e3:8.2f} ms  "
                f"{r.nodes_before:5d} -> {r.nodes_after:<5d} {mark}"
            )
        return "\n".join(lines)


class PassManager:
    """Run `passes` in order over a graph module.

    `dump_dir`: when given, the graph is written there before the first pass and after
    every pass that changed it (`NN_<pass>.txt`), as FX's readable code.
    """

    def __init__(
        self,
        passes: Sequence[GraphPass],
        *,
        name: str = "pipeline",
        lint: bool = True,
        dump_dir: Path | str | None = None,
    ) -> None:
        self.passes = list(passes)
        self.name = name
        self.lint = lint
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None

    def run(self, gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, PassReport]:
        report = PassReport(self.name)
        self._dump(gm, 0, "input")
        for index, graph_pass in enumerate(self.passes, start=1):
            before = len(gm.graph.nodes)
            start = time.perf_counter()
            try:
                result = graph_pass(gm)
            except GraphPassError:
                raise
            except Exception as exc:
                raise GraphPassError(graph_pass.name, f"{type(exc).__name__}: {exc}") from exc
            seconds = time.perf_counter() - start
            gm = result.graph_module
            if self.lint:
                self._lint(graph_pass.name, gm)
            report.records.append(
                PassRecord(graph_pass.name, result.changed, seconds, before, len(gm.graph.nodes))
            )
            if result.changed:
                self._dump(gm, index, graph_pass.name)
        return gm, report

    @staticmethod
    def _lint(pass_name: str, gm: torch.fx.GraphModule) -> None:
        try:
            gm.graph.lint()
        except Exception as exc:
            raise GraphPassError(pass_name, f"left a malformed graph: {exc}") from exc
        outputs = [n for n in gm.graph.nodes if n.op == "output"]
        if len(outputs) != 1:
            raise GraphPassError(pass_name, f"graph has {len(outputs)} output nodes, expected 1")

    def _dump(self, gm: torch.fx.GraphModule, index: int, label: str) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        text = gm.print_readable(print_output=False)
        (self.dump_dir / f"{index:02d}_{label}.txt").write_text(text)


def default_pipeline(*, dump_dir: Path | str | None = None) -> PassManager:
    """The passes the runtime runs on every graph before lowering."""
    return PassManager([eliminate_dead_code], name="default", dump_dir=dump_dir)
