"""The pass manager: runs a named pipeline, checks, times and dumps.

Before the first pass it checks that the input is an ATen-level graph. After each pass
it lints the graph (FX's structural checks plus ember's), checks that nodes the pass
created carry `meta['val']` when the graph has fake values, and in checking mode
verifies the pass's declared promises and the graph's values on sample inputs
(`ember.graphpasses.checking`). It records time, node counts and the pass's own
counters per pass for the debug log and the benchmarks, and, given a directory, writes
the graph before the first pass and after every pass that changed it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.fx

from ember.graphpasses.checking import (
    GraphSnapshot,
    ValueChecker,
    check_declared_preserves,
    checks_values,
)
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.fake import has_fake_values
from ember.graphpasses.graph_checks import (
    check_aten_level,
    check_values_present,
    check_well_formed,
)
from ember.graphpasses.passes import GraphPass


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: name, whether it changed the graph, time, node counts, stats."""

    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class PassReport:
    """The records of one pipeline run, in order."""

    pipeline: str
    records: list[PassRecord] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def stats(self, pass_name: str) -> dict[str, int]:
        """The counters of the named pass, summed over its runs in the pipeline."""
        total: dict[str, int] = {}
        for record in self.records:
            if record.name == pass_name:
                for key, value in record.stats.items():
                    total[key] = total.get(key, 0) + value
        return total

    def format(self) -> str:
        lines = [f"pipeline {self.pipeline}: {self.total_seconds * 1e3:.2f} ms"]
        for r in self.records:
            mark = "changed" if r.changed else "-"
            counters = ", ".join(f"{k}={v}" for k, v in r.stats.items() if v)
            lines.append(
                f"  {r.name:<32} {r.seconds * 1e3:8.2f} ms  "
                f"{r.nodes_before:5d} -> {r.nodes_after:<5d} {mark:<7} {counters}".rstrip()
            )
        return "\n".join(lines)


class PassManager:
    """Run `passes` in order over a graph module.

    `dump_dir`: when given, the graph is written there before the first pass and after
    every pass that changed it (`NN_<pass>.txt`), as FX's readable code, and the report
    as `report.txt` at the end.
    `check`: verify each pass's declared promises after it runs; with `sample_inputs`
    (the graph's placeholders, in order) also run the graph after each value-preserving
    pass and compare with the input graph's results.
    `require_aten`: reject graphs that are not at the ATen level before the first pass.
    """

    def __init__(
        self,
        passes: Sequence[GraphPass],
        *,
        name: str = "pipeline",
        lint: bool = True,
        dump_dir: Path | str | None = None,
        check: bool = False,
        sample_inputs: Sequence[Any] | None = None,
        rtol: float = 1e-4,
        atol: float = 1e-5,
        require_aten: bool = True,
    ) -> None:
        self.passes = list(passes)
        self.name = name
        self.lint = lint
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.check = check or sample_inputs is not None
        self.sample_inputs = list(sample_inputs) if sample_inputs is not None else None
        self.rtol = rtol
        self.atol = atol
        self.require_aten = require_aten

    def run(self, gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, PassReport]:
        report = PassReport(self.name)
        if self.require_aten:
            check_aten_level(gm, f"{self.name}: input check")
        checker = None
        if self.sample_inputs is not None:
            checker = ValueChecker(self.sample_inputs, rtol=self.rtol, atol=self.atol)
            checker.record(gm)
        self._dump(gm, 0, "input")
        # Without a value checker nothing runs the module between passes, so each
        # pass's regeneration of its Python code is put off to one at the end: 0.07 s a
        # time for resnet50's training graph, about four times per graph.
        deferred: list[torch.fx.GraphModule] = []
        try:
            gm = self._run_passes(gm, report, checker, deferred if checker is None else None)
        finally:
            for module in deferred:
                del module.recompile
        if deferred and any(record.changed for record in report.records):
            gm.recompile()
        if self.dump_dir is not None:
            (self.dump_dir / "report.txt").write_text(report.format() + "\n")
        return gm, report

    def _run_passes(
        self,
        gm: torch.fx.GraphModule,
        report: PassReport,
        checker: ValueChecker | None,
        deferred: list[torch.fx.GraphModule] | None,
    ) -> torch.fx.GraphModule:
        for index, graph_pass in enumerate(self.passes, start=1):
            if deferred is not None and gm not in deferred:
                gm.recompile = _no_recompile  # type: ignore[method-assign,assignment]  # restored by run
                deferred.append(gm)
            before_nodes = set(gm.graph.nodes)
            snapshot = GraphSnapshot.of(gm) if self.check else None
            had_values = has_fake_values(gm)
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
                check_well_formed(graph_pass.name, gm)
                if had_values and result.changed:
                    check_values_present(graph_pass.name, gm, before_nodes)
            if snapshot is not None:
                check_declared_preserves(graph_pass, snapshot, gm)
            if checker is not None and result.changed and checks_values(graph_pass):
                checker.verify(graph_pass.name, gm)
            report.records.append(
                PassRecord(
                    graph_pass.name,
                    result.changed,
                    seconds,
                    len(before_nodes),
                    len(gm.graph.nodes),
                    dict(result.stats),
                )
            )
            if result.changed:
                self._dump(gm, index, graph_pass.name)
        return gm

    def _dump(self, gm: torch.fx.GraphModule, index: int, label: str) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
        (self.dump_dir / f"{index:02d}_{label}.txt").write_text(text)


def _no_recompile() -> None:
    """Stands in for `GraphModule.recompile` while a pipeline runs (see `run`)."""
