"""ember.runtime.threads: finding the OpenMP runtimes a process has loaded."""

from __future__ import annotations

import logging

import pytest

from ember.runtime import threads

MAPS = """\
7f00-7f01 r-xp 00000000 08:01 11 /venv/torch/lib/libgomp.so.1
7f01-7f02 r--p 00001000 08:01 11 /venv/torch/lib/libgomp.so.1
7f02-7f03 r-xp 00000000 08:01 12 /usr/lib/libgomp-a34b3233.so.1
7f03-7f04 r-xp 00000000 08:01 13 /opt/intel/libiomp5.so
7f04-7f05 r-xp 00000000 08:01 14 /usr/lib/libgompx.so.1
7f05-7f06 rw-p 00000000 00:00 0 [heap]
7f06-7f07 r-xp 00000000 08:01 15 /usr/lib/libomp.so.5
7f07-7f08 r-xp 00000000 08:01 16 /usr/lib/libtorch_cpu.so
"""


def test_runtime_names() -> None:
    assert threads.is_openmp_runtime("/a/libgomp.so.1")
    assert threads.is_openmp_runtime("/a/libgomp-a34b3233.so.1")
    assert threads.is_openmp_runtime("libiomp5.so")
    assert threads.is_openmp_runtime("/a/libomp.dylib")
    assert not threads.is_openmp_runtime("/a/libgompx.so.1")
    assert not threads.is_openmp_runtime("/a/libtorch_cpu.so")


def test_runtimes_from_maps() -> None:
    found = threads.openmp_runtimes(MAPS)
    assert found == sorted(
        [
            "/venv/torch/lib/libgomp.so.1",
            "/usr/lib/libgomp-a34b3233.so.1",
            "/opt/intel/libiomp5.so",
            "/usr/lib/libomp.so.5",
        ]
    )


def test_two_runtimes_are_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    two = ["/usr/lib/libgomp.so.1", "/venv/torch/lib/libgomp-a34b3233.so.1"]
    monkeypatch.setattr(threads, "openmp_runtimes", lambda: two)
    threads.check_openmp_runtimes.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="ember.runtime.threads"):
            assert threads.check_openmp_runtimes() == two
            threads.check_openmp_runtimes()  # once per process
        warnings = [r for r in caplog.records if "OpenMP runtimes" in r.getMessage()]
        assert len(warnings) == 1 and two[1] in warnings[0].getMessage()
    finally:
        threads.check_openmp_runtimes.cache_clear()


def test_one_runtime_is_quiet(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(threads, "openmp_runtimes", lambda: ["/venv/torch/lib/libgomp.so.1"])
    threads.check_openmp_runtimes.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="ember.runtime.threads"):
            threads.check_openmp_runtimes()
        assert not caplog.records
    finally:
        threads.check_openmp_runtimes.cache_clear()
