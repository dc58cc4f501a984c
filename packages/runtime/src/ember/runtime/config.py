"""Ember's configuration: every `EMBER_*` environment variable, declared once, typed.

`config.fallback` reads `EMBER_FALLBACK` at each access unless a `config.scope(...)`
overrides it, so tests and programs can change settings without touching the
environment, and nothing else in ember reads `os.environ`.

A value that does not parse is an `EmberConfigError` naming the variable, the value and
what it accepts, wherever it is read: guessing what a misspelt value meant would run
a program other than the one asked for, and quietly. `EmberConfig.validate` reads
every setting at once (each compile starts with it) and warns about `EMBER_*` names
that no setting has.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from ember.runtime.store import private_directory
from ember.runtime.threads import parse_reduction_schedule

T = TypeVar("T")


class EmberConfigError(ValueError):
    """A setting's value is not one it accepts.

    Its own class so that the compile driver can tell a user's mistake, which it lets
    through even when `EMBER_STRICT` is off, from a compiler failure, which it turns
    into an eager run."""

    def __init__(
        self, setting: str, value: object, expected: str, *, given_as: str | None = None
    ) -> None:
        given = given_as or f"{setting}={value!r}"
        super().__init__(f"{given} is not valid: expected {expected}")
        self.setting = setting
        self.value = value
        self.expected = expected


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("0/1, true/false, yes/no or on/off")


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
        raise ValueError(f"one of {', '.join(map(repr, allowed))}")
    return value


def _parse_check(text: str) -> str:
    lowered = text.strip().lower()
    if lowered in {"warn", "raise", "off"}:
        return lowered
    try:
        return "raise" if _parse_bool(lowered) else "off"
    except ValueError:
        pass
    raise ValueError("'warn', 'raise' (or 1, true, yes, on) or 'off' (or 0, false, no)")


def _parse_path(text: str) -> Path | None:
    return Path(text).expanduser() if text.strip() else None


def _parse_cache_dir(text: str) -> Path:
    # empty is the default, as unset (Path("") would be the current directory)
    return Path(text).expanduser() if text.strip() else _default_cache_dir()


def _parse_switch(text: str) -> str:
    """'on' or 'off' (empty: 'on', the default)."""
    if not text.strip():
        return "on"
    try:
        return "on" if _parse_bool(text) else "off"
    except ValueError:
        raise ValueError("'on' or 'off' (or 1/0, true/false, yes/no)") from None


def _parse_count(text: str) -> int:
    try:
        count = int(text.strip())
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError("a whole number, 0 or more")
    return count


def _as_text(value: object) -> str:
    """A `scope(...)` value as the environment would spell it, so that one parser per
    setting checks both (a bool as 1/0, None as unset-but-empty, a path as itself)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return ""
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if isinstance(value, str | int):
        return str(value)
    raise ValueError("a string, a whole number, a bool, a path or None")


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
            raise EmberConfigError(self.env, raw, str(exc)) from None

    def accept(self, name: str, value: object) -> T:
        """`value`, given as `scope(name=value)`, parsed as the environment's text would be."""
        try:
            return self.parse(_as_text(value))
        except ValueError as exc:
            given = f"config.scope({name}={value!r}) (for {self.env})"
            raise EmberConfigError(self.env, value, str(exc), given_as=given) from None


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
        "Directory for debug dumps: one subdirectory per process run, in it one per graph "
        "with its repro script, graphs before/after passes, IR, schedule, kernels, "
        "wrapper and what `ember explain DIR` reads.",
    ),
    "profile": Knob(
        "EMBER_PROFILE",
        _parse_bool,
        lambda: False,
        "With EMBER_DEBUG_DIR: time every kernel and ATen call of each compiled graph "
        "(host clock on CPUs, CUDA events on GPUs; CUDA graphs off) and write the times "
        "with this machine's measured roofs to the graph's debug directory at exit, for "
        "`ember explain` (1), or not (0, default).",
    ),
    "cache_dir": Knob(
        "EMBER_CACHE_DIR",
        _parse_cache_dir,
        _default_cache_dir,
        "Where generated code is written (default, also when empty: ~/.cache/ember): "
        "used only where it is yours and no one else can write to it or above it; else "
        "a private directory, with a warning.",
    ),
    "cache": Knob(
        "EMBER_CACHE",
        _parse_switch,
        lambda: "on",
        "'on' (default): generated code is kept in EMBER_CACHE_DIR and reused by later "
        "processes; 'off': nothing is read from or written to it, code is compiled into "
        "a private temporary directory removed at exit.",
    ),
    "cache_size_mb": Knob(
        "EMBER_CACHE_SIZE_MB",
        _parse_count,
        lambda: 2048,
        "Size cap of the cache in MiB (default 2048; 0: no cap): after each write the "
        "least recently used entries are removed until the cache fits.",
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
        _parse_count,
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
        "and the kernels around them channels-last on CUDA, in inference and training, "
        "and on the CPU each convolution whose weight is no larger than its input; "
        "'channels-last' runs every convolution channels-last on every device; 'keep' "
        "leaves layouts as the model gives them.",
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
    "autograd": Knob(
        "EMBER_AUTOGRAD",
        lambda text: _choice(text, ("lean", "aot")),
        lambda: "lean",
        "What runs compiled graphs: 'lean' (default) ember's own runtime (an "
        "autograd.Function for training) wherever the graph needs none of AOTAutograd's "
        "runtime wrappers (ember.runtime.lean_runtime), 'aot' AOTAutograd's runtime always.",
    ),
    "cpu_gemm": Knob(
        "EMBER_CPU_GEMM",
        lambda text: _choice(text, ("auto", "onednn", "aten")),
        lambda: "auto",
        "CPU float32 matmuls (with their bias, and an activation only they read): "
        "'auto' (default) as oneDNN linears where a fixed rule by shape, operand layout "
        "and CPU family says so (measured on AMD Zen 5 with AVX-512; ATen's addmm/mm on "
        "other CPUs), else ATen's; 'onednn' always; 'aten' never.",
    ),
    "reduction_schedule": Knob(
        "EMBER_REDUCTION_SCHEDULE",
        parse_reduction_schedule,
        lambda: "auto",
        "OpenMP schedule of CPU reduction kernels' loops over rows: 'auto' (default) "
        "'static' on one thread and 'guided' on more, chosen per loop from its "
        "thread count; or one of 'static', 'dynamic', 'guided', each optionally with "
        "',<chunk>', for every thread count. Applied as kernel libraries load (no "
        "rebuild); results are the same bits under every schedule.",
    ),
    "depthwise": Knob(
        "EMBER_DEPTHWISE",
        lambda text: _choice(text, ("auto", "loops", "aten")),
        lambda: "auto",
        "2-d depthwise convolutions and their backward: 'loops' as generated kernels "
        "that fuse with the batch norms and activations around them; 'aten' as ATen "
        "calls (cuDNN, oneDNN); 'auto' (default): each device's choice, ATen calls on "
        "every device for now (the CPU: oneDNN's kernels measured faster; CUDA: the "
        "generated kernels have not yet run on a GPU).",
    ),
    "matmul_templates": Knob(
        "EMBER_MATMUL_TEMPLATES",
        lambda text: _choice(text, ("auto", "on", "off")),
        lambda: "auto",
        "CUDA matmuls (mm, addmm, bmm) as Triton templates with their bias, activation, "
        "residual, scale and cast fused in as an epilogue: 'on' wherever such consumers "
        "can fuse; 'off' never (cuBLAS, then separate kernels); 'auto' (default) "
        "measures each matmul at compile time (the tuned template against cuBLAS plus "
        "a copy of the separate epilogue's bytes) and keeps the template only where it "
        "is at least 5% faster (ember.runtime.matmul_choice); symbolic sizes stay cuBLAS. "
        "On the CPU, 'auto' and 'on' make float32 matmuls with their epilogues C++ "
        "kernels (blocked over the threads, torch's BLAS sgemm per block) wherever "
        "torch exports sgemm_; 'off' keeps ATen's addmm/mm.",
    ),
    "cudagraphs": Knob(
        "EMBER_CUDAGRAPHS",
        lambda text: _choice(text, ("auto", "on", "off")),
        lambda: "auto",
        "Replay CUDA graphs' launches from recorded CUDA graphs: 'auto' (default) "
        "where legal, saying why not in the info log; 'on' likewise, saying why not "
        "as a warning (`mode=\"reduce-overhead\"`); 'off' never.",
    ),
    "compile_cache": Knob(
        "EMBER_COMPILE_CACHE",
        _parse_bool,
        lambda: True,
        "Keep each compiled graph's artifact in the cache directory and load it in "
        "later processes instead of compiling again (1, default), or not (0).",
    ),
    "logs": Knob(
        "EMBER_LOGS",
        lambda text: _choice(text, ("", "warning", "info", "debug")),
        lambda: "",
        "Log level of the 'ember' loggers: '' (warnings), 'info' or 'debug'.",
    ),
}

