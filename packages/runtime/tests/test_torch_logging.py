"""Ember's logs and traces through torch._logging: TORCH_LOGS="ember" / "+ember" print
each line once, EMBER_LOGS still works alone, and TORCH_TRACE receives every compile
stage as a structured artifact. Each case runs in a fresh process, since torch reads
TORCH_LOGS and TORCH_TRACE once, at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import torch, ember.runtime
f = torch.compile(lambda x: (x.sin() + 1).sum(-1), backend="ember")
print(float(f(torch.ones(8, 8)).sum()))
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "EMBER_"))}
    # a fresh cache: the stages run (a cached graph skips them)
    variables.update(EMBER_CACHE_DIR=str(tmp_path / "cache"), **env)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env=variables,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert abs(float(done.stdout.split()[-1]) - 8 * 8 * (1 + 0.8414709848)) < 1e-3
    return done


def _compiled_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "compiled inference_0:" in line]


def test_torch_logs_ember_prints_each_line_once(tmp_path: Path) -> None:
    done = _run(tmp_path, TORCH_LOGS="ember")
    lines = _compiled_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("I") and "ember/runtime/compiler.py" in lines[0]  # torch's format
    assert not [line for line in done.stderr.splitlines() if line.startswith("V")]  # no debug


def test_torch_logs_plus_ember_adds_debug_lines_once(tmp_path: Path) -> None:
    done = _run(tmp_path, TORCH_LOGS="+ember")
    assert len(_compiled_lines(done.stderr)) == 1, done.stderr
    debug = [line for line in done.stderr.splitlines() if line.startswith("V") and "ember/" in line]
    assert debug, done.stderr
    assert len(debug) == len(set(debug))  # no line repeated


def test_ember_logs_alone_still_prints_once(tmp_path: Path) -> None:
    done = _run(tmp_path, EMBER_LOGS="info")
    lines = _compiled_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("[ember.runtime] INFO"), done.stderr


def test_torch_trace_holds_every_stage_of_the_compile(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    _run(tmp_path, TORCH_TRACE=str(trace))
    artifacts: dict[str, str] = {}
    for log in trace.glob("*.log"):
        lines = log.read_text().splitlines()
        for number, line in enumerate(lines):
            _, _, body = line.partition("] ")  # glog prefix, then the JSON record
            if '"artifact"' not in body:
                continue
            record = json.loads(body)
            name = record["artifact"]["name"]
            # the payload follows on lines that start with a tab
            payload = []
            for more in lines[number + 1 :]:
                if not more.startswith("\t"):
                    break
                payload.append(more[1:])
            artifacts[name] = "\n".join(payload)
    stages = ("passes", "ir", "schedule", "kernels", "wrapper")
    assert {f"ember_inference_0_{stage}" for stage in stages} <= set(artifacts), sorted(artifacts)
    assert "def forward" in artifacts["ember_inference_0_passes"]
    assert "schedule inference_0" in artifacts["ember_inference_0_schedule"]
    assert 'extern "C"' in artifacts["ember_inference_0_kernels"]
    assert "def call(" in artifacts["ember_inference_0_wrapper"]
