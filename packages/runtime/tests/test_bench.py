"""`ember bench` in the runtime package alone: the registry, skipping models whose
library is missing, and `python -m ember.runtime.cli`. The end-to-end run with its chart
needs matplotlib and is in tests/bench/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.runtime.bench import MODELS, BenchOptions, run_bench
from ember.runtime.bench.registry import ModelSpec, loss_input, models_for

REQUIRED_FIELDS = {
    "model", "mode", "device", "dtype", "backend", "compile_cold_s", "compile_warm_s", "ms",
    "speedup_vs_eager", "peak_mem_bytes", "max_abs_err", "kernels", "error",
}  # fmt: skip


@pytest.mark.parametrize("name", [s.name for s in models_for("cpu") if s.requires is None])
def test_builtin_blocks_build_and_run_at_cpu_size(name: str) -> None:
    model, inputs = MODELS[name].build("cpu")
    out = loss_input(model(*inputs))
    assert out.isfinite().all() and out.numel() > 0


def test_the_sets_hold_blocks_and_real_models() -> None:
    cpu, gpu = models_for("cpu"), models_for("cuda")
    assert {"mlp", "attention", "cnn_block", "resnet18", "bert"} <= {s.name for s in cpu}
    assert {"resnet50", "vit_base", "gpt2", "llama"} <= {s.name for s in gpu}
    assert {"mobilenetv3", "t5_small_encoder", "llama_small"} <= {s.name for s in gpu}
    assert {s.requires for s in gpu} >= {"torchvision", "timm", "transformers"}


def test_a_model_whose_library_is_missing_is_skipped_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ghost = ModelSpec("ghost", MODELS["mlp"].build, frozenset(), "no_such_library_xyz")
    monkeypatch.setitem(MODELS, "ghost", ghost)
    records = run_bench(BenchOptions(["ghost"], ["inference"], ["eager", "ember"]))
    assert [r.error for r in records] == ["skipped: needs no_such_library_xyz"] * 2
    assert "skipping ghost: needs no_such_library_xyz" in capsys.readouterr().err


def test_cli_runs_as_a_module_without_the_console_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ember.runtime.cli", "bench", "--list"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "resnet50" in done.stdout and "needs torchvision" in done.stdout
    assert torch.__version__  # the same interpreter runs the module


def test_each_measurement_reaches_the_records_as_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--json` is rewritten after every measurement: a run killed from outside keeps
    the rows it finished."""
    from ember.runtime.bench import harness

    def fake_finish(job: Any, timeout_s: float) -> dict[str, Any]:
        return {"ms": 2.0 if job.record.backend == "eager" else 1.0, "compile_s": 0.1}

    monkeypatch.setattr(harness, "_start", lambda job, options: None)
    monkeypatch.setattr(harness, "_release", lambda job, go: None)
    monkeypatch.setattr(harness, "_finish", fake_finish)
    seen: list[list[float | None]] = []
    options = BenchOptions(["mlp"], ["inference"], ["eager", "ember"], warm=False, prefetch=False)
    records = run_bench(options, lambda rs: seen.append([r.ms for r in rs]))
    assert seen == [[2.0, None], [2.0, 1.0]]
    assert records[1].speedup_vs_eager == 2.0


def _fake_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.runtime.bench import harness

    def fake_finish(job: Any, timeout_s: float) -> dict[str, Any]:
        return {"ms": 2.0 if job.record.backend == "eager" else 1.0, "compile_s": 0.1}

    monkeypatch.setattr(harness, "_start", lambda job, options: None)
    monkeypatch.setattr(harness, "_release", lambda job, go: None)
    monkeypatch.setattr(harness, "_finish", fake_finish)


