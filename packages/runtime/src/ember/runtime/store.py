"""The on-disk compile cache: what ember loads is what it wrote, where no one else writes.

Generated code in the cache runs in this process: a wrapper's source is executed, a
C++ kernel library is dlopen'ed. A cache entry that is not exactly what ember wrote
is therefore worse than no cache at all: a truncated library kills the process with
SIGBUS when its pages are touched (and every later process that finds it), a library
copied over another entry computes other values without a word, and a file planted by
another user runs with this user's rights. Two defences, both here:

- `secure_directory(path)`: a cache directory is created 0700 (each component that
  is missing) and is used only where this user owns it, neither group nor others can
  write to it, and no parent of it can be rewritten by anyone else (each parent is
  owned by this user or root and is not writable by group or others, unless sticky,
  as /tmp is). Anything else is refused with a warning on the "ember.runtime" logger
  that names the directory and what is wrong with it, and a private directory is used
  instead: `<tempdir>/ember-<uid>` when that passes the same check, else a fresh
  directory of this process's own. Symbolic links in the path are resolved once,
  and the real directory is what is checked and used.
- `EntryStore`: a directory of entries, each a set of named files under one key (one
  wrapper's source; a kernel library with its source and build flags; a failed
  compile's record; later a whole compiled artifact). `put` writes the files into a
  temporary directory of an unpredictable name (`mkdtemp` in the checked store
  directory; each file created with O_EXCL and O_NOFOLLOW, so nothing planted there
  is followed or reused) together with `checksums.json` (the key, each file's size and
  SHA-256, and a nonce that tells one publication from another), written last; every
  file and then the directory are fsync'ed, the directory is renamed into place in one
  step, and the store's directory is fsync'ed so that the rename lasts: a reader sees
  all of an entry or none of it, after a crash too. `get` reads every file of an entry
  and checks it against its checksums before returning anything; an entry that is
  incomplete, truncated, altered, or copied from another key is removed, logged and
  reported as absent, so the caller rebuilds it.

Where an entry cannot be written (a full disk, a read-only cache, a quota), nothing
of it stays in the store: `put` warns once per store and reason, and publishes the
entry in this process's private directory instead (`private_directory`, removed at
exit), so the compile that needed it goes on.

Size: a store made with a `SizeLimit` keeps every entry under the limit's root (all
stores of one cache together) within its bytes: after each `put` the least recently
used entries are removed until the total fits. `get` marks an entry used by setting
its directory's modification time. Entries used within the last `SizeLimit.recent`
seconds (a minute) are never removed, so that an entry one process has just checked
is not taken away before that process loads it (or its Triton compile workers read
it); the cap may therefore be exceeded for that long. What a process has already
loaded is safe from removal anyway: a wrapper's text is executed from memory, and a
dlopen'ed library stays mapped after its file is unlinked (POSIX keeps an unlinked
file's data while it is open or mapped). Processes that evict at once may remove a
few entries more than needed; never one that is being published (it is in a hidden
temporary directory until its rename).

The checksums catch accidents (a crash, a full disk, a file copied onto the wrong
entry); the directory check is what keeps other users out, and it is also what makes
loading by path safe. A library is dlopen'ed by path after its bytes were verified,
so there is a moment between the check and the load; nobody but this user (or root)
can replace the file in that moment, because nobody else can write to the entry's
directory or rename any directory above it. Files are opened without following
symbolic links, so a link planted in an entry fails verification instead of
redirecting the read.

POSIX only (ownership and modes). This module imports only the standard library:
the Triton compile worker, which must not import torch, loads it by file path to
verify the kernel sources it compiles (`read_file`).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ember.runtime")

CHECKSUMS = "checksums.json"  # in every entry, beside its files; reserved as a file name
_FORMAT = 1
# temporary directories in a store (an entry being written, one being removed, a
# build), as `tempfile.mkdtemp` names them: nothing else is ever taken for one
SCRATCH_NAME = re.compile(r"\.(tmp|trash|build)-[a-z0-9_]{8}")
STALE_SCRATCH_SECONDS = 3600.0  # a scratch directory this old was left by a killed process
RESCAN_SECONDS = 60.0  # a process rescans the cache for its cap at least this often
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_lock = threading.Lock()
_warned: set[str] = set()
_private: list[Path] = []  # this process's own fallback directory, once made
# per cache root: (time.monotonic() of the last scan, bytes then plus this process's
# writes since), so that a write does not rescan a cache that it cannot have filled
_estimates: dict[Path, tuple[float, int]] = {}


class UnsafeDirectoryError(OSError):
    """No directory that is safe to keep generated code in could be found or made."""


def _uid() -> int:
    return os.geteuid()


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _component_problem(path: Path, st: os.stat_result, uid: int, *, last: bool) -> str | None:
    """Why the existing component `path` (lstat `st`) of a cache directory's path makes
    that directory unsafe, or None. `last`: `path` is the cache directory itself."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (it was replaced while being checked)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if last:
        if st.st_uid != uid:
            return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if writable:
            return f"it is writable by group or others ({_mode(st)})"
        return None
    if st.st_uid not in (uid, 0):
        return f"its parent {path} is owned by uid {st.st_uid}, neither this user nor root"
    if writable and not st.st_mode & stat.S_ISVTX:
        return f"its parent {path} is writable by group or others ({_mode(st)}, not sticky)"
    return None


