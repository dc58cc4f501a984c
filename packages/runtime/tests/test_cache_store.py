"""The on-disk compile cache cannot be fooled: each test plants one thing that the
cache used to load (or one way it used to fail) and checks that ember now computes
eager's values anyway, without loading it, and says so.

The attacks on C++ libraries run the compile that meets them in a fresh process: in
this one, dlopen would hand back the library already loaded from that path, whatever
the file now holds, and a library that does crash (SIGBUS) must not take the test
run with it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.codegen.cpp import CppSource
from ember.runtime import compiler, config, cpp_kernels, store
from ember.runtime.loader import load_module, write_source
from ember.runtime.store import CHECKSUMS, EntryStore, read_file, secure_directory
from ember.runtime.testing import no_eager_fallback

FUNCTIONS: dict[str, Any] = {"double": lambda t: t * 2 + 1, "triple": lambda t: t * 3 - 1}

# Compiles one function of FUNCTIONS (argv[1]) through ember with the cache at
# EMBER_CACHE_DIR and prints its largest difference from eager as JSON.
COMPILE_ONE = """
import json, sys
import torch
import ember.runtime
from ember.runtime.testing import no_eager_fallback
fn = {"double": lambda t: t * 2 + 1, "triple": lambda t: t * 3 - 1}[sys.argv[1]]
x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
with torch.no_grad(), no_eager_fallback():
    got = torch.compile(fn, backend="ember")(x)
print(json.dumps({"error": (got - fn(x)).abs().max().item()}))
"""


def compile_in_subprocess(cache: Path, which: str) -> tuple[float, str]:
    """(largest difference from eager, stderr) of COMPILE_ONE for `which`; fails the
    test, showing stderr, where the process does not finish cleanly."""
    # whole-graph caching off: each process must reach the kernel cache under test
    env = {
        **os.environ,
        "EMBER_CACHE_DIR": str(cache),
        "EMBER_STRICT": "1",
        "EMBER_COMPILE_CACHE": "0",
    }
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_ONE, which],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"exit status {result.returncode}:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])["error"], result.stderr


def libraries(cache: Path) -> list[Path]:
    return sorted((cache / "kernels" / "cpp").glob("k*/k*.so"))


@pytest.fixture(scope="module")
def compiled_caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two caches, each holding what a fresh process compiled for one function."""
    caches = {}
    for which in FUNCTIONS:
        cache = tmp_path_factory.mktemp("compiled") / "cache"
        error, _ = compile_in_subprocess(cache, which)
        assert error < 1e-5  # (fused multiply-adds round once)
        assert len(libraries(cache)) == 1
        caches[which] = cache
    return caches


def _compile_and_check(monkeypatch: pytest.MonkeyPatch, fn: Any, x: torch.Tensor) -> Any:
    """Compile `fn` through ember (no fallback) and check it against eager on `x`;
    the record of its graph. Graph names restart at each call, so compiling a function
    again generates the same wrapper (its source names its graph)."""
    monkeypatch.setattr(compiler, "_graph_ids", itertools.count())
    with torch.no_grad(), no_eager_fallback() as graphs:
        compiled: Any = torch.compile(fn, backend="ember")
        got = compiled(x)
    torch.testing.assert_close(got, fn(x))
    (record,) = graphs
    return record


