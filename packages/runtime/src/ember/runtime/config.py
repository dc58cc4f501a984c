"""Ember's configuration: every `EMBER_*` environment variable, declared once, typed.

`config.fallback` reads `EMBER_FALLBACK` at each access unless a `config.scope(...)`
overrides it, so tests and programs can change settings without touching the
environment, and nothing else in ember reads `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected 0/1, true/false, yes/no or on/off, got {text!r}")


def _default_compile_workers() -> int:
    """One Triton compile worker per core but one (this process traces meanwhile), at
    most 16, shared among the processes a launcher started on this machine
    (LOCAL_WORLD_SIZE, set by torchrun: eight ranks on 16 cores get one worker each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(0, min(16, ((cores or 1) - ranks) // ranks))


def _choice(text: str, allowed: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value not in allowed:
        raise ValueError(f"expected one of {', '.join(allowed)}")
    return value


def _parse_check(text: str) -> str:
    lowered = text.strip().lower()
    if lowered in {"warn", "raise"}:
        return lowered
    return "raise" if _parse_bool(lowered) else "off"


def _parse_path(text: str) -> Path | None:
    return Path(text).expanduser() if text.strip() else None


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One setting: its environment variable, parser, default and meaning."""

    env: str
    parse: Callable[[str], T]
    default: Callable[[], T]
    doc: str

    def read(self) -> T:
        raw = os.environ.get(self.env)
        if raw is None:
            return self.default()
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.env}={raw!r}: {exc}") from exc


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ember"


KNOBS: dict[str, Knob[Any]] = {
    "fallback": Knob(
        "EMBER_FALLBACK",
        _parse_bool,
        lambda: True,
        "Ops without a lowering run as ATen calls (1) or are an error naming the op (0).",
    ),
    "strict": Knob(
        "EMBER_STRICT",
        _parse_bool,
        lambda: False,
        "A graph that fails to compile raises (1) instead of running eagerly (0).",
    ),
    "check": Knob(
        "EMBER_CHECK",
        _parse_check,
        lambda: "off",
        "Also run each compiled graph eagerly and compare: raise (1), warn, or off (0).",
    ),
    "index_checks": Knob(
        "EMBER_INDEX_CHECKS",
        _parse_bool,
        lambda: True,
        "Check data-dependent indices (embedding, gather, index, scatter, ...) against "
        "their dimension and raise as eager does (1, default), or trust them (0).",
    ),
    "debug_dir": Knob(
        "EMBER_DEBUG_DIR",
        _parse_path,
        lambda: None,
        "Directory for graphs before/after passes, IR, schedule, wrapper and C++ kernels.",
    ),
    "cache_dir": Knob(
        "EMBER_CACHE_DIR",
        lambda text: Path(text).expanduser(),
        _default_cache_dir,
        "Where generated code is written (default ~/.cache/ember).",
    ),
    "kernels": Knob(
        "EMBER_KERNELS",
        lambda text: _choice(text, ("auto", "extern", "reference")),
        lambda: "auto",
        "Generated kernels: 'auto' (C++ on CPU, Triton on CUDA), 'extern' (ATen kernels "
        "only) or 'reference' (torch-op interpreter, for debugging).",
    ),
    "compile_workers": Knob(
        "EMBER_COMPILE_WORKERS",
        lambda text: max(0, int(text)),
        lambda: _default_compile_workers(),
        "Worker processes that compile Triton kernels for CUDA graphs alongside this "
        "process (each imports Triton only); by default one per core but one, at most "
        "16; 0 compiles in threads here.",
    ),
    "layout": Knob(
        "EMBER_LAYOUT",
        lambda text: _choice(text, ("auto", "channels-last", "keep")),
        lambda: "auto",
        "Memory layout of convolution graphs: 'auto' (default) runs 2-D convolutions "
        "and the kernels around them channels-last on CUDA, in inference and training; "
        "'channels-last' does so on every device (CPU included); 'keep' leaves layouts "
        "as the model gives them.",
    ),
    "recompute": Knob(
        "EMBER_RECOMPUTE",
        lambda text: _choice(text, ("off", "cuda", "all")),
        lambda: "cuda",
        "Recompute a value read by several kernels instead of storing it where it is "
        "wider than its inputs (a batch norm backward's float32 ReLU gradient): 'cuda' "
        "(default) for CUDA graphs, 'all' for every device too, 'off'.",
    ),
    "partitioner": Knob(
        "EMBER_PARTITIONER",
        lambda text: _choice(text, ("auto", "mincut", "save-all")),
        lambda: "auto",
        "How training graphs split into forward and backward: 'mincut' recomputes cheap "
        "pointwise values in the backward instead of saving them; 'save-all' saves every "
        "value the backward reads; 'auto' (default): mincut for CUDA graphs, save-all "
        "for CPU ones.",
    ),
    "backward": Knob(
        "EMBER_BACKWARD",
        lambda text: _choice(text, ("auto", "eager", "lazy")),
        lambda: "auto",
        "When a training graph's backward compiles: 'eager' with its forward (its "
        "kernels compile while the forward's do and while the forward runs), 'lazy' at "
        "the first backward call (no compile for a forward never differentiated); "
        "'auto' (default): eager for CUDA graphs, lazy for CPU ones.",
    ),
    "logs": Knob(
        "EMBER_LOGS",
        lambda text: text.strip().lower(),
        lambda: "",
        "Log level of the 'ember' loggers: '', 'info' or 'debug'.",
    ),
}


class EmberConfig:
    """The settings, read from the environment on each access unless overridden."""

    def __init__(self) -> None:
        self._overrides: dict[str, Any] = {}

    @overload
    def get(self, name: str) -> Any: ...
    @overload
    def get(self, name: str, default: T) -> Any: ...
    def get(self, name: str, default: Any = None) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return KNOBS[name].read()

    @property
    def fallback(self) -> bool:
        return bool(self.get("fallback"))

    @property
    def strict(self) -> bool:
        return bool(self.get("strict"))

    @property
    def check(self) -> str:
        """'off', 'raise' or 'warn'; `scope(check=True)` means 'raise'."""
        value = self.get("check")
        if isinstance(value, bool):
            return "raise" if value else "off"
        return _parse_check(str(value))

    @property
    def index_checks(self) -> bool:
        return bool(self.get("index_checks"))

    @property
    def debug_dir(self) -> Path | None:
        value = self.get("debug_dir")
        return Path(value) if value is not None else None

    @property
    def cache_dir(self) -> Path:
        return Path(self.get("cache_dir"))

    @property
    def kernels(self) -> str:
        return str(self.get("kernels"))

    @property
    def compile_workers(self) -> int:
        return int(self.get("compile_workers"))

    @property
    def layout(self) -> str:
        return str(self.get("layout"))

    @property
    def layout_devices(self) -> tuple[str, ...]:
        """The device types whose convolution graphs run channels-last."""
        return {"auto": ("cuda",), "channels-last": ("cuda", "cpu"), "keep": ()}[self.layout]

    @property
    def recompute(self) -> str:
        return str(self.get("recompute"))

    @property
    def partitioner(self) -> str:
        return str(self.get("partitioner"))

    @property
    def backward(self) -> str:
        return str(self.get("backward"))

    @property
    def logs(self) -> str:
        return str(self.get("logs"))

    @contextmanager
    def scope(self, **overrides: Any) -> Iterator[EmberConfig]:
        """Override settings inside a `with` block (for tests and scripts)."""
        unknown = set(overrides) - set(KNOBS)
        if unknown:
            raise KeyError(f"unknown ember settings {sorted(unknown)}; known: {sorted(KNOBS)}")
        saved = dict(self._overrides)
        self._overrides.update(overrides)
        try:
            yield self
        finally:
            self._overrides = saved

    def describe(self) -> str:
        return "\n".join(f"{k.env:<18} {self.get(name)!s:<24} {k.doc}" for name, k in KNOBS.items())


config = EmberConfig()