def _prepare(path: Path, *, create: bool) -> tuple[Path, str | None]:
    """`path` with symbolic links resolved, and why it is not safe to keep code in
    (None where it is). With `create`, missing components are made, each 0700."""
    real = Path(os.path.realpath(path))
    uid = _uid()
    components = [*reversed(real.parents), real]
    for index, component in enumerate(components):
        try:
            st = os.lstat(component)
        except FileNotFoundError:
            if not create:
                return real, f"{component} does not exist"
            try:
                os.mkdir(component, 0o700)
            except FileExistsError:
                pass  # made by someone else meanwhile: checked below like any other
            except OSError as exc:
                return real, f"{component} cannot be created ({exc.strerror})"
            try:
                st = os.lstat(component)
            except OSError as exc:
                return real, f"{component} cannot be examined ({exc.strerror})"
        except OSError as exc:
            return real, f"{component} cannot be examined ({exc.strerror})"
        problem = _component_problem(component, st, uid, last=index == len(components) - 1)
        if problem is not None:
            return real, problem
    return real, None


def directory_problem(path: Path) -> str | None:
    """Why the existing directory `path` is not safe to load generated code from (None
    where it is), by the rules of `secure_directory`; creates nothing."""
    return _prepare(path, create=False)[1]


def _warn_once(message: str) -> None:
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    log.warning("%s", message)


