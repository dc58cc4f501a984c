"""Bounded in-process state: a process that compiles graph after graph (new shapes,
new models, a server that lives for weeks) must not keep every graph's traces.

`LRUCache` keeps the `limit` most recently used entries of a memo and forgets the
others (each costs its recomputation if it comes back); `RecentRecords` keeps the
last records of a log whose positions its readers count. Each user documents its
limit where it makes one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class LRUCache(Generic[K, V]):
    """A memo of at most `limit` entries; reading or writing an entry makes it the most
    recently used, and a write beyond the limit drops the least recently used one.
    Safe to share between threads (a compiled graph's launches run on the caller's
    thread and autograd's)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"an LRUCache holds at least one entry, not {limit}")
        self.limit = limit
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: T) -> V | T: ...
    def get(self, key: K, default: object = None) -> object:
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            return self._entries[key]

    def __getitem__(self, key: K) -> V:
        with self._lock:
            self._entries.move_to_end(key)  # KeyError where it is not held
            return self._entries[key]

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)

    def setdefault(self, key: K, value: V) -> V:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        self[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy: safe to iterate while
        other threads write)."""
        with self._lock:
            return list(self._entries.items())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class RecentRecords(Generic[T]):
    """An append-only log that keeps its last `limit` records.

    Positions count every record appended since the last `clear`, dropped or not, so
    the usual reading, `start = len(log)`, compile, `log[start:]`, keeps working: it
    sees the records appended since (those still held, which is all of them unless
    more than `limit` were appended in between). Iteration yields the records held."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a RecentRecords holds at least one record, not {limit}")
        self.limit = limit
        self._records: list[T] = []
        self._dropped = 0  # records appended and no longer held

    def append(self, record: T) -> None:
        self._records.append(record)
        if len(self._records) > self.limit:
            excess = len(self._records) - self.limit
            del self._records[:excess]
            self._dropped += excess

    def __len__(self) -> int:
        return self._dropped + len(self._records)

    @overload
    def __getitem__(self, position: int) -> T: ...
    @overload
    def __getitem__(self, position: slice) -> list[T]: ...
    def __getitem__(self, position: int | slice) -> T | list[T]:
        if isinstance(position, slice):
            wanted = range(*position.indices(len(self)))
            return [self._records[i - self._dropped] for i in wanted if i >= self._dropped]
        index = position + len(self) if position < 0 else position
        if not self._dropped <= index < len(self):
            raise IndexError(f"record {position} is not held (the last {self.limit} are)")
        return self._records[index - self._dropped]

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._records))

    def clear(self) -> None:
        self._records.clear()
        self._dropped = 0

    def __repr__(self) -> str:
        return f"RecentRecords({self._records!r}, dropped={self._dropped})"
