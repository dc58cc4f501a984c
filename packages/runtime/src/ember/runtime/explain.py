"""`ember explain DIR`: each kernel and ATen call of each compiled graph, the FX nodes it
came from, the bytes it must move, and (profiled) its time and distance from its roof.

What it reads, from a debug directory (`EMBER_DEBUG_DIR`, ember.runtime.debug):
`explain.json`, written per graph at compile time from its schedule
(`schedule_summary`), and `profile.json`, written at exit when `EMBER_PROFILE=1` timed
the graph's steps (ember.runtime.profiling). `explain(DIR)` returns the rows
(`GraphExplanation`s); `ember explain DIR` prints them as tables.

Per step (a generated kernel, or an ATen call that runs device code):
- `fx_nodes`: the FX nodes of the graph ember compiled whose computation the step
  holds (provenance, ember.scheduler's `origins`).
- `bytes`: the floor of its memory traffic: each buffer it reads read once, each it
  writes written once (for a kernel, ember.scheduler.kernel_bytes). What the
  kernel really moves can be more (a reduction that re-reads its row in a later pass
  from memory rather than cache), which only hardware counters would show.
- `unfused_bytes`: for a kernel, what the buffers it computes would move as one
  kernel each; the difference is what fusing saved.
- `flops`: for matmuls, batched matmuls, attention and convolutions, the
  multiply-adds x 2 of the call (others: none).
- profiled: `ms` (median over the timed calls), `bandwidth` (bytes / time), and
  `roof`: the fraction of its roof the step reaches, the least time its bytes and
  FLOPs allow on this machine (bytes / measured copy bandwidth, FLOPs / measured
  matmul rate, whichever is longer) over its time: 1.0 runs at the roof.
Sizes are a graph's static sizes: a step whose buffers have symbolic sizes gets no
byte counts (they would be guesses).

And per pair of adjacent steps that run device code and are not one kernel, why:
an ATen call is never fused; two kernels carry the scheduler's reason
(`Schedule.fusion_notes`), or share no buffer (fusing would save nothing).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sympy
import torch

from ember.ir import BufferRef, ExternKernel, Layout, iter_refs
from ember.runtime.profiling import PROFILE_FILE, bandwidth_for
from ember.scheduler import (
    ExternCall,
    KernelStep,
    Schedule,
    computed_bytes,
    is_static,
    kernel_bytes,
)

EXPLAIN_FILE = "explain.json"


# -- at compile time: the schedule's rows --------------------------------------------


def _layouts(schedule: Schedule) -> dict[str, Layout]:
    program = schedule.program
    found: dict[str, Layout] = {}
    for node in [*program.inputs, *program.constants, *program.nodes]:
        if isinstance(node, ExternKernel) and node.multi:
            continue
        layout = getattr(node, "layout", None)
        if isinstance(layout, Layout):
            found[node.name] = layout
    return found


def _touched_bytes(layout: Layout) -> int | None:
    """Bytes of the distinct elements a layout covers (a broadcast dimension, stride 0,
    counted once); None for symbolic sizes."""
    count = 1
    for size, stride in zip(layout.size, layout.stride, strict=True):
        if not isinstance(size, sympy.Integer) or not isinstance(stride, sympy.Integer):
            return None
        if stride != 0:
            count *= int(size)
    return count * layout.dtype.itemsize


def _sizes(layouts: dict[str, Layout], arg: Any) -> tuple[int, ...] | None:
    if not isinstance(arg, BufferRef) or arg.name not in layouts:
        return None
    size = layouts[arg.name].size
    return tuple(int(s) for s in size) if all(isinstance(s, sympy.Integer) for s in size) else None


def extern_flops(node: ExternKernel, layouts: dict[str, Layout]) -> int | None:
    """2 x the multiply-adds of a matmul, batched matmul, attention or convolution
    call; None for other ops, backward ops and symbolic sizes."""
    name = node.op.overloadpacket.__name__
    args = node.args
    if name in ("mm", "bmm", "addmm", "baddbmm"):
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        sa, sb = _sizes(layouts, a), _sizes(layouts, b)
        if sa is None or sb is None:
            return None
        return 2 * math.prod(sa) * sb[-1]
    if name.startswith("_scaled_dot_product") and "backward" not in name:
        q, k, v = (_sizes(layouts, x) for x in args[:3])
        if q is None or k is None or v is None or len(q) < 2:
            return None
        batch = math.prod(q[:-2])
        return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])
    if name == "convolution" and len(args) >= 7 and args[6] is False:
        weight = _sizes(layouts, args[1])
        out = node.outputs[0]
        if weight is None or out is None or not all(isinstance(s, sympy.Integer) for s in out.size):
            return None
        return 2 * math.prod(int(s) for s in out.size) * math.prod(weight[1:])
    return None


def _extern_bytes(node: ExternKernel, layouts: dict[str, Layout]) -> int | None:
    total = 0
    names = dict.fromkeys(ref.name for ref in iter_refs((node.args, node.kwargs)))
    for layout in [*(layouts.get(n) for n in names), *node.outputs]:
        if layout is None:
            continue
        size = _touched_bytes(layout)
        if size is None:
            return None
        total += size
    return total


def _kernel_op(kernel: Any) -> str:
    ranges = ", ".join(str(r) for r in kernel.ranges)
    if kernel.reduction_ranges:
        inner = ", ".join(str(r) for r in kernel.reduction_ranges)
        return f"reduction [{ranges}] over [{inner}]"
    return f"{'scatter' if kernel.is_scatter else 'pointwise'} [{ranges}]"


def matmul_dtypes(schedule: Schedule) -> tuple[torch.dtype, ...]:
    """The dtypes of the schedule's calls that `extern_flops` counts (their roofs)."""
    layouts = _layouts(schedule)
    found: dict[torch.dtype, None] = {}
    for step in schedule.steps:
        if isinstance(step, ExternCall) and extern_flops(step.node, layouts) is not None:
            out = step.node.outputs[0]
            if out is not None:
                found[out.dtype] = None
    return tuple(found)