def _remove_at_exit(directory: Path, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that exits through atexit
        shutil.rmtree(directory, ignore_errors=True)


def private_directory() -> Path:
    """This process's own directory for generated code: made by `mkdtemp` (0700, an
    unpredictable name) in the system's temporary directory on first use, removed when
    the process exits."""
    with _lock:
        if not _private:
            made = Path(os.path.realpath(tempfile.mkdtemp(prefix="ember-")))
            atexit.register(_remove_at_exit, made, os.getpid())
            _private.append(made)
        return _private[0]


def shared_fallback() -> Path:
    """Where generated code goes when a cache directory is refused: `<tempdir>/ember-<uid>`
    (each store by its directory's name), unless that is refused too."""
    return Path(tempfile.gettempdir()) / f"ember-{_uid()}"


def _fallback_root() -> Path:
    """A private directory for generated code: `<tempdir>/ember-<uid>`, else one made
    for this process alone (removed at exit)."""
    shared = shared_fallback()
    real, problem = _prepare(shared, create=True)
    if problem is None:
        return real
    private = private_directory()
    _warn_once(f"not using {shared} for generated code either: {problem}; using {private}")
    return private


def secure_directory(path: Path) -> Path:
    """A directory safe to keep generated code in: `path` itself (made 0700 where
    missing, symbolic links resolved) when it passes the checks of this module's
    docstring, else a private fallback of the same name, with a warning once per
    process. Raises `UnsafeDirectoryError` when even the fallback fails its check."""
    real, problem = _prepare(path, create=True)
    if problem is None:
        return real
    fallback = _fallback_root() / (real.name or "cache")
    _warn_once(f"ember will not keep generated code in {path}: {problem}; using {fallback}")
    chosen, again = _prepare(fallback, create=True)
    if again is not None:
        raise UnsafeDirectoryError(f"no safe directory for generated code: {again}")
    return chosen


def _check_name(name: str, what: str) -> None:
    bad = not name or name in (".", "..") or name.startswith(".") or "/" in name or "\0" in name
    if bad or name == CHECKSUMS:
        raise ValueError(f"{what} {name!r} is not a plain file name (or is reserved)")


def _read(path: Path) -> bytes:
    """The bytes of the regular file at `path`, not following a symbolic link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def _write_new(path: Path, data: bytes) -> None:
    """Create the file `path` (never an existing one, never through a symbolic link),
    write `data` and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(fd)


def _fsync_directory(path: Path) -> None:
    """Make the names in the directory `path` durable (where the file system can)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # no fsync of directories here
            raise
    finally:
        os.close(fd)


def _remove_entry(target: Path) -> bool:
    """Remove the entry directory `target` in one step (renamed into a fresh hidden
    directory beside it, then deleted there): readers see the entry or nothing. False
    where it was gone already."""
    aside = Path(tempfile.mkdtemp(prefix=".trash-", dir=target.parent))
    try:
        os.rename(target, aside / target.name)
        return True
    except FileNotFoundError:
        return False
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _stamp(directory: Path) -> bytes | None:
    """The entry's checksums.json as it is now (None where there is none to read)."""
    try:
        return _read(directory / CHECKSUMS)
    except (OSError, ValueError):
        return None


def _verify(directory: Path, key: str) -> tuple[dict[str, bytes] | None, str | None, bytes | None]:
    """(the files of the entry at `directory`, checked against its checksums, None, its
    checksums.json) or (None, why it fails, its checksums.json where readable);
    (None, None, None) where there is no entry at all."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None, None, None
    if not stat.S_ISDIR(st.st_mode):
        return None, "it is not a directory", None
    try:
        stamp = _read(directory / CHECKSUMS)
    except FileNotFoundError:
        return None, f"it has no {CHECKSUMS}", None
    except OSError as exc:
        return None, f"its {CHECKSUMS} cannot be read ({exc})", None
    files, problem = _check_files(directory, key, stamp)
    return files, problem, stamp


def _check_files(
    directory: Path, key: str, stamp: bytes
) -> tuple[dict[str, bytes] | None, str | None]:
    try:
        recorded = json.loads(stamp)
    except ValueError as exc:
        return None, f"its {CHECKSUMS} cannot be read ({exc})"
    listed = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(listed, dict) or recorded.get("format") != _FORMAT:
        return None, f"its {CHECKSUMS} is not one this version writes"
    if recorded.get("key") != key:
        return None, f"its {CHECKSUMS} belongs to entry {recorded.get('key')!r}"
    files = {}
    for name, check in listed.items():
        if not isinstance(check, dict) or not isinstance(name, str):
            return None, f"its {CHECKSUMS} is malformed"
        try:
            _check_name(name, "file")
            data = _read(directory / name)
        except FileNotFoundError:
            return None, f"its file {name} is missing"
        except (OSError, ValueError) as exc:
            return None, f"its file {name} cannot be read ({exc})"
        if len(data) != check.get("size"):
            return None, f"its file {name} has {len(data)} bytes, not {check.get('size')}"
        if hashlib.sha256(data).hexdigest() != check.get("sha256"):
            return None, f"its file {name} does not match its SHA-256"
        files[name] = data
    return files, None


@dataclass(frozen=True)
class Entry:
    """An entry as verified: its directory and the checked contents of its files."""

    directory: Path
    files: Mapping[str, bytes]
    # its checksums.json as read: unique to this publication of the entry (a nonce)
    stamp: bytes | None = None

    def path(self, name: str) -> Path:
        return self.directory / name


@dataclass(frozen=True)
class SizeLimit:
    """A cap on the bytes of every entry under `root` (every store of one cache), kept
    by removing the least recently used entries after each `put`. Entries used within
    the last `recent` seconds are never removed."""

    root: Path
    max_bytes: int
    recent: float = 60.0


@dataclass(frozen=True)
class EntryInfo:
    """One entry found by `scan`."""

    directory: Path
    store: str  # its store's directory relative to the scanned root ("wrappers", ...)
    bytes: int  # its files' sizes, checksums.json included
    used: float  # last use: the entry directory's modification time (`get` sets it)


class EntryStore:
    """Verified entries (sets of named files, each set under one key) in a directory
    made safe by `secure_directory`; with `limit`, kept under a size cap."""

    def __init__(self, directory: Path, *, limit: SizeLimit | None = None) -> None:
        self.directory = secure_directory(Path(directory))
        self.limit = limit

    def get(self, key: str) -> Entry | None:
        """The entry under `key`, every file checked; None where there is none or where
        it fails its check (it is then removed, with a warning). A good entry is
        marked as used now (for the size cap's least-recently-used order)."""
        _check_name(key, "key")
        files, problem, stamp = _verify(self.directory / key, key)
        if problem is not None:
            self._remove(key, problem, stamp, check=True)
        if files is None:
            return None
        # (in a read-only cache the entry is still good: only its use is not recorded)
        with suppress(OSError):
            os.utime(self.directory / key, follow_symlinks=False)
        return Entry(self.directory / key, files, stamp)

    def put(self, key: str, files: Mapping[str, bytes]) -> Entry:
        """Publish `files` (name -> contents) under `key` in one step and return the
        entry. Where another writer published a good entry under `key` first, that
        one is kept and returned (a bad one is replaced). Where the store cannot be
        written (OSError: a full disk, a read-only directory), nothing is left in it,
        a warning says why, and the entry is published in this process's private
        directory instead. With a size limit, least recently used entries are then
        removed until the cache fits."""
        _check_name(key, "key")
        for name in files:
            _check_name(name, "file")
        try:
            entry = self._publish(key, files)
        except OSError as exc:
            if self.directory.is_relative_to(private_directory()):
                raise  # nowhere else to go
            spill = self._spill_store()
            why = exc.strerror or str(exc)
            _warn_once(
                f"cannot write to the cache directory {self.directory} ({why}); entries "
                f"that this process writes there go to {spill.directory} instead, which "
                "is removed when it exits"
            )
            return spill._publish(key, files)
        if self.limit is not None:
            self._keep_under_limit(self.limit, entry)
        return entry

    def _publish(self, key: str, files: Mapping[str, bytes]) -> Entry:
        scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.directory))
        try:
            checks = {}
            for name, data in files.items():
                _write_new(scratch / name, data)
                checks[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            # the nonce makes each publication's checksums.json its own (`discard`)
            record = {"format": _FORMAT, "key": key, "files": checks, "nonce": os.urandom(8).hex()}
            stamp = json.dumps(record, indent=1, sort_keys=True).encode()
            _write_new(scratch / CHECKSUMS, stamp)
            _fsync_directory(scratch)
            target = self.directory / key
            for _ in range(3):
                try:
                    os.rename(scratch, target)
                    _fsync_directory(self.directory)
                    return Entry(target, dict(files), stamp)
                except OSError as exc:
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                        raise
                existing = self.get(key)  # removes a bad one, so the next rename succeeds
                if existing is not None:
                    return existing
            raise OSError(errno.EEXIST, "cannot publish a cache entry", str(target))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # gone already after a rename

    def _spill_store(self) -> EntryStore:
        """The store, in this process's private directory, that takes the entries that
        this one cannot (one per store directory)."""
        tag = hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]
        return EntryStore(private_directory() / "unwritten" / f"{self.directory.name}-{tag}")

    def _keep_under_limit(self, limit: SizeLimit, fresh: Entry) -> None:
        """Evict for `limit` after `fresh` was published. The whole cache is scanned
        only where this process's writes may have filled it since its last scan, or
        that scan is older than RESCAN_SECONDS (other processes write too)."""
        root = Path(os.path.realpath(limit.root))
        if not self.directory.is_relative_to(root):  # refused: in a fallback directory
            shared = Path(os.path.realpath(shared_fallback()))
            root = shared if self.directory.is_relative_to(shared) else self.directory
        added = sum(len(data) for data in fresh.files.values()) + len(fresh.stamp or b"")
        now = time.monotonic()
        with _lock:
            when, total = _estimates.get(root, (-RESCAN_SECONDS, 0))
            if total + added <= limit.max_bytes and now - when < RESCAN_SECONDS:
                _estimates[root] = (when, total + added)
                return
        try:
            _, total = _evict(root, limit.max_bytes, (fresh.directory,), limit.recent)
        except OSError as exc:
            log.warning("could not keep the cache %s under its size cap: %s", root, exc)
            return
        with _lock:
            _estimates[root] = (now, total)

    @contextmanager
    def scratch(self, prefix: str = ".build-") -> Iterator[Path]:
        """A fresh private directory for building an entry's files: in the store's
        directory, or in this process's private one where the store cannot be written;
        removed afterwards."""
        try:
            made = tempfile.mkdtemp(prefix=prefix, dir=self.directory)
        except OSError:
            made = tempfile.mkdtemp(prefix=prefix, dir=private_directory())
        try:
            yield Path(made)
        finally:
            shutil.rmtree(made, ignore_errors=True)

    def discard(self, key: str, reason: str, *, entry: Entry | None = None) -> None:
        """Remove the entry under `key` (it failed a check: `reason`), with a warning.
        With `entry` (what `get` returned), only while `key` still holds that very
        publication: an entry that another process has published since is kept."""
        _check_name(key, "key")
        self._remove(
            key, reason, entry.stamp if entry is not None else None, check=entry is not None
        )

    def _remove(self, key: str, reason: str, stamp: bytes | None, *, check: bool) -> None:
        target = self.directory / key
        if not os.path.lexists(target) or (check and _stamp(target) != stamp):
            return  # gone, or replaced by another writer since it was judged
        try:
            _remove_entry(target)
        except OSError as exc:  # a read-only cache: the entry stays, and is not used
            log.warning("cache entry %s is not used (%s), nor removed: %s", target, reason, exc)
            return
        log.warning("cache entry %s removed, to be rebuilt: %s", target, reason)


