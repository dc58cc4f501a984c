"""Present bench records: the text tables `ember bench` prints and the speedup chart.

The first table has a row per (model, mode, backend) with everything measured.
"kernels" is each backend's own count (Inductor's generated kernels; ember's kernels
and ATen calls), which do not compare; "launches" (CUDA only) counts the kernels one
call runs on the device, with the profiler, the same way for every backend (a
MobileNetV3 training step: 477 Inductor "kernels" against ember's 497, but 744
launches against 635; H100, 2026-11-25, f0f2c16). The second table puts the backends
side by side, a row per (model, mode): each backend's ms and ember's speedup over each
of the others (the other's ms / ember's: above 1x ember is faster), then a geometric
mean of each ratio per mode over the models that have both.

The chart (`--plot`) is one horizontal bar per (model, mode) and compiling backend,
speedup over eager on a shared axis with a line at 1x, so "which is faster, by how much"
reads at a glance; failed rows are marked instead of silently missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ember.runtime.bench.harness import BenchRecord
from ember.runtime.table import format_table

HEADERS = [
    "model", "mode", "backend", "cold s", "warm s", "ms", "speedup",
    "peak MB", "max err", "ok", "kernels", "launches", "note",
]  # fmt: skip


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_records(records: Sequence[BenchRecord]) -> str:
    rows = []
    for r in records:
        ok = "-" if r.matches_eager is None else ("yes" if r.matches_eager else "NO")
        note = r.error or "; ".join(r.notes)
        rows.append(
            [
                r.model,
                r.mode,
                r.backend,
                _num(r.compile_cold_s, ".1f"),
                _num(r.compile_warm_s, ".1f"),
                _num(r.ms, ".3f"),
                "-" if r.speedup_vs_eager is None else f"{r.speedup_vs_eager:.2f}x",
                _num(None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20, ".0f"),
                _num(r.max_abs_err, ".1e"),
                ok,
                "-" if r.kernels is None else str(r.kernels),
                "-" if r.device_kernels is None else str(r.device_kernels),
                note[:70],
            ]
        )
    device = f"{records[0].device}, {records[0].dtype}" if records else ""
    text = f"ember bench ({device})\n" + format_table(HEADERS, rows)
    side = side_by_side(records)
    return text if side is None else f"{text}\n\n{side}"


def ember_ratios(records: Sequence[BenchRecord]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (model, mode): ember's speedup over every other backend measured beside it
    (that backend's ms / ember's ms), where both have a time."""
    ms = {(r.model, r.mode, r.backend): r.ms for r in records if r.ms}
    ratios: dict[tuple[str, str], dict[str, float]] = {}
    for (model, mode, backend), value in ms.items():
        ember = ms.get((model, mode, "ember"))
        if backend != "ember" and ember:
            ratios.setdefault((model, mode), {})[backend] = value / ember
    return ratios


def side_by_side(records: Sequence[BenchRecord]) -> str | None:
    """The backends' ms in columns and ember's ratios to each; None for one backend."""
    backends = list(dict.fromkeys(r.backend for r in records))
    if len(backends) < 2:
        return None
    others = [b for b in backends if b != "ember"] if "ember" in backends else []
    headers = ["model", "mode", *(f"{b} ms" for b in backends)]
    headers += [f"ember vs {b}" for b in others]
    by_key = {(r.model, r.mode, r.backend): r for r in records}
    ratios = ember_ratios(records)
    cases = list(dict.fromkeys((r.model, r.mode) for r in records))
    rows = []
    for model, mode in cases:
        row = [model, mode]
        for backend in backends:
            r = by_key.get((model, mode, backend))
            row.append(_ms(r))
        found = ratios.get((model, mode), {})
        row += [_ratio(found.get(b)) for b in others]
        rows.append(row)
    for mode in dict.fromkeys(mode for _, mode in cases):
        if not others:
            break
        row = ["geomean", mode, *("" for _ in backends)]
        for b in others:
            values = [v[b] for (_, m), v in ratios.items() if m == mode and b in v]
            mean = math.exp(sum(map(math.log, values)) / len(values)) if values else None
            row.append(_ratio(mean))
        rows.append(row)
    return "side by side (ember vs X: X's ms / ember's ms; above 1x ember is faster)\n" + (
        format_table(headers, rows)
    )


def _ms(record: BenchRecord | None) -> str:
    if record is None:
        return "-"
    if record.ms is not None:
        return f"{record.ms:.3f}"
    error = record.error or ""
    for word in ("skipped", "not run"):
        if error.startswith(word):
            return word
    return "failed" if error else "-"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def plot_speedups(records: Sequence[BenchRecord], path: Path) -> Path:
    """Write a bar chart of speedup over eager per (model, mode) and backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r.model, r.mode) for r in records))
    order = ("inductor", "inductor-ro", "ember")
    backends = [b for b in order if any(r.backend == b for r in records)]
    by_key = {(r.model, r.mode, r.backend): r for r in records}
    height = 0.8 / max(len(backends), 1)
    colors = {"inductor": "#8c8c8c", "inductor-ro": "#4c72b0", "ember": "#e4572e"}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(cases) * max(len(backends), 1) + 1.5))
    for b_index, backend in enumerate(backends):
        for c_index, (model, mode) in enumerate(cases):
            r = by_key.get((model, mode, backend))
            y = c_index + b_index * height
            if r is None or r.speedup_vs_eager is None:
                ax.text(0.02, y, "failed" if r and r.error else "n/a", va="center", fontsize=8)
                continue
            ax.barh(y, r.speedup_vs_eager, height=height, color=colors[backend],
                    label=backend if c_index == 0 else None)  # fmt: skip
            ax.text(r.speedup_vs_eager, y, f" {r.speedup_vs_eager:.2f}x", va="center", fontsize=8)
    ax.margins(x=0.12)  # room for the value printed after the longest bar
    ax.set_yticks([i + height * (len(backends) - 1) / 2 for i in range(len(cases))])
    ax.set_yticklabels([f"{m} ({mode})" for m, mode in cases])
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup over eager (higher is better)")
    device = f"{records[0].device}, {records[0].dtype}" if records else ""
    ax.set_title(f"ember bench: speedup over eager ({device})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never on one
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # long model names are not clipped
    plt.close(fig)
    return path