# EMBER_* variables that are not settings, so not misspellings of one: the golden-file
# tests' switch to rewrite their files.
_NOT_SETTINGS = frozenset({"EMBER_UPDATE_GOLDEN"})
_warned_unknown: set[str] = set()


def unknown_variables() -> dict[str, str | None]:
    """Each `EMBER_*` variable in the environment that no setting reads, with the
    setting's variable it most likely meant (None when none is close)."""
    known = [knob.env for knob in KNOBS.values()]
    # compared without the shared prefix, which would make any two names look alike
    stems = {env.removeprefix("EMBER_"): env for env in known}
    unknown = {}
    for name in sorted(os.environ):
        if name.startswith("EMBER_") and name not in known and name not in _NOT_SETTINGS:
            close = difflib.get_close_matches(name.removeprefix("EMBER_"), stems, n=1)
            unknown[name] = stems[close[0]] if close else None
    return unknown


def _unknown_message(name: str, guess: str | None) -> str:
    hint = f"did you mean {guess}?" if guess else "`ember config` lists the settings"
    return f"{name} is set, but ember has no such setting and ignores it; {hint}"


def warn_unknown_variables() -> None:
    """One warning per process for each unknown `EMBER_*` variable: a misspelt name
    would otherwise leave its setting at the default without a word."""
    for name, guess in unknown_variables().items():
        if name not in _warned_unknown:
            _warned_unknown.add(name)
            warnings.warn(_unknown_message(name, guess), UserWarning, stacklevel=3)