def _is_entry(directory: Path) -> bool:
    """Whether `directory` is an entry that a store published (its checksums.json names
    it): what `evict` and `clear` may remove, and nothing else, whatever directory
    they are pointed at."""
    stamp = _stamp(directory)
    if stamp is None:
        return False
    try:
        record = json.loads(stamp)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("key") == directory.name


def _entry_bytes(directory: Path) -> int:
    total = 0
    with suppress(OSError), os.scandir(directory) as items:
        for item in items:
            with suppress(OSError):
                total += item.stat(follow_symlinks=False).st_size
    return total


def _walk(root: Path, depth: int = 4) -> tuple[list[EntryInfo], list[tuple[Path, float]]]:
    """The entries under `root` (directories holding a checksums.json, at most `depth`
    levels down) and the scratch directories (with their modification times) found
    beside them. Symbolic links are not followed."""
    entries: list[EntryInfo] = []
    scratch: list[tuple[Path, float]] = []

    def visit(directory: Path, relative: str, depth: int) -> None:
        try:
            items = list(os.scandir(directory))
        except OSError:
            return
        for item in items:
            try:
                if not item.is_dir(follow_symlinks=False):
                    continue
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            path = Path(item.path)
            if SCRATCH_NAME.fullmatch(item.name):
                scratch.append((path, st.st_mtime))
            elif _is_entry(path):
                entries.append(EntryInfo(path, relative or ".", _entry_bytes(path), st.st_mtime))
            elif depth > 0 and not item.name.startswith("."):
                visit(path, f"{relative}/{item.name}" if relative else item.name, depth - 1)

    visit(Path(root), "", depth)
    return entries, scratch