@pytest.mark.parametrize("force_color", [None, "1"])
def test_progress_off_a_terminal_is_one_plain_line_per_measurement(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], force_color: str | None
) -> None:
    """A CI log or `2> file` gets a line as each measurement starts, no bar redrawn
    with carriage returns or escape codes, even where FORCE_COLOR makes rich take the
    log for a terminal."""
    _fake_measurements(monkeypatch)
    if force_color is None:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    else:
        monkeypatch.setenv("FORCE_COLOR", force_color)
    options = BenchOptions(["mlp"], ["inference"], ["eager", "ember"], prefetch=False)
    run_bench(options)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 3  # eager once; ember cold and warm
    assert lines[0].startswith("ember bench: [1/3] ") and lines[0].endswith(
        "mlp inference eager (cold)"
    )
    assert lines[2].startswith("ember bench: [3/3] ") and lines[2].endswith("ember (warm)")


def test_the_time_limit_ends_the_run_and_records_what_was_not_run() -> None:
    options = BenchOptions(["mlp"], ["inference", "train"], ["eager", "ember"], time_limit_s=0)
    records = run_bench(options)
    assert len(records) == 4
    assert all(r.error == "not run: --time-limit reached" and r.ms is None for r in records)


def test_a_prefetched_measurement_waits_for_its_turn_and_can_be_called_off(
    tmp_path: Path,
) -> None:
    """The harness starts the next process early; it must not measure (nor write its
    record) before 'go', and on 'stop' it exits cleanly without a record."""
    from ember.runtime.bench.harness import BenchRecord, _finish, _Job, _release, _start

    options = BenchOptions(["mlp"], ["inference"], ["eager"], prefetch=True)
    jobs = []
    for name in ("stopped", "measured"):
        record = BenchRecord("mlp", "inference", "cpu", "float32", "eager")
        job = _Job(record, MODELS["mlp"], "cold", tmp_path / name / "cold.json")
        _start(job, options)
        jobs.append(job)
    stopped, measured = jobs
    assert measured.process is not None and measured.process.poll() is None  # waiting
    assert not measured.out.exists()
    _release(stopped, go=False)
    assert _finish(stopped, 120) == {"error": "cold: exit 0"} and not stopped.out.exists()
    _release(measured, go=True)
    result = _finish(measured, 120)
    assert result["ms"] > 0 and measured.out.exists()


