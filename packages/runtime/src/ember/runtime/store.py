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
  wrapper's source; a kernel library with its source and build flags; later a whole
  compiled artifact). `put` writes the files into a temporary directory together with
  `checksums.json` (the key, each file's size and SHA-256, and a nonce that tells one
  publication from another), written last, then renames that directory into place in
  one step: a reader sees all of an entry or none of it. `get` reads every file of an
  entry and checks it against its checksums before returning anything; an entry that
  is incomplete, truncated, altered, or copied from another key is removed, logged and
  reported as absent, so the caller rebuilds it. Nothing is fsync'ed: an entry cut
  short by a crash fails its check and is rebuilt like any other.

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
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ember.runtime")

CHECKSUMS = "checksums.json"  # in every entry, beside its files; reserved as a file name
_FORMAT = 1

_lock = threading.Lock()
_warned: set[str] = set()
_private: list[Path] = []  # this process's own fallback directory, once made


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


def _fallback_root() -> Path:
    """A private directory for generated code: `<tempdir>/ember-<uid>`, else one made
    for this process alone (removed at exit)."""
    shared = Path(tempfile.gettempdir()) / f"ember-{_uid()}"
    real, problem = _prepare(shared, create=True)
    if problem is None:
        return real
    with _lock:
        if not _private:
            made = Path(tempfile.mkdtemp(prefix="ember-"))
            atexit.register(shutil.rmtree, made, True)
            _private.append(made)
        private = _private[0]
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
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def _write_new(path: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


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


class EntryStore:
    """Verified entries (sets of named files, each set under one key) in a directory
    made safe by `secure_directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = secure_directory(Path(directory))

    def get(self, key: str) -> Entry | None:
        """The entry under `key`, every file checked; None where there is none or where
        it fails its check (it is then removed, with a warning)."""
        _check_name(key, "key")
        files, problem, stamp = _verify(self.directory / key, key)
        if problem is not None:
            self._remove(key, problem, stamp, check=True)
        if files is None:
            return None
        return Entry(self.directory / key, files, stamp)

    def put(self, key: str, files: Mapping[str, bytes]) -> Entry:
        """Publish `files` (name -> contents) under `key` in one step and return the
        entry. Where another writer published a good entry under `key` first, that
        one is kept and returned (a bad one is replaced)."""
        _check_name(key, "key")
        for name in files:
            _check_name(name, "file")
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
            target = self.directory / key
            for _ in range(3):
                try:
                    os.rename(scratch, target)
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
        log.warning("cache entry %s removed, to be rebuilt: %s", target, reason)
        aside = Path(tempfile.mkdtemp(prefix=".trash-", dir=self.directory))
        try:
            os.rename(target, aside / key)  # one step: readers see the entry or nothing
        except FileNotFoundError:
            pass
        finally:
            shutil.rmtree(aside, ignore_errors=True)


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
