"""The compile cache as a whole: its size cap and the `ember cache` commands.

Generated code is kept under EMBER_CACHE_DIR (default `~/.cache/ember`; also when the
variable is empty) in stores of `ember.runtime.store`, one directory each:

- `wrappers/`: graph wrappers (Python source);
- `kernels/cpp/`: C++ kernel libraries, each with its source and build flags;
- `kernels/cpp-failed/`: C++ compiles that failed, one small record per key saying
  why, so that no later process runs the compiler on that unit again;
- `kernels/triton/`: Triton kernel sources.

`entry_store(directory)` opens a store; where `directory` lies in the cache directory,
the store keeps the whole cache (every store in it, written by any process) under
EMBER_CACHE_SIZE_MB (`store.SizeLimit`, least recently used entries removed first).
With EMBER_CACHE=off, `config.cache_dir` is a directory of the process's own, removed
at exit: nothing is read from or written to EMBER_CACHE_DIR.

`ember cache info` prints the directory, its entries and bytes by store, and the cap;
`ember cache clear` removes every entry (each in one step, so a process using the
cache meanwhile sees an entry whole or not at all), keeping the directory and its
mode; `--failed` removes only the failed compiles' records. Where the directory is
not one ember would use (another user's, or writable by others), both describe the
private directory used instead, and `clear` removes nothing from the refused one.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ember.runtime.config import config
from ember.runtime.store import (
    EntryInfo,
    EntryStore,
    SizeLimit,
    UnsafeDirectoryError,
    clear,
    directory_problem,
    scan,
    shared_fallback,
)
from ember.runtime.table import format_table

FAILED_CPP_STORE = "cpp-failed"  # beside "cpp", in the kernels directory
STORE_KINDS = {
    "wrappers": "graph wrappers",
    "kernels/cpp": "C++ libraries",
    f"kernels/{FAILED_CPP_STORE}": "failed C++ compiles",
    "kernels/triton": "Triton kernel sources",
    "graphs": "compiled graphs (artifacts)",
    "hints": "graphs compiled before (warm-start hints)",
}
MIB = 2**20


def size_limit() -> SizeLimit | None:
    """The cap of EMBER_CACHE_SIZE_MB over the cache directory (None for 0: no cap)."""
    megabytes = config.cache_size_mb
    return SizeLimit(config.cache_dir, megabytes * MIB) if megabytes > 0 else None


def entry_store(directory: Path) -> EntryStore:
    """An `EntryStore` in `directory`, keeping the cache under its size cap where
    `directory` lies in the cache directory."""
    limit = size_limit()
    if limit is not None:
        inside = Path(os.path.realpath(directory))
        if not inside.is_relative_to(os.path.realpath(limit.root)):
            limit = None
    return EntryStore(directory, limit=limit)


def configured_directory() -> Path:
    """EMBER_CACHE_DIR as set (whether or not EMBER_CACHE is on)."""
    return Path(config.get("cache_dir"))


def _in_use(root: Path) -> tuple[Path | None, str | None]:
    """The directory whose entries stand for the cache at `root` (`root` itself, or
    the shared fallback that ember uses instead of a refused one; None where neither
    exists yet) and why `root` is refused (None where it is not)."""
    if not os.path.lexists(root):
        return None, None
    problem = directory_problem(root)
    if problem is None:
        return Path(os.path.realpath(root)), None
    fallback = shared_fallback()
    usable = os.path.lexists(fallback) and directory_problem(fallback) is None
    return (Path(os.path.realpath(fallback)) if usable else None), problem


def _size(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count} bytes"


def _kind(store: str) -> str:
    name = store.rsplit("/", 1)[-1]
    fallback_names = {k.rsplit("/", 1)[-1]: what for k, what in STORE_KINDS.items()}
    return STORE_KINDS.get(store) or fallback_names.get(name, "")


def info() -> str:
    """What `ember cache info` prints."""
    root = configured_directory()
    megabytes = config.cache_size_mb
    cap = f"{megabytes} MiB" if megabytes else "none"
    lines = [f"cache directory  {root}"]
    if config.cache == "off":
        lines.append(
            "EMBER_CACHE      off: nothing is read from or written to it; each process "
            "compiles into a private directory removed at exit"
        )
    lines.append(f"size cap         {cap} (EMBER_CACHE_SIZE_MB; least recently used go first)")
    directory, problem = _in_use(root)
    if problem is not None:
        lines.append(f"not used         {problem}")
        instead = directory if directory is not None else shared_fallback()
        lines.append(f"used instead     {instead} (where it is safe; else one per process)")
    if directory is None:
        lines.append("entries          none (the directory does not exist yet)")
        return "\n".join(lines)
    entries = scan(directory)
    total = sum(e.bytes for e in entries)
    details = [f"{total} bytes"] if total >= MIB else []
    if megabytes:
        details.append(f"{100 * total / (megabytes * MIB):.1f}% of the cap")
    shown = f"{_size(total)} ({', '.join(details)})" if details else _size(total)
    lines.append(f"entries          {len(entries)}, {shown}")
    by_store: dict[str, list[EntryInfo]] = {}
    for entry in entries:
        by_store.setdefault(entry.store, []).append(entry)
    if by_store:
        rows = [
            [store, _kind(store), str(len(found)), str(sum(e.bytes for e in found))]
            for store, found in sorted(by_store.items())
        ]
        lines += ["", format_table(["store", "holds", "entries", "bytes"], rows)]
    return "\n".join(lines)


def clear_cache(*, failed_only: bool = False) -> tuple[str, int]:
    """What `ember cache clear` prints, and its exit status."""
    root = configured_directory()
    directory, problem = _in_use(root)
    notes = []
    if problem is not None:
        notes.append(f"{root} is not used by ember ({problem}): nothing removed there")
    if directory is None:
        return "\n".join([*notes, f"nothing to clear: {root} does not exist"]), 0
    stores = None
    if failed_only:
        stores = {e.store for e in scan(directory) if e.store.endswith(FAILED_CPP_STORE)}
    try:
        removed = clear(directory, stores=stores)
    except UnsafeDirectoryError as exc:
        return "\n".join([*notes, str(exc)]), 1
    what = "records of failed compiles" if failed_only else "entries"
    total = sum(e.bytes for e in removed)
    notes.append(f"removed {len(removed)} {what} ({_size(total)}) from {directory}")
    return "\n".join(notes), 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="cache_command", required=True)
    actions.add_parser("info", help="the cache directory, its entries and bytes, and its cap")
    clear_parser = actions.add_parser(
        "clear", help="remove the cache's entries (the directory and its mode stay)"
    )
    clear_parser.add_argument(
        "--failed",
        action="store_true",
        help="remove only the records of failed C++ compiles (after fixing the toolchain)",
    )


def run_cli(args: argparse.Namespace) -> int:
    if args.cache_command == "info":
        print(info())
        return 0
    text, status = clear_cache(failed_only=args.failed)
    print(text)
    return status