def _plant_entry(directory: Path, key: str, files: dict[str, bytes]) -> None:
    """An entry with checksums that match, as anyone who can write there could make."""
    (directory / key).mkdir(parents=True)
    checks = {}
    for name, data in files.items():
        (directory / key / name).write_bytes(data)
        checks[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    record = {"format": 1, "key": key, "files": checks}
    (directory / key / CHECKSUMS).write_text(json.dumps(record))


# -- C++ libraries ------------------------------------------------------------------------


def test_a_library_copied_over_another_entry_is_not_loaded(
    compiled_caches: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(compiled_caches["double"], cache)
    (mine,) = libraries(cache)
    (other,) = libraries(compiled_caches["triple"])
    shutil.copyfile(other, mine)  # same kernel names and arguments, other arithmetic
    error, stderr = compile_in_subprocess(cache, "double")
    assert error < 1e-5  # (fused multiply-adds round once)
    assert f"cache entry {mine.parent} removed, to be rebuilt" in stderr
    assert mine.read_bytes() != other.read_bytes()
    assert EntryStore(mine.parent.parent).get(mine.parent.name) is not None  # rebuilt whole


def test_a_truncated_library_is_rebuilt_not_mapped(
    compiled_caches: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(compiled_caches["double"], cache)
    (library,) = libraries(cache)
    whole = library.stat().st_size
    with open(library, "r+b") as handle:
        handle.truncate(whole // 2)  # dlopen maps past the end: SIGBUS on the next run
    error, stderr = compile_in_subprocess(cache, "double")  # asserts a clean exit
    assert error < 1e-5  # (fused multiply-adds round once)
    assert "bytes, not" in stderr and str(library.parent) in stderr
    assert library.stat().st_size > whole // 2
    assert EntryStore(library.parent.parent).get(library.parent.name) is not None


MINIMAL_UNIT = 'extern "C" void ember_set_num_threads(int) {}\n'


def test_a_library_whose_source_differs_is_rebuilt(
    tmp_path: Path, warnings_seen: pytest.LogCaptureFixture
) -> None:
    """An entry whose files all match their checksums but hold another unit's source
    (a whole entry copied under another key, checksums rewritten) is not loaded."""
    unit = cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    key = unit.path.parent.name
    entry = EntryStore(tmp_path / "cpp").get(key)
    assert entry is not None
    files = dict(entry.files)
    files[f"{key}.cpp"] = b"// another unit\n" + files[f"{key}.cpp"]
    shutil.rmtree(entry.directory)
    _plant_entry(tmp_path / "cpp", key, files)
    again = cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    assert again.compile_seconds > 0  # built anew
    assert again.path.with_suffix(".cpp").read_text() == MINIMAL_UNIT
    assert "does not hold this translation unit" in warnings_seen.text


# -- CPU features in the C++ cache key -------------------------------------------------------


def test_the_key_holds_the_resolved_cpu_target_not_native(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compiler = cpp_kernels.find_compiler()
    targets = {"now": "compiler: -march=skylake-avx512 -mavx512f"}
    monkeypatch.setattr(cpp_kernels, "native_target", lambda _: targets["now"])
    avx512 = cpp_kernels.unit_key(MINIMAL_UNIT, compiler)
    first = cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    targets["now"] = "compiler: -march=skylake -mno-avx512f"
    assert cpp_kernels.unit_key(MINIMAL_UNIT, compiler) != avx512
    second = cpp_kernels.compile_cpp_source(CppSource(MINIMAL_UNIT, ()), cache_dir=tmp_path)
    assert second.path != first.path and second.compile_seconds > 0  # not shared
    targets["now"] = "compiler: -march=skylake-avx512 -mavx512f"
    assert cpp_kernels.unit_key(MINIMAL_UNIT, compiler) == avx512


def test_native_resolves_to_a_cpu_here() -> None:
    target = cpp_kernels.native_target(cpp_kernels.find_compiler())
    assert "-march=native" not in target
    assert target.startswith("compiler: ") or target.startswith("cpuinfo: ")
    assert len(target.split()) > 2  # a CPU and some of its features


def test_driver_output_of_gcc_and_clang_is_read() -> None:
    gcc = (
        "COLLECT_GCC_OPTIONS='-E' '-march=native'\n"
        ' /usr/lib/gcc/x86_64-linux-gnu/12/cc1 -E -quiet - "-march=znver3" -mavx2 '
        '-mno-avx512f --param "l1-cache-size=32" "-mtune=znver3" -dumpbase -\n'
    )
    assert cpp_kernels.resolved_target_flags(gcc) == [
        "-march=znver3",
        "-mavx2",
        "-mno-avx512f",
        "--param l1-cache-size=32",
        "-mtune=znver3",
    ]
    clang = (
        ' "/usr/bin/clang-17" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-E" '
        '"-target-cpu" "znver4" "-target-feature" "+avx512f" "-target-feature" "-amx-tile" '
        '"-tune-cpu" "generic" "-x" "c++" "-"\n'
    )
    assert cpp_kernels.resolved_target_flags(clang) == [
        "-target-cpu znver4",
        "-target-feature +avx512f",
        "-target-feature -amx-tile",
        "-tune-cpu generic",
    ]
    assert cpp_kernels.resolved_target_flags("clang: error: unknown argument\n") == []


def test_without_an_answer_from_the_compiler_the_cpu_flags_are_used() -> None:
    target = cpp_kernels.native_target.__wrapped__("/nonexistent/c++")
    assert target == "cpuinfo: " + cpp_kernels.cpuinfo_features()
    if Path("/proc/cpuinfo").exists():
        assert len(target.split()) > 3  # the machine and its flags


# -- wrappers and kernel sources -----------------------------------------------------------


def test_a_truncated_wrapper_is_rebuilt(
    monkeypatch: pytest.MonkeyPatch, warnings_seen: pytest.LogCaptureFixture
) -> None:
    x = torch.randn(64)
    record = _compile_and_check(monkeypatch, FUNCTIONS["double"], x)
    path = record.wrapper_path
    whole = path.read_text()
    path.write_text(whole[: whole.rstrip("\n").rfind("\n") + 1])  # its last line gone
    torch._dynamo.reset()
    again = _compile_and_check(monkeypatch, FUNCTIONS["double"], x)
    assert again.wrapper_path == path and path.read_text() == whole
    assert f"cache entry {path.parent} removed, to be rebuilt" in warnings_seen.text


def test_a_planted_pyc_is_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    x = torch.randn(64)
    record = _compile_and_check(monkeypatch, FUNCTIONS["double"], x)
    cache = config.cache_dir
    assert not list(cache.rglob("__pycache__")), "no bytecode is written"
    marker = tmp_path / "planted-code-ran"
    planted = tmp_path / "planted.py"
    planted.write_text(
        f"open({str(marker)!r}, 'w').close()\ndef call(args):\n    return (args[0] * 0,)\n"
    )
    sources = list(cache.rglob("*.py"))
    assert record.wrapper_path in sources
    for source in sources:  # bytecode that the import system takes without a look
        target = importlib.util.cache_from_source(str(source))
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
        py_compile.compile(str(planted), cfile=target, invalidation_mode=mode, doraise=True)
    torch._dynamo.reset()
    _compile_and_check(monkeypatch, FUNCTIONS["double"], x)
    assert not marker.exists()


def test_a_planted_wrapper_in_a_world_writable_cache_dir_is_not_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    x = torch.randn(64)
    key = _compile_and_check(monkeypatch, FUNCTIONS["double"], x).wrapper_path.parent.name
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    marker = tmp_path / "planted-code-ran"
    evil = f"open({str(marker)!r}, 'w').close()\ndef call(args):\n    return (args[0] * 0,)\n"
    _plant_entry(shared / "wrappers", key, {f"{key}.py": evil.encode()})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    torch._dynamo.reset()
    with config.scope(cache_dir=shared):
        record = _compile_and_check(monkeypatch, FUNCTIONS["double"], x)
    assert not marker.exists()
    fallback = tmp_path / "tmp" / f"ember-{os.geteuid()}" / "wrappers"
    assert record.wrapper_path is not None and record.wrapper_path.is_relative_to(fallback)
    assert f"ember will not keep generated code in {shared / 'wrappers'}" in warnings_seen.text
    assert "writable by group or others (mode 0777" in warnings_seen.text


def test_a_wrapper_that_does_not_parse_is_an_error_not_none(tmp_path: Path) -> None:
    path = write_source(tmp_path, "def call(args):\n    return args\n")
    key = path.parent.name
    shutil.rmtree(path.parent)
    _plant_entry(tmp_path, key, {path.name: b"def call(args):\n    return (\n"})
    with pytest.raises(SyntaxError):
        load_module(path, {})


def test_load_module_runs_only_checked_text(
    tmp_path: Path, warnings_seen: pytest.LogCaptureFixture
) -> None:
    path = write_source(tmp_path, "VALUE = 1\n")
    assert load_module(path, {}).VALUE == 1
    path.write_text("VALUE = 2\n")  # same length, other text
    with pytest.raises(ImportError, match="fails its check"):
        load_module(path, {})
    assert "does not match its SHA-256" in warnings_seen.text
    outside = tmp_path / "outside.py"
    outside.write_text("VALUE = 3\n")
    with pytest.raises(ImportError):
        load_module(outside, {})
    assert write_source(tmp_path, "VALUE = 1\n") == path  # rewritten
    assert load_module(path, {}).VALUE == 1


TRITON_KERNEL = """
import triton
import triton.language as tl

@triton.jit
def triple(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * 3, mask=i < n)
"""


def test_triton_reads_the_checked_source_of_a_loaded_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's jit takes each kernel's source through inspect (linecache): a module
    made from checked text, not imported, must still give it, and give that text even
    after the file changed on disk."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    path = write_source(tmp_path, TRITON_KERNEL, prefix="k")
    jitted = load_module(path, {}).triple
    assert jitted.src.startswith("def triple(x, out, n, BLOCK: tl.constexpr):")
    path.write_text(TRITON_KERNEL.replace("* 3", "* 4"))
    assert "* 3" in inspect.getsource(jitted.fn)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = write_source(tmp_path / "interpreted", TRITON_KERNEL, prefix="k")
    kernel = load_module(path, {}).triple
    x, out = torch.arange(50, dtype=torch.float32), torch.zeros(50)
    kernel[(2,)](x, out, 50, BLOCK=32)
    torch.testing.assert_close(out, x * 3)
    assert not list(tmp_path.rglob("__pycache__"))


# -- the store ------------------------------------------------------------------------


def test_an_entry_of_several_files_round_trips(tmp_path: Path) -> None:
    files = {"wrapper.py": b"x = 1\n", "kernel.bin": bytes(range(256)), "manifest.json": b"{}"}
    entries = EntryStore(tmp_path / "store")
    written = entries.put("a1", files)
    read = entries.get("a1")
    assert read is not None and dict(read.files) == files == dict(written.files)
    assert read.directory == tmp_path / "store" / "a1"
    assert sorted(p.name for p in read.directory.iterdir()) == sorted([*files, CHECKSUMS])
    assert entries.get("absent") is None
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "swap", "remove_file", "remove_checksums", "copied_entry", "symlink"],
)
def test_a_damaged_entry_is_removed_and_reported_absent(
    tmp_path: Path, damage: str, warnings_seen: pytest.LogCaptureFixture
) -> None:
    entries = EntryStore(tmp_path / "store")
    entry = entries.put("a1", {"one": b"1" * 100, "two": b"2" * 100})
    other = entries.put("b2", {"one": b"3" * 100, "two": b"4" * 100})
    if damage == "truncate":
        os.truncate(entry.path("two"), 50)
    elif damage == "swap":
        shutil.copyfile(other.path("one"), entry.path("one"))
    elif damage == "remove_file":
        entry.path("two").unlink()
    elif damage == "remove_checksums":
        entry.path(CHECKSUMS).unlink()
    elif damage == "copied_entry":
        shutil.rmtree(entry.directory)
        shutil.copytree(other.directory, entry.directory)
    else:
        entry.path("one").unlink()
        entry.path("one").symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").write_bytes(b"1" * 100)
    assert entries.get("a1") is None
    assert not entry.directory.exists()
    assert f"cache entry {entry.directory} removed" in warnings_seen.text
    assert entries.get("b2") is not None  # the other entry is untouched
    rebuilt = entries.put("a1", {"one": b"1" * 100, "two": b"2" * 100})
    assert entries.get("a1") == rebuilt


def test_put_replaces_a_bad_entry_and_keeps_a_good_one(tmp_path: Path) -> None:
    entries = EntryStore(tmp_path / "store")
    (entries.directory / "a1").mkdir()
    (entries.directory / "a1" / "junk").write_text("left by a crash")
    assert dict(entries.put("a1", {"f": b"new"}).files) == {"f": b"new"}
    # a second writer of the same key finds the first one's entry and keeps it
    assert dict(entries.put("a1", {"f": b"other"}).files) == {"f": b"new"}


def test_a_stale_verdict_does_not_remove_an_entry_published_since(tmp_path: Path) -> None:
    """Two processes find one bad entry; the first replaces it; the second's removal,
    judged on the bad one, must leave the new one alone."""
    entries = EntryStore(tmp_path / "store")
    old = entries.put("a1", {"f": b"old"})
    entries.discard("a1", "bad, as the first process found", entry=old)
    assert entries.get("a1") is None
    new = entries.put("a1", {"f": b"old"})  # the same files: only the publication differs
    entries.discard("a1", "bad, as the second process found", entry=old)
    assert entries.get("a1") == new
    entries.discard("a1", "no longer wanted")
    assert entries.get("a1") is None


def test_read_file_checks_the_entry_and_removes_nothing(tmp_path: Path) -> None:
    entries = EntryStore(tmp_path / "store")
    entry = entries.put("a1", {"f.py": b"x = 1\n"})
    assert read_file(entry.path("f.py")) == b"x = 1\n"
    assert read_file(entry.path("g.py")) is None
    entry.path("f.py").write_bytes(b"x = 2\n")
    assert read_file(entry.path("f.py")) is None
    assert entry.path("f.py").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "f.py").write_text("x = 3\n")
    assert read_file(plain / "f.py") is None and (plain / "f.py").exists()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "..", CHECKSUMS])
