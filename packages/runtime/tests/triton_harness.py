"""Running Triton kernel test cases in Triton's interpreter (test helper).

`TRITON_INTERPRET=1` must be set before Triton is imported and must not leak into
the other tests of the process, so each test file that checks kernels on the CPU runs
itself as a script in subprocesses (`interpret`), where `report` runs the named cases
and prints one JSON record per case; the fixture reads the records back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import pytest


def interpret(
    script: str, names: Sequence[str], *, workers: int = 1, timeout: float = 600
) -> dict[str, dict[str, Any]]:
    """Each case's record from running `script` with `names` in the interpreter, the
    names shared among `workers` subprocesses; a test failure where none reported."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    names = list(names)
    processes = [
        subprocess.Popen(
            [sys.executable, script, *names[k::workers]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(workers)
    ]
    results: dict[str, dict[str, Any]] = {}
    errors = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        errors.append(stderr[-4000:])
        for line in stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["case"]] = record
    if not results:
        pytest.fail("the interpreter runs produced nothing:\n" + "\n".join(errors))
    return results


def report(run_case: Callable[[str, str], dict[str, Any]], names: Sequence[str]) -> None:
    """Run each named case on the CPU (in the interpreter) and print its record."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    for name in names:
        try:
            record = run_case(name, "cpu")
        except Exception as exc:
            record = {"case": name, "ok": False, "error": f"{exc!r}\n{traceback.format_exc()}"}
        print(json.dumps(record), flush=True)