def schedule_summary(schedule: Schedule) -> dict[str, Any]:
    """What `explain.json` holds for one graph: a row per step and why adjacent steps
    are not one kernel."""
    program = schedule.program
    layouts = _layouts(schedule)
    rows: list[dict[str, Any]] = []
    for index, step in enumerate(schedule.steps):
        row: dict[str, Any] = {"step": index, "name": step.name, "fx_nodes": list(step.origins)}
        if isinstance(step, KernelStep):
            kernel = step.kernel
            static = is_static(kernel, program)
            row |= {
                "kind": "kernel",
                "op": _kernel_op(kernel),
                "device": str(kernel.device),
                "bytes": kernel_bytes(kernel, program) if static else None,
                "unfused_bytes": computed_bytes(kernel, program) if static else None,
                "flops": None,
                "dtype": str(kernel.members[0].dtype).removeprefix("torch."),
            }
        elif isinstance(step, ExternCall):
            node = step.node
            first = next((o for o in node.outputs if o is not None), None)
            moves = not node.is_view
            row |= {
                "kind": "extern" if moves else "view",
                "op": str(node.op),
                "device": str(first.device) if first is not None else "cpu",
                "bytes": _extern_bytes(node, layouts) if moves else 0,
                "unfused_bytes": None,
                "flops": extern_flops(node, layouts),
                "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "",
            }
        else:
            row |= {"kind": "select", "op": "tuple item", "device": "", "bytes": 0}
            row |= {"unfused_bytes": None, "flops": None, "dtype": ""}
        rows.append(row)
    return {"graph": program.name, "steps": rows, "not_fused": _not_fused(schedule)}


def _not_fused(schedule: Schedule) -> list[dict[str, str]]:
    """For each pair of adjacent steps that run device code, why they are two."""
    notes: dict[tuple[str, str], str] = {
        (n.other, n.kernel): n.reason for n in schedule.fusion_notes if n.other
    }
    alone = {n.kernel: n.reason for n in schedule.fusion_notes if not n.other}
    running = [s for s in schedule.steps if s.launches_kernel]
    pairs: list[dict[str, str]] = []
    for first, second in itertools.pairwise(running):
        if isinstance(first, ExternCall) or isinstance(second, ExternCall):
            call = first if isinstance(first, ExternCall) else second
            assert isinstance(call, ExternCall)
            reason = f"{call.name} is an ATen call ({call.node.op}), which ember does not fuse"
        elif second.name in alone or first.name in alone:
            reason = alone.get(second.name) or alone[first.name]
        else:
            reason = notes.get(
                (first.name, second.name),
                "the second kernel's first buffer reads nothing the first computes or "
                "loads: fusing would save no memory traffic",
            )
        pairs.append({"first": first.name, "second": second.name, "reason": reason})
    return pairs