def test_keys_and_file_names_are_plain_names(tmp_path: Path, name: str) -> None:
    entries = EntryStore(tmp_path / "store")
    with pytest.raises(ValueError, match="plain file name"):
        entries.put("a1", {name: b""})
    if name != CHECKSUMS:
        with pytest.raises(ValueError, match="plain file name"):
            entries.get(name)


# -- the directory ---------------------------------------------------------------------


def test_a_new_cache_directory_is_private(tmp_path: Path) -> None:
    made = secure_directory(tmp_path / "a" / "b" / "c")
    assert made == tmp_path / "a" / "b" / "c"
    for directory in [tmp_path / "a", tmp_path / "a" / "b", made]:
        assert directory.stat().st_mode & 0o777 == 0o700
        assert directory.stat().st_uid == os.geteuid()


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile's directory, where fallbacks go, private to the test."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "tmp" / f"ember-{os.geteuid()}"


@pytest.mark.parametrize("where", ["itself", "parent"])
def test_a_world_writable_directory_is_refused(
    tmp_path: Path, private_tmp: Path, where: str, warnings_seen: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared" / "cache"
    shared.mkdir(parents=True)
    (shared if where == "itself" else shared.parent).chmod(0o777)
    assert secure_directory(shared) == private_tmp / "cache"
    assert (private_tmp / "cache").stat().st_mode & 0o777 == 0o700
    expected = "it is writable" if where == "itself" else f"its parent {shared.parent} is"
    assert f"ember will not keep generated code in {shared}: {expected}" in warnings_seen.text


def test_a_sticky_world_writable_parent_is_accepted(tmp_path: Path) -> None:
    shared = tmp_path / "like-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    assert secure_directory(shared / "mine") == shared / "mine"


def test_a_directory_owned_by_someone_else_is_refused(
    tmp_path: Path,
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    me = os.geteuid()
    with monkeypatch.context() as as_another_user:
        as_another_user.setattr(store, "_uid", lambda: me + 1)
        problem = store.directory_problem(theirs)
    assert problem is not None and f"owned by uid {me}" in problem
    assert store.directory_problem(theirs) is None  # to its owner, it is fine
    if me == 0:  # root can hand a directory to another user for real
        os.chown(theirs, 4321, 4321)
        assert secure_directory(theirs) == private_tmp / "theirs"
        assert "it is owned by uid 4321, not by this user (uid 0)" in warnings_seen.text


def test_a_symlinked_cache_directory_is_used_where_it_leads(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    assert secure_directory(tmp_path / "link") == real
