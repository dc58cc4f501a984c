"""The compile cache under faults, and its management: each test breaks one thing
around the cache (its directory's owner, mode or disk; a library's bytes; the
compiler) and checks that graphs still compile and compute eager's values, that
nothing half-written stays, and what ember says about it; then the size cap, the
remembered failed compiles, EMBER_CACHE=off, and `ember cache info` / `clear`.

Faults that need another user or a read-only file system are made for real where
the tests can (a chown as root, a chmod as another user) and simulated where they
cannot (a faked owner, or a write that fails with EROFS as the kernel would on a
read-only mount), so each test runs as root and as any other user.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.codegen.cpp import CppSource
from ember.runtime import cache, compiler, config, cpp_kernels, store
from ember.runtime.cli import main
from ember.runtime.config import EmberConfig
from ember.runtime.cpp_kernels import CppKernel
from ember.runtime.store import CHECKSUMS, EntryStore, SizeLimit, scan
from ember.runtime.testing import no_eager_fallback

ROOT = os.geteuid() == 0
MINIMAL_UNIT = 'extern "C" void ember_set_num_threads(int) {}\n'


def double(t: torch.Tensor) -> torch.Tensor:
    return t * 2 + 1


def two_outputs(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.relu() * 3, t - 1  # another wrapper than double's, not only other kernels


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temporary directory, where fallbacks and this process's private
    directory go, private to the test (a fresh private directory too)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(store, "_private", [])
    return tmp_path / "tmp"


def compile_and_check(monkeypatch: pytest.MonkeyPatch, fn: Any, x: torch.Tensor) -> Any:
    """Compile `fn` through ember, its kernels generated C++ (no eager run, no ATen
    fallback), and check it against eager on `x`; the record of its graph. Graph names
    restart at each call, so compiling a function again generates the same wrapper."""
    monkeypatch.setattr(compiler, "_graph_ids", itertools.count())
    torch._dynamo.reset()
    with torch.no_grad(), no_eager_fallback() as graphs:
        compiled: Any = torch.compile(fn, backend="ember")
        got = compiled(x)
    torch.testing.assert_close(got, fn(x))
    (record,) = graphs
    _kept.append(record.artifact)  # records hold theirs weakly; the next reset drops it
    return record


_kept: list[Any] = []  # the artifacts of graphs compiled here, for `units`


def units(record: Any) -> list[cpp_kernels.CompiledUnit]:
    """The C++ units a compiled graph runs."""
    found = {id(k.unit): k.unit for k in record.artifact.launchers.values()}
    assert found and all(isinstance(k, CppKernel) for k in record.artifact.launchers.values())
    return list(found.values())


def files_under(directory: Path) -> list[str]:
    """Every file and directory under `directory`, relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# -- writes ---------------------------------------------------------------------------