# -- reading a debug directory ----------------------------------------------------------


@dataclass
class ExplainRow:
    """One step of a compiled graph (see the module's docstring)."""

    step: int
    name: str
    kind: str  # kernel, extern, view, select
    op: str
    fx_nodes: list[str]
    device: str
    dtype: str
    bytes: int | None
    unfused_bytes: int | None
    flops: int | None
    ms: float | None = None
    bandwidth_bytes_s: float | None = None
    roof: float | None = None


@dataclass
class NotFused:
    first: str
    second: str
    reason: str


@dataclass
class GraphExplanation:
    graph: str
    directory: Path
    rows: list[ExplainRow]
    not_fused: list[NotFused]
    profiled_calls: int = 0
    call_ms: float | None = None
    roofs: dict[str, Any] = field(default_factory=dict)


def graph_directories(directory: Path) -> list[Path]:
    """The graph directories under `directory`: itself (one graph's), its
    subdirectories (one run's), or, for an EMBER_DEBUG_DIR root, the latest run's."""
    directory = Path(directory)
    if (directory / EXPLAIN_FILE).is_file():
        return [directory]
    found = sorted(p.parent for p in directory.glob(f"*/{EXPLAIN_FILE}"))
    if found:
        return sorted(found, key=_graph_order)
    latest = directory / "LATEST"
    if latest.is_file():
        return graph_directories(directory / latest.read_text().strip())
    runs = sorted(directory.glob("run-*"))
    return graph_directories(runs[-1]) if runs else []


def _graph_order(path: Path) -> tuple[int, str]:
    """Graphs in the order they compiled (the number after the last underscore)."""
    head, _, number = path.name.rpartition("_")
    return (int(number), head) if number.isdigit() else (1 << 30, path.name)


def explain(directory: Path | str) -> list[GraphExplanation]:
    """The rows of every graph under `directory` (see `graph_directories`)."""
    return [explain_graph(d) for d in graph_directories(Path(directory))]


def explain_graph(directory: Path) -> GraphExplanation:
    summary = json.loads((directory / EXPLAIN_FILE).read_text())
    profile: dict[str, Any] = {}
    if (directory / PROFILE_FILE).is_file():
        profile = json.loads((directory / PROFILE_FILE).read_text())
    roofs = profile.get("roofs", {})
    times = profile.get("steps", {})
    rows = []
    for raw in summary["steps"]:
        row = ExplainRow(**raw)
        ms = times.get(row.name, {}).get("median_ms")
        if ms:
            row.ms = ms
            if row.bytes is not None:
                row.bandwidth_bytes_s = row.bytes / (ms / 1e3)
            row.roof = _roof(row, roofs, ms)
        rows.append(row)
    explanation = GraphExplanation(
        summary["graph"], directory, rows, [NotFused(**n) for n in summary["not_fused"]]
    )
    explanation.profiled_calls = int(profile.get("timed_calls", 0))
    explanation.call_ms = profile.get("call", {}).get("median_ms")
    explanation.roofs = roofs
    return explanation


def _roof(row: ExplainRow, roofs: dict[str, Any], ms: float) -> float | None:
    """The least time the row's bytes and FLOPs allow, over its time."""
    bound = []
    bandwidth = bandwidth_for(roofs, row.bytes) if row.bytes is not None else None
    if row.bytes is not None and bandwidth:
        bound.append(row.bytes / bandwidth)
    rate = roofs.get("matmul_flop_s", {}).get(row.dtype)
    if row.flops is not None and rate:
        bound.append(row.flops / rate)
    return max(bound) / (ms / 1e3) if bound else None


# -- printing ---------------------------------------------------------------------------


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