def cache_directory(cache: str, directory: str | os.PathLike[str]) -> Path:
    """`config.cache_dir` for the settings EMBER_CACHE=`cache` and
    EMBER_CACHE_DIR=`directory`: for code that runs after its compile (a first call,
    a lazily loaded kernel) with the values its compile read."""
    if cache == "off":
        return private_directory() / "cache"
    return Path(directory)


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
    def profile(self) -> bool:
        return bool(self.get("profile"))

    @property
    def cache_dir(self) -> Path:
        """Where generated code goes: EMBER_CACHE_DIR, or with EMBER_CACHE=off a
        directory of this process's own (removed at exit)."""
        return cache_directory(self.cache, self.get("cache_dir"))

    @property
    def cache(self) -> str:
        """'on' or 'off' (`scope(cache=False)` means 'off')."""
        return str(self.get("cache"))

    @property
    def cache_size_mb(self) -> int:
        return int(self.get("cache_size_mb"))

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
        """The device types whose convolution graphs run channels-last ('auto': those
        whose `DeviceDefaults.channels_last` is set, CUDA's)."""
        from ember.runtime.devices import DEFAULTS  # imported at the first compile only

        auto = tuple(name for name, defaults in DEFAULTS.items() if defaults.channels_last)
        return {"auto": auto, "channels-last": ("cuda", "cpu"), "keep": ()}[self.layout]

    @property
    def layout_by_convolution(self) -> tuple[str, ...]:
        """The device types on which each convolution takes the layout its shapes
        favour (ember.graphpasses.favours_channels_last; 'auto': those whose
        `DeviceDefaults.channels_last_by_convolution` is set, the CPU's)."""
        from ember.runtime.devices import DEFAULTS

        if self.layout != "auto":
            return ()
        return tuple(n for n, d in DEFAULTS.items() if d.channels_last_by_convolution)

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
    def autograd(self) -> str:
        return str(self.get("autograd"))

    @property
    def cpu_gemm(self) -> str:
        return str(self.get("cpu_gemm"))

    @property
    def reduction_schedule(self) -> str:
        return str(self.get("reduction_schedule"))

    @property
    def depthwise(self) -> str:
        return str(self.get("depthwise"))

    @property
    def matmul_templates(self) -> str:
        return str(self.get("matmul_templates"))

    @property
    def cudagraphs(self) -> str:
        return str(self.get("cudagraphs"))

    @property
    def logs(self) -> str:
        return str(self.get("logs"))

    @contextmanager
    def scope(self, **overrides: Any) -> Iterator[EmberConfig]:
        """Override settings inside a `with` block (for tests and scripts)."""
        unknown = set(overrides) - set(KNOBS)
        if unknown:
            raise KeyError(f"unknown ember settings {sorted(unknown)}; known: {sorted(KNOBS)}")
        # parsed here, so that a bad value fails at the `with`, not in a compile later
        parsed = {name: KNOBS[name].accept(name, value) for name, value in overrides.items()}
        with self.frozen(parsed):
            yield self

    def snapshot(self) -> dict[str, Any]:
        """Every setting's value now (the environment under the overrides in force):
        what a backend call compiles its graphs with, however late (see `frozen`)."""
        return {name: self.get(name) for name in KNOBS}

    @contextmanager
    def frozen(self, snapshot: dict[str, Any]) -> Iterator[EmberConfig]:
        """The settings of `snapshot` (values already parsed; others as they were)
        inside a `with` block."""
        saved = dict(self._overrides)
        self._overrides.update(snapshot)
        try:
            yield self
        finally:
            self._overrides = saved

    def errors(self) -> dict[str, EmberConfigError]:
        """The settings whose value is not valid, with the error reading each raises."""
        found = {}
        for name in KNOBS:
            try:
                self.get(name)
            except EmberConfigError as exc:
                found[name] = exc
        return found

    def validate(self) -> None:
        """Read every setting, raising the first bad one's `EmberConfigError`, and warn
        (once) about unknown `EMBER_*` variables. Each compile starts here, so that a
        bad value fails the first compile even where the code paths that compile takes
        never read that setting (a training-only one in an inference graph)."""
        warn_unknown_variables()
        for error in self.errors().values():
            raise error

    def describe(self) -> str:
        """One line per setting with its value; a bad value is marked as such, with
        its error below it, rather than raised, since this is where users look to see
        what is wrong."""
        errors = self.errors()
        width = max(len(k.env) for k in KNOBS.values())
        lines = []
        for name, k in KNOBS.items():
            shown = f"INVALID {errors[name].value!r}" if name in errors else str(self.get(name))
            lines.append(f"{k.env:<{width}} {shown:<24} {k.doc}")
            if name in errors:
                lines.append(f"{'':<{width}} ^ {errors[name]}")
        lines += [_unknown_message(n, guess) for n, guess in unknown_variables().items()]
        return "\n".join(lines)


config = EmberConfig()