def test_put_fsyncs_each_file_and_the_directory_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = EntryStore(tmp_path / "store")
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(source: Any, target: Any) -> None:
        events.append(("rename", os.fspath(source)))
        real_rename(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    entries.put("a1", {"one": b"1", "two": b"2"})
    entries.put("b2", {"one": b"1"})
    renames = [i for i, (what, _) in enumerate(events) if what == "rename"]
    assert len(renames) == 2
    first = events[: renames[0] + 2]
    scratch = Path(first[renames[0]][1])
    assert scratch.parent == entries.directory and scratch.name.startswith(".tmp-")
    synced = [Path(path) for what, path in first[: renames[0]] if what == "fsync"]
    # each file, checksums.json last, then the directory, all before the rename
    assert synced == [scratch / "one", scratch / "two", scratch / CHECKSUMS, scratch]
    assert first[renames[0] + 1] == ("fsync", str(entries.directory))  # the rename itself
    other = Path(events[renames[1]][1])
    assert other.name != scratch.name and len(other.name) >= len(".tmp-") + 8  # unpredictable


def test_a_write_never_follows_or_reuses_a_planted_file(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"theirs")
    planted = tmp_path / "planted"
    planted.symlink_to(target)
    with pytest.raises(FileExistsError):
        store._write_new(planted, b"mine")
    assert target.read_bytes() == b"theirs"
    with pytest.raises(FileExistsError):
        store._write_new(target, b"mine")
    assert target.read_bytes() == b"theirs"


# -- damaged libraries -------------------------------------------------------------------


def test_garbage_in_place_of_a_library_is_rebuilt_never_loaded(
    tmp_path: Path, warnings_seen: pytest.LogCaptureFixture
) -> None:
    """Random bytes replace a library (same name, same size; its checksum stays, since
    writing a matching one takes write access to the cache, which only its owner
    has): dlopen must never see them (it would fail on them, or worse, map them)."""
    compiler_path = cpp_kernels.find_compiler()
    key = f"k{cpp_kernels.unit_key(MINIMAL_UNIT, compiler_path)}"
    libraries = EntryStore(tmp_path / "cpp")
    built = cpp_kernels._build(compiler_path, MINIMAL_UNIT, libraries, key)  # not loaded
    library = built.path(f"{key}.so")
    size = library.stat().st_size
    garbage = os.urandom(size)
    library.write_bytes(garbage)
    unit = cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    assert unit.path == library and unit.compile_seconds > 0  # built anew, then loaded
    assert library.read_bytes() != garbage and library.read_bytes()[:4] == b"\x7fELF"
    unit.library.ember_set_num_threads(1)  # the rebuilt library works
    assert f"cache entry {library.parent} removed" in warnings_seen.text
    assert "does not match its SHA-256" in warnings_seen.text
    assert not [p for p in (tmp_path / "cpp").iterdir() if p.name.startswith(".")]


# -- refused directories ----------------------------------------------------------------


def _foreign(directory: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make `directory` another user's: for real as root, else as os.lstat reports it.
    Returns that user's uid."""
    if ROOT:
        os.chown(directory, 4321, 4321)
        return 4321
    other = os.geteuid() + 1
    real_lstat = os.lstat

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        st = real_lstat(path, *args, **kwargs)
        if os.fspath(path) == str(directory):
            fields = list(st[:10])
            fields[4] = other
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(os, "lstat", lstat)
    return other


@pytest.mark.parametrize("fault", ["owned-by-another-user", "mode-0777"])
def test_a_refused_cache_directory_is_left_alone_and_graphs_still_compile(
    tmp_path: Path,
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    refused = tmp_path / "refused"
    refused.mkdir(mode=0o700)
    if fault == "mode-0777":
        refused.chmod(0o777)
        expected = f"its parent {refused} is writable by group or others (mode 0777"
    else:
        other = _foreign(refused, monkeypatch)
        expected = f"its parent {refused} is owned by uid {other}, neither this user nor root"
    with config.scope(cache_dir=refused):
        record = compile_and_check(monkeypatch, double, torch.randn(100))
    fallback = private_tmp / f"ember-{os.geteuid()}"
    assert record.wrapper_path.is_relative_to(fallback / "wrappers")
    assert all(u.path.is_relative_to(fallback / "cpp") for u in units(record))
    assert os.listdir(refused) == []  # nothing written there
    assert f"ember will not keep generated code in {refused}" in warnings_seen.text
    assert expected in warnings_seen.text


# -- read-only and full disks ------------------------------------------------------------


def _read_only(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `directory` and everything under it read-only: by its mode where that
    binds (not for root), else by failing every write under it with EROFS, as a
    read-only mount would."""
    directory = Path(os.path.realpath(directory))
    if not ROOT:
        for path in [directory, *directory.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o500)
        return

    def inside(path: Any, dir_fd: int | None = None) -> bool:
        if dir_fd is not None:
            return False  # relative to a directory opened earlier, outside these tests
        full = os.path.abspath(os.fsdecode(path))
        return full == str(directory) or full.startswith(f"{directory}/")

    def refuse(path: Any) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real = {name: getattr(os, name) for name in ("open", "mkdir", "rename", "utime", "unlink")}
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & writes and inside(path, dir_fd):
            raise refuse(path)
        return int(real["open"](path, flags, mode, dir_fd=dir_fd))

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if inside(path, dir_fd):
            raise refuse(path)
        real["mkdir"](path, mode, dir_fd=dir_fd)

    def rename(source: Any, target: Any, **kwargs: Any) -> None:
        if inside(source) or inside(target):
            raise refuse(source)
        real["rename"](source, target, **kwargs)

    def utime(path: Any, *args: Any, **kwargs: Any) -> None:
        if inside(path):
            raise refuse(path)
        real["utime"](path, *args, **kwargs)

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        if inside(path, dir_fd):
            raise refuse(path)
        real["unlink"](path, dir_fd=dir_fd)

    for name, fake in [
        ("open", open_),
        ("mkdir", mkdir),
        ("rename", rename),
        ("utime", utime),
        ("unlink", unlink),
    ]:
        monkeypatch.setattr(os, name, fake)


def _writable_again(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)


def test_a_read_only_cache_directory_falls_back_to_a_private_one(
    tmp_path: Path,
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    empty = tmp_path / "read-only"
    empty.mkdir(mode=0o700)
    _read_only(empty, monkeypatch)
    try:
        with config.scope(cache_dir=empty):
            record = compile_and_check(monkeypatch, double, torch.randn(100))
        assert os.listdir(empty) == []
    finally:
        _writable_again(empty)
    fallback = private_tmp / f"ember-{os.geteuid()}"
    assert record.wrapper_path.is_relative_to(fallback / "wrappers")
    assert all(u.path.is_relative_to(fallback / "cpp") for u in units(record))
    assert f"ember will not keep generated code in {empty / 'wrappers'}" in warnings_seen.text
    assert "cannot be created" in warnings_seen.text


def test_a_read_only_cache_is_still_read_and_new_entries_go_elsewhere(
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    root = config.cache_dir
    x = torch.randn(100)
    first = compile_and_check(monkeypatch, double, x)
    before = files_under(root)
    _read_only(root, monkeypatch)
    try:
        again = compile_and_check(monkeypatch, double, x)  # read from the cache
        other = compile_and_check(monkeypatch, two_outputs, x)  # needs new entries
        assert files_under(root) == before  # nothing written, nothing removed
    finally:
        _writable_again(root)
    assert again.wrapper_path == first.wrapper_path
    assert [u.compile_seconds for u in units(again)] == [0.0]  # the cached library
    assert not other.wrapper_path.is_relative_to(root)
    assert other.wrapper_path.is_relative_to(store.private_directory())
    assert all(u.path.is_relative_to(store.private_directory()) for u in units(other))
    assert f"cannot write to the cache directory {root / 'wrappers'}" in warnings_seen.text


def test_a_full_disk_leaves_nothing_half_written_and_the_graph_runs(
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    root = Path(os.path.realpath(config.cache_dir))
    real_write = store._write_new

    def full(path: Path, data: bytes) -> None:
        if not Path(path).is_relative_to(root):
            real_write(path, data)
            return
        # half of it reaches the disk, then the disk is full
        with open(path, "xb") as handle:
            handle.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    x = torch.randn(100)
    with monkeypatch.context() as disk:
        disk.setattr(store, "_write_new", full)
        record = compile_and_check(monkeypatch, double, x)
    # no file at all is left in the cache: no entry, no temporary directory
    assert [p for p in root.rglob("*") if not p.is_dir()] == []
    assert not [p for p in root.rglob(".*")]
    assert record.wrapper_path.is_relative_to(store.private_directory())
    assert "No space left on device" in warnings_seen.text
    # space again: the next process (here: the next compile) fills the cache
    again = compile_and_check(monkeypatch, double, x)
    assert again.wrapper_path.is_relative_to(root)
    assert len(scan(root)) == 2  # the wrapper and the library, whole


# -- failed compiles ----------------------------------------------------------------------

FAKE_COMPILER = """#!/bin/sh
# a C++ compiler that rejects every unit it is asked to compile; --version and -###
# (the cache key's parts) are the real compiler's
for arg in "$@"; do
  if [ "$arg" = "-o" ]; then
    echo "compile $*" >> "{log}"
    echo "kernels.cpp:1:1: error: {message}" >&2
    exit 1
  fi
done
exec "{real}" "$@"
"""

COMPILE_DOUBLE = """
import json
import torch
import ember.runtime
from ember.runtime import compile_records
x = torch.randn(100)
with torch.no_grad():
    got = torch.compile(lambda t: t * 2 + 1, backend="ember")(x)
(record,) = compile_records
print(json.dumps({
    "error": (got - (x * 2 + 1)).abs().max().item(),
    "ran_eagerly": record.ran_eagerly,
    "kernel_fallback": record.kernel_fallback,
}))
"""


def fake_compiler(directory: Path, message: str) -> tuple[Path, Path]:
    """A compiler script that fails with `message`, and the log of its compiles."""
    log = directory / "compiles.log"
    script = directory / "fake-c++"
    text = FAKE_COMPILER.format(log=log, message=message, real=cpp_kernels.find_compiler())
    script.write_text(text)
    script.chmod(0o755)
    return script, log


def compiles(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def compile_double_in_subprocess(cache_dir: Path, compiler_path: Path) -> dict[str, Any]:
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache_dir), "CXX": str(compiler_path)}
    env["EMBER_COMPILE_CACHE"] = "0"  # each process must reach the C++ compile under test
    env.pop("EMBER_STRICT", None)
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_DOUBLE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_a_failed_compile_is_remembered_across_processes_until_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = config.cache_dir
    script, log = fake_compiler(tmp_path, "rejected by the test's compiler")
    first = compile_double_in_subprocess(root, script)
    assert first["error"] < 1e-6 and first["ran_eagerly"] is None  # ATen kernels ran it
    assert "rejected by the test's compiler" in first["kernel_fallback"]
    assert "remembered" not in first["kernel_fallback"]
    tried = compiles(log)
    assert tried == len(cpp_kernels.FLAG_CHOICES)
    (record,) = scan(root / "kernels" / "cpp-failed")
    failure = json.loads((record.directory / cpp_kernels.FAILURE_RECORD).read_text())
    assert "rejected by the test's compiler" in failure["message"]

    second = compile_double_in_subprocess(root, script)
    assert compiles(log) == tried  # the compiler was not run again
    assert second["error"] < 1e-6 and second["ran_eagerly"] is None
    assert "rejected by the test's compiler" in second["kernel_fallback"]  # the same error
    assert "remembered from an earlier compile" in second["kernel_fallback"]

    assert main(["cache", "clear", "--failed"]) == 0
    assert "removed 1 records of failed compiles" in capsys.readouterr().out
    third = compile_double_in_subprocess(root, script)
    assert compiles(log) == 2 * tried  # forgotten: compiled (and rejected) again
    assert "remembered" not in third["kernel_fallback"]


def test_a_failure_of_the_machine_is_not_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, log = fake_compiler(tmp_path, "cannot write kernels.so: No space left on device")
    monkeypatch.setattr(cpp_kernels, "find_compiler", lambda: str(script))
    for attempt in (1, 2):
        with pytest.raises(cpp_kernels.CppCompileError, match="No space left") as raised:
            cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
        assert "remembered" not in str(raised.value)
        assert compiles(log) == attempt * len(cpp_kernels.FLAG_CHOICES)
    assert scan(tmp_path / "cpp-failed") == []


def test_a_remembered_failure_of_another_unit_is_not_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_seen: pytest.LogCaptureFixture
) -> None:
    script, log = fake_compiler(tmp_path, "no")
    monkeypatch.setattr(cpp_kernels, "find_compiler", lambda: str(script))
    with pytest.raises(cpp_kernels.CppCompileRejected):
        cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    (record,) = scan(tmp_path / "cpp-failed")
    key = record.directory.name
    failures = EntryStore(tmp_path / "cpp-failed")
    failures.discard(key, "replaced by the test")
    lie = {"message": "planted", "source_sha256": "0" * 64}
    failures.put(key, {cpp_kernels.FAILURE_RECORD: json.dumps(lie).encode()})
    with pytest.raises(cpp_kernels.CppCompileError) as raised:
        cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    assert "planted" not in str(raised.value)  # compiled again instead
    assert compiles(log) == 2 * len(cpp_kernels.FLAG_CHOICES)
    assert "does not record a failed compile of this translation unit" in warnings_seen.text


# -- the size cap --------------------------------------------------------------------------


def _age(entry: store.Entry, seconds_ago: float) -> None:
    then = time.time() - seconds_ago
    os.utime(entry.directory, (then, then))


def test_least_recently_used_entries_go_first_to_keep_the_cap(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    limit = SizeLimit(root, 10_000)
    one, two = EntryStore(root / "one", limit=limit), EntryStore(root / "two", limit=limit)
    data = b"x" * 3000
    a = one.put("a", {"f": data})
    _age(a, 1000)
    b = two.put("b", {"f": data})  # another store of the same cache
    _age(b, 900)
    c = one.put("c", {"f": data})
    _age(c, 800)
    assert sum(e.bytes for e in scan(root)) <= 10_000  # three fit
    assert one.get("a") is not None  # used now: the most recent
    d = two.put("d", {"f": data})
    left = {e.directory.name for e in scan(root)}
    assert left == {"a", "c", "d"}  # b, the least recently used, went
    assert sum(e.bytes for e in scan(root)) <= 10_000
    assert not b.directory.exists() and d.directory.exists()
    _age(d, 700)
    _age(a, 600)
    one.put("e", {"f": data})
    assert {e.directory.name for e in scan(root)} == {"a", "d", "e"}  # c went, then no more
    assert not [p for p in root.rglob(".*")]


def test_entries_used_in_the_last_minute_are_never_evicted(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    entries = EntryStore(root / "one", limit=SizeLimit(root, 1000))
    entries.put("a", {"f": b"x" * 3000})
    entries.put("b", {"f": b"x" * 3000})
    assert {e.directory.name for e in scan(root)} == {"a", "b"}  # over the cap, for now
    _age(entries.get("a") or pytest.fail("a is gone"), 120)
    entries.put("c", {"f": b"x" * 10})
    assert {e.directory.name for e in scan(root)} == {"b", "c"}


def test_the_cap_knob_covers_the_cache_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = config.cache_dir
    with config.scope(cache_size_mb=1):
        inside = cache.entry_store(root / "wrappers")
        assert inside.limit == SizeLimit(root, 2**20)
        assert cache.entry_store(tmp_path / "elsewhere").limit is None
        # old entries fill the cache; the next compile's writes make room
        filler = EntryStore(root / "kernels" / "cpp")
        for index in range(3):
            _age(filler.put(f"old{index}", {"f": os.urandom(400_000)}), 1000 - index)
        record = compile_and_check(monkeypatch, double, torch.randn(100))
    left = scan(root)
    assert sum(e.bytes for e in left) <= 2**20
    names = {e.directory.name for e in left}
    assert "old0" not in names and "old2" in names
    assert record.wrapper_path.parent.name in names
    with config.scope(cache_size_mb=0):
        assert cache.entry_store(root / "wrappers").limit is None  # no cap
    monkeypatch.delenv("EMBER_CACHE_SIZE_MB", raising=False)
    assert EmberConfig().cache_size_mb == 2048


# -- EMBER_CACHE and EMBER_CACHE_DIR -----------------------------------------------------------


def test_cache_off_neither_reads_nor_writes_the_cache_directory(
    private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = config.cache_dir
    x = torch.randn(100)
    cached = compile_and_check(monkeypatch, double, x)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    with config.scope(cache="off"):
        assert config.cache_dir == store.private_directory() / "cache"
        record = compile_and_check(monkeypatch, double, x)
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before  # not even a touch
    assert record.wrapper_path.is_relative_to(store.private_directory())
    assert record.wrapper_path.name == cached.wrapper_path.name  # the same code, ...
    assert [u.compile_seconds > 0 for u in units(record)] == [True]  # ... compiled anew


def test_cache_off_in_a_process_leaves_nothing_behind(tmp_path: Path) -> None:
    script = COMPILE_DOUBLE + (
        "from ember.runtime import config\n"
        "print(json.dumps({'dir': str(config.cache_dir), 'wrapper': str(record.wrapper_path)}))\n"
    )
    (tmp_path / "tmp").mkdir()
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "EMBER_CACHE": "off", "EMBER_CACHE_DIR": str(cache_dir)}
    env["TMPDIR"] = str(tmp_path / "tmp")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outcome, paths = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert outcome["error"] < 1e-6 and outcome["kernel_fallback"] is None
    assert Path(paths["wrapper"]).is_relative_to(paths["dir"])
    assert Path(paths["dir"]).is_relative_to(tmp_path / "tmp")
    assert not cache_dir.exists()
    assert [n for n in os.listdir(tmp_path / "tmp") if n.startswith("ember")] == []  # gone


def test_an_empty_cache_dir_means_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("EMBER_CACHE_DIR", "")
    settings = EmberConfig()
    assert settings.cache_dir == tmp_path / "xdg" / "ember"
    assert settings.cache_dir != Path()
    settings.validate()
    monkeypatch.setenv("EMBER_CACHE_DIR", "  ")
    assert settings.cache_dir == tmp_path / "xdg" / "ember"
    monkeypatch.setenv("EMBER_CACHE", "0")
    assert settings.cache == "off"
    monkeypatch.setenv("EMBER_CACHE", "")
    assert settings.cache == "on"


# -- ember cache info / clear ------------------------------------------------------------


def test_cache_info_and_clear(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = config.cache_dir
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"cache directory  {root}\n" in out and "does not exist yet" in out
    compile_and_check(monkeypatch, double, torch.randn(100))
    failures = EntryStore(root / "kernels" / "cpp-failed")
    failures.put("k0", {cpp_kernels.FAILURE_RECORD: b'{"message": "made up"}'})
    total = sum(e.bytes for e in scan(root))

    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "size cap         2048 MiB (EMBER_CACHE_SIZE_MB" in out
    assert f"entries          3, {total} bytes (0.0% of the cap)" in out
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("wr", "ke"))
    }
    assert rows["wrappers"][-2] == "1" and rows["kernels/cpp"][-2] == "1"
    assert rows["kernels/cpp-failed"][-2] == "1" and "failed C++ compiles" in out
    assert "C++ libraries" in out and "graph wrappers" in out

    assert main(["cache", "clear", "--failed"]) == 0
    assert "removed 1 records of failed compiles" in capsys.readouterr().out
    assert {e.store for e in scan(root)} == {"wrappers", "kernels/cpp"}

    wrappers = root / "wrappers"
    (wrappers / ".tmp-k1lled00").mkdir()  # left by a killed process long ago
    os.utime(wrappers / ".tmp-k1lled00", (0, 0))
    (wrappers / ".tmp-wr1t1ng0").mkdir()  # a write in progress
    (wrappers / ".build-runn1ng0").mkdir()  # a build in progress
    (wrappers / "notes").mkdir()  # not an entry, though it has a checksums.json
    (wrappers / "notes" / CHECKSUMS).write_text('{"key": "something else"}')
    (wrappers / "build-old").mkdir()  # nothing ember makes
    os.utime(wrappers / "build-old", (0, 0))
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 2 entries (") and out.rstrip().endswith(f"from {root}")
    assert scan(root) == []
    assert files_under(root) == sorted(
        ["kernels", "kernels/cpp", "kernels/cpp-failed", "wrappers"]
        + [f"wrappers/{n}" for n in [".tmp-wr1t1ng0", ".build-runn1ng0", "notes", "build-old"]]
        + [f"wrappers/notes/{CHECKSUMS}"]
    )
    assert root.stat().st_mode & 0o777 == 0o700  # the directory and its mode stay
    with config.scope(cache_size_mb=0, cache="off"):
        assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"cache directory  {root}\n" in out and "size cap         none" in out
    assert "EMBER_CACHE      off: nothing is read from or written to it" in out
    assert "entries          0, 0 bytes" in out


def test_cache_clear_removes_nothing_from_a_refused_directory(
    tmp_path: Path, private_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    EntryStore(shared / "wrappers").put("w1", {"w1.py": b"x = 1\n"})
    shared.chmod(0o777)
    fallback = EntryStore(private_tmp / f"ember-{os.geteuid()}" / "wrappers")
    fallback.put("w2", {"w2.py": b"x = 2\n"})
    fallback_root = fallback.directory.parent
    fallback_bytes = sum(e.bytes for e in scan(fallback_root))
    with config.scope(cache_dir=shared):
        assert main(["cache", "info"]) == 0
        out = capsys.readouterr().out
        assert "not used         it is writable by group or others (mode 0777)" in out
        assert "entries          1," in out
        assert main(["cache", "clear"]) == 0
        out = capsys.readouterr().out
    assert f"{shared} is not used by ember" in out and "nothing removed there" in out
    assert f"removed 1 entries ({fallback_bytes} bytes) from {fallback_root}" in out
    assert (shared / "wrappers" / "w1" / "w1.py").read_bytes() == b"x = 1\n"  # left alone
    assert (shared / "wrappers" / "w1" / CHECKSUMS).exists()
    assert fallback.get("w2") is None  # the cache ember used instead: cleared