def format_explanations(explanations: Sequence[GraphExplanation], width: int = 160) -> str:
    """The tables `ember explain` prints, as plain text."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    print_explanations(explanations, console)
    return console.export_text()


def _short_op(row: ExplainRow) -> str:
    if row.kind == "kernel":
        return row.op.replace("reduction", "red").replace("pointwise", "pw")
    return row.op.removeprefix("aten.").removesuffix(".default")


def print_explanations(explanations: Sequence[GraphExplanation], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:  # piped: wide enough for the FX node lists (COLUMNS sets it)
        tty = sys.stdout.isatty()
        console = Console(width=None if tty else shutil.get_terminal_size((200, 24)).columns)
    if not explanations:
        console.print("no compiled graphs here (compile with EMBER_DEBUG_DIR set)")
    for graph in explanations:
        timed = any(r.ms is not None for r in graph.rows)
        title = f"{graph.graph}  ({graph.directory})"
        if timed and graph.call_ms is not None:
            title += f"\nprofiled: median {graph.call_ms:.3f} ms per call over "
            title += f"{graph.profiled_calls} calls"
            bandwidth = graph.roofs.get("bandwidth_bytes_s")
            if bandwidth:
                title += f"; roofs: copies up to {_peak_copy(graph.roofs) / 1e9:.0f} GB/s "
                title += f"(in cache), {bandwidth / 1e9:.1f} GB/s (memory)"
            for dtype, rate in graph.roofs.get("matmul_flop_s", {}).items():
                title += f", {dtype} matmul {rate / 1e9:.0f} GFLOP/s"
        table = Table(title=title, title_justify="left", show_lines=False)
        table.add_column("#", justify="right")
        table.add_column("kernel / call")
        table.add_column("what")
        table.add_column("FX nodes", overflow="fold")
        table.add_column("floor MB", justify="right")
        table.add_column("unfused MB", justify="right")
        table.add_column("GFLOP", justify="right")
        if timed:
            table.add_column("ms", justify="right")
            table.add_column("GB/s", justify="right")
            table.add_column("of roof", justify="right")
        for row in graph.rows:
            if row.kind in ("view", "select"):
                continue  # no device code: nothing to time or move
            cells = [
                str(row.step),
                row.name,
                _short_op(row),
                ", ".join(row.fx_nodes) or "-",
                _mb(row.bytes),
                _mb(row.unfused_bytes),
                "-" if row.flops is None else f"{row.flops / 1e9:.3f}",
            ]
            if timed:
                cells += [
                    "-" if row.ms is None else f"{row.ms:.4f}",
                    "-" if row.bandwidth_bytes_s is None else f"{row.bandwidth_bytes_s / 1e9:.1f}",
                    "-" if row.roof is None else f"{100 * row.roof:.0f}%",
                ]
            table.add_row(*cells)
        console.print(table)
        if graph.not_fused:
            console.print("not fused:")
            for pair in graph.not_fused:
                console.print(f"  {pair.first} | {pair.second}: {pair.reason}", highlight=False)
        console.print()


def _peak_copy(roofs: dict[str, Any]) -> float:
    return max((rate for _, rate in roofs.get("copy_bandwidth", [])), default=0.0)


_KIND_COLORS = {"kernel": "#e4572e", "extern": "#4c72b0"}


def plot_explanations(explanations: Sequence[GraphExplanation], path: Path) -> Path:
    """Write a chart of every graph's kernels and ATen calls to `path` (needs
    matplotlib, as `ember bench --plot`): a horizontal bar per step, its time when the
    graph was profiled or its floor MB when not, with the fraction of its roof after
    the bar, so the steps worth working on stand out. One panel per graph, each with its
    own axis (a profiled graph's ms and another's MB share no scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    graphs = [[r for r in g.rows if r.kind in _KIND_COLORS] for g in explanations]
    heights = [max(len(rows), 1) for rows in graphs]
    fig, axes = plt.subplots(
        len(graphs),
        1,
        figsize=(9, 0.3 * sum(heights) + 1.2 * len(graphs)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, graph, rows in zip(axes[:, 0], explanations, graphs, strict=True):
        timed = any(r.ms is not None for r in rows)
        values = [(r.ms if timed else None if r.bytes is None else r.bytes / 1e6) for r in rows]
        ax.barh(
            range(len(rows)),
            [v or 0.0 for v in values],
            color=[_KIND_COLORS[r.kind] for r in rows],
        )
        for y, (row, value) in enumerate(zip(rows, values, strict=True)):
            if value is None:
                note = " not timed" if timed else " size unknown"
            else:
                note = f" {value:.3g} ms" if timed else f" {value:.3g} MB"
                if row.roof is not None:
                    note += f", {100 * row.roof:.0f}% of roof"
            ax.text(value or 0.0, y, note, va="center", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{r.name}  ({_short_op(r)})" for r in rows], fontsize=8)
        ax.invert_yaxis()  # in the order they run
        # the longest bar ends at 60% of the width: room for the text after it
        ax.set_xlim(0.0, max((v for v in values if v), default=1.0) / 0.6)
        ax.set_xlabel("ms per call (median)" if timed else "floor MB (not profiled)")
        title = graph.graph
        if timed and graph.call_ms is not None:
            title += f": {graph.call_ms:.3f} ms per call, {graph.profiled_calls} calls"
        ax.set_title(title, loc="left", fontsize=10)
    legend = [
        Patch(color=c, label=k if k == "kernel" else "ATen call") for k, c in _KIND_COLORS.items()
    ]
    axes[0, 0].legend(handles=legend, loc="lower left", bbox_to_anchor=(0.0, 1.08), ncols=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # long kernel names are not clipped
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory",
        type=Path,
        nargs="?",
        help="an EMBER_DEBUG_DIR (its latest run), a run's directory, or a graph's; "
        "with --model, where to write the dump (default: a temporary directory)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="compile and profile a model of `ember bench --list` first (one command: "
        "e.g. --model transformer_block)",
    )
    parser.add_argument("--device", default="cpu", help="with --model: cpu or cuda")
    parser.add_argument("--calls", type=int, default=20, help="with --model: calls timed")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="with --model: CPU threads (default 1 on the CPU, as `ember bench`: on a "
        "shared machine every parallel region waits for a busy core; 0: torch's default)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write a chart of each graph's steps (ms, or floor MB when not "
        "profiled, and the fraction of the roof) to PATH; needs matplotlib",
    )


def profile_model(name: str, device: str, calls: int, directory: Path) -> None:
    """Compile the bench registry's model `name` for inference on `device` with its
    debug dump in `directory`, every step timed, and call it `calls` + 1 times."""
    from ember.runtime.bench.measure import prepare
    from ember.runtime.config import config
    from ember.runtime.profiling import write_profiles

    dev = torch.device(device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    model, inputs = prepare(name, dev, dtype)
    with config.scope(debug_dir=directory, profile=True), torch.no_grad():
        compiled = torch.compile(model.eval(), backend="ember")
        for _ in range(calls + 1):  # the first call is not timed
            compiled(*inputs)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    write_profiles()


def run_cli(args: argparse.Namespace) -> int:
    if args.model is not None:
        import tempfile

        from ember.runtime.bench.registry import MODELS

        if args.model not in MODELS:
            print(f"ember explain: unknown model {args.model!r}; `ember bench --list`")
            return 2
        threads = args.threads if args.threads is not None else int(args.device == "cpu")
        if threads:
            torch.set_num_threads(threads)
        directory = args.directory or Path(tempfile.mkdtemp(prefix="ember-explain-"))
        profile_model(args.model, args.device, args.calls, directory)
        args.directory = directory
    if args.directory is None:
        print("ember explain: give a debug directory, or --model NAME")
        return 2
    explanations = explain(args.directory)
    if args.json:
        print(json.dumps([_jsonable(e) for e in explanations], indent=1))
    else:
        print_explanations(explanations)
    if not explanations:
        return 1
    if args.plot is not None:
        try:
            chart = plot_explanations(explanations, args.plot)
        except ImportError:
            print("ember explain: --plot needs matplotlib (the bench group)", file=sys.stderr)
            return 1
        print(f"chart: {chart}", file=sys.stderr if args.json else sys.stdout)  # JSON stays JSON
    return 0


def _jsonable(explanation: GraphExplanation) -> dict[str, Any]:
    data = asdict(explanation)
    data["directory"] = str(explanation.directory)
    return data


def rows_of(explanations: Iterable[GraphExplanation]) -> list[ExplainRow]:
    """Every row of every graph, in order."""
    return [row for graph in explanations for row in graph.rows]