def scan(root: Path) -> list[EntryInfo]:
    """Every entry of every store under `root` (a cache directory)."""
    return _walk(root)[0]


def evict(
    root: Path, max_bytes: int, *, keep: Collection[Path] = (), recent: float = 60.0
) -> list[EntryInfo]:
    """Remove the least recently used entries under `root` until the rest take at most
    `max_bytes`, sparing those in `keep` and those used within `recent` seconds; also
    removes scratch directories left by killed processes. Returns what it removed."""
    return _evict(root, max_bytes, keep, recent)[0]


def _evict(
    root: Path, max_bytes: int, keep: Collection[Path], recent: float
) -> tuple[list[EntryInfo], int]:
    """`evict`, and the bytes of the entries left."""
    entries, scratch = _walk(root)
    now = time.time()
    for path, mtime in scratch:
        if now - mtime > STALE_SCRATCH_SECONDS:
            shutil.rmtree(path, ignore_errors=True)
    total = sum(e.bytes for e in entries)
    removed: list[EntryInfo] = []
    kept = {Path(k) for k in keep}
    for entry in sorted(entries, key=lambda e: e.used):
        if total <= max_bytes:
            break
        if entry.directory in kept or now - entry.used < recent:
            continue
        try:
            if os.lstat(entry.directory).st_mtime != entry.used:
                continue  # used since it was scanned
        except FileNotFoundError:
            total -= entry.bytes  # removed by another process meanwhile
            continue
        if _remove_entry(entry.directory):
            total -= entry.bytes
            removed.append(entry)
    if removed:
        log.info(
            "cache %s over its cap of %d bytes: removed %d least recently used entries (%d bytes)",
            root,
            max_bytes,
            len(removed),
            sum(e.bytes for e in removed),
        )
    return removed, total