def test_a_timed_out_measurement_is_killed_with_its_children(tmp_path: Path) -> None:
    """A child that inherited the measurement's stderr (a compile worker) must not keep
    the harness waiting once the measurement times out."""
    import time

    from ember.runtime.bench.harness import BenchRecord, _finish, _Job

    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)"
    )
    record = BenchRecord("mlp", "inference", "cpu", "float32", "eager")
    job = _Job(record, MODELS["mlp"], "cold", tmp_path / "cold.json")
    job.process = subprocess.Popen(
        [sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    start = time.perf_counter()
    assert _finish(job, 2) == {"error": "cold measurement timed out after 2 s"}
    assert time.perf_counter() - start < 20


def test_aot_eager_is_measured_as_the_compile_floor() -> None:
    """aot_eager (Dynamo + AOTAutograd, graphs run eagerly) gets a cold compile time
    and an accuracy verdict like a compiling backend, and no kernel count."""
    from ember.runtime.bench.measure import measure

    record = measure(
        "mlp", "inference", "aot_eager", torch.device("cpu"), torch.float32, "cold", runs=2
    )
    assert record["compile_s"] > 0 and record["ms"] > 0
    assert record["matches_eager"] is True
    assert "kernels" not in record


def test_inductor_reduce_overhead_is_in_the_gpu_default_only() -> None:
    from ember.runtime.bench.harness import default_backends

    assert default_backends("cuda") == ["eager", "inductor", "inductor-ro", "ember"]
    assert default_backends("cpu") == ["eager", "inductor", "ember"]


def test_ember_mode_reaches_the_ember_measurements_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ember-mode` becomes torch.compile's mode for ember's processes alone, and the
    ember rows say which mode they ran."""
    from ember.runtime.bench import harness

    commands: list[list[str]] = []

    class Started:
        def __init__(self, command: list[str], **kwargs: Any) -> None:
            commands.append(command)

    def fake_finish(job: Any, timeout_s: float) -> dict[str, Any]:
        return {"ms": 1.0, "compile_s": 0.1}

    monkeypatch.setattr(subprocess, "Popen", Started)
    monkeypatch.setattr(harness, "_release", lambda job, go: None)
    monkeypatch.setattr(harness, "_finish", fake_finish)
    backends = ["eager", "inductor", "inductor-ro", "ember"]
    options = BenchOptions(["mlp"], ["inference"], backends, warm=False, prefetch=False)
    options.ember_mode = "reduce-overhead"
    records = run_bench(options)
    modes = {c[c.index("--backend") + 1]: c[c.index("--ember-mode") + 1 :][:1] for c in commands
             if "--ember-mode" in c}  # fmt: skip
    assert modes == {"ember": ["reduce-overhead"]}
    assert len(commands) == 4
    assert [r.notes for r in records] == [[], [], [], ["mode=reduce-overhead"]]


def test_the_report_puts_the_backends_side_by_side_with_embers_ratios() -> None:
    from ember.runtime.bench.harness import BenchRecord
    from ember.runtime.bench.report import ember_ratios, format_records

    def row(model: str, mode: str, backend: str, ms: float | None) -> BenchRecord:
        error = None if ms else "cold: boom"
        return BenchRecord(model, mode, "cuda", "bfloat16", backend, ms=ms, error=error)

    times = {"eager": 8.0, "inductor": 4.0, "inductor-ro": 1.0, "ember": 2.0}
    records = [row("a", "inference", b, ms) for b, ms in times.items()]
    records += [row("b", "inference", b, ms / 2) for b, ms in times.items()]
    records += [row("c", "inference", b, None if b == "inductor-ro" else 1.0) for b in times]
    ratios = ember_ratios(records)
    assert ratios[("a", "inference")] == {"eager": 4.0, "inductor": 2.0, "inductor-ro": 0.5}
    assert "inductor-ro" not in ratios[("c", "inference")]
    text = format_records(records)
    side = text.split("side by side", 1)[1].splitlines()
    header = side[1].split()
    assert header[:6] == ["model", "mode", "eager", "ms", "inductor", "ms"]
    assert "ember vs eager" in side[1] and "ember vs inductor-ro" in side[1]
    a, _, c, mean = side[3:7]
    assert a.split() == ["a", "inference", "8.000", "4.000", "1.000", "2.000", "4.00x", "2.00x",
                         "0.50x"]  # fmt: skip
    assert c.split()[4] == "failed" and c.split()[-1] == "-"
    # geomean over the models that have both: eager (4, 4, 1), inductor-ro (0.5, 0.5)
    assert mean.split() == ["geomean", "inference", "2.52x", "1.59x", "0.50x"]


def test_the_report_gives_device_launches_beside_each_backends_own_count() -> None:
    """Inductor's and ember's kernel counts count different things: the profiler's
    launch count is the one column that compares across backends."""
    from ember.runtime.bench.harness import BenchRecord
    from ember.runtime.bench.report import format_records

    records = [
        BenchRecord("m", "train", "cuda", "bfloat16", "inductor-ro", ms=7.0, kernels=477,
                    device_kernels=744),
        BenchRecord("m", "train", "cuda", "bfloat16", "ember", ms=8.0, kernels=497,
                    device_kernels=635),
    ]  # fmt: skip
    lines = format_records(records).splitlines()
    assert lines[1].split()[-3:] == ["kernels", "launches", "note"]
    # the rows end with the two counts (the note is empty)
    assert lines[3].split()[2] == "inductor-ro" and lines[3].split()[-2:] == ["477", "744"]
    assert lines[4].split()[2] == "ember" and lines[4].split()[-2:] == ["497", "635"]


def test_a_measurement_keeps_each_graphs_cuda_graph_state() -> None:
    """What measure.py reports of CUDA graphs per ember graph reaches the record (and
    so the JSON): it was dropped on the way before."""
    from ember.runtime.bench.harness import BenchRecord, _merge

    record = BenchRecord("mlp", "inference", "cuda", "bfloat16", "ember")
    state = "inference_0: recorded 1"
    _merge(record, "cold", {"compile_s": 1.0, "ms": 2.0, "cudagraphs": state})
    assert record.cudagraphs == state and record.ms == 2.0