def clear(root: Path, *, stores: Collection[str] | None = None) -> list[EntryInfo]:
    """Remove the entries under `root` (only those of `stores`, their directories
    relative to `root`, where given), each in one step, and scratch directories left
    by killed processes (older than an hour: younger ones belong to writes and builds
    in progress). `root`, the stores' directories and their modes stay. Returns what
    it removed. Raises `UnsafeDirectoryError` where `root` is not a directory safe to
    work in (nothing is removed there)."""
    problem = directory_problem(Path(root))
    if problem is not None:
        raise UnsafeDirectoryError(f"not clearing {root}: {problem}")
    entries, scratch = _walk(root)
    removed = []
    for entry in entries:
        if (stores is None or entry.store in stores) and _remove_entry(entry.directory):
            removed.append(entry)
    now = time.time()
    for path, mtime in scratch:
        if stores is None and now - mtime > STALE_SCRATCH_SECONDS:
            shutil.rmtree(path, ignore_errors=True)
    return removed


def read_file(path: Path) -> bytes | None:
    """The contents of `path`, a file of an entry that an `EntryStore` wrote (the
    entry is `path`'s directory, the store its parent), checked together with the
    rest of its entry. None, with a warning, where the store's directory is not safe,
    the entry fails its check, or has no such file; nothing is removed here (the
    store's next `get` does that)."""
    path = Path(path)
    directory = path.parent
    problem = directory_problem(directory.parent)
    if problem is not None:
        log.warning("not loading %s: the cache directory is not safe: %s", path, problem)
        return None
    files, problem, _ = _verify(directory, directory.name)
    if files is None or path.name not in files:
        why = problem or "it is not a file of a cache entry"
        log.warning("not loading %s: %s", path, why)
        return None
    return files[path.name]
