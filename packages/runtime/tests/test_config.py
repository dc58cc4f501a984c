from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from ember.runtime import compile_graph, compile_records, config
from ember.runtime.config import KNOBS, EmberConfig, EmberConfigError
from ember.runtime.logs import setup_logging

# the module, which `ember.runtime.config` names only through sys.modules: the package
# binds that attribute to the settings object
config_module = importlib.import_module("ember.runtime.config")


def test_environment_is_read_at_each_access(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EmberConfig()
    monkeypatch.setenv("EMBER_FALLBACK", "0")
    assert cfg.fallback is False
    monkeypatch.setenv("EMBER_FALLBACK", "yes")
    assert cfg.fallback is True
    monkeypatch.setenv("EMBER_DEBUG_DIR", "/tmp/x")
    assert cfg.debug_dir == Path("/tmp/x")


def test_scope_overrides_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EmberConfig()
    monkeypatch.delenv("EMBER_STRICT", raising=False)
    with cfg.scope(strict=True):
        assert cfg.strict is True
        with cfg.scope(strict=False):
            assert cfg.strict is False
        assert cfg.strict is True
    assert cfg.strict is False


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_STRICT", "maybe")
    with pytest.raises(ValueError, match="EMBER_STRICT='maybe'"):
        _ = EmberConfig().strict  # EmberConfigError is a ValueError


def test_unknown_setting_is_an_error() -> None:
    with pytest.raises(KeyError, match="unknown ember settings"), EmberConfig().scope(nope=1):
        pass


@pytest.mark.parametrize(
    ("cores", "ranks", "workers"),
    [(16, None, 15), (16, "8", 1), (64, None, 16), (2, None, 1), (1, None, 0), (16, "x", 15)],
)
def test_compile_workers_default_to_the_cores_left_per_local_rank(
    monkeypatch: pytest.MonkeyPatch, cores: int, ranks: str | None, workers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)), raising=False)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    monkeypatch.delenv("EMBER_COMPILE_WORKERS", raising=False)
    assert EmberConfig().compile_workers == workers


# A value each setting refuses (EMBER_DEBUG_DIR and EMBER_CACHE_DIR take any path, so
# they have none; an empty EMBER_CACHE_DIR is the default).
BAD_VALUES = {
    "EMBER_FALLBACK": "maybe",
    "EMBER_STRICT": "maybe",
    "EMBER_CHECK": "sometimes",
    "EMBER_CACHE": "sometimes",
    "EMBER_CACHE_SIZE_MB": "2G",
    "EMBER_KERNELS": "bogus",
    "EMBER_COMPILE_WORKERS": "-1",
    "EMBER_LAYOUT": "nhwc",
    "EMBER_RECOMPUTE": "some",
    "EMBER_PARTITIONER": "greedy",
    "EMBER_BACKWARD": "never",
    "EMBER_REDUCTION_SCHEDULE": "runtime",
    "EMBER_LOGS": "loud",
}


@pytest.mark.parametrize(("env", "value"), sorted(BAD_VALUES.items()))
def test_every_bad_value_is_an_error_naming_variable_value_and_choices(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    name = next(name for name, knob in KNOBS.items() if knob.env == env)
    monkeypatch.setenv(env, value)
    with pytest.raises(EmberConfigError, match=rf"^{env}={value!r} is not valid: expected ") as e:
        EmberConfig().get(name)
    assert e.value.setting == env and e.value.value == value
    with pytest.raises(EmberConfigError, match=env):
        EmberConfig().validate()


def test_check_error_names_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CHECK", "sometimes")
    with pytest.raises(EmberConfigError, match=r"EMBER_CHECK='sometimes'.*'warn', 'raise'.*'off'"):
        _ = EmberConfig().check
    for text, meaning in [("warn", "warn"), ("1", "raise"), ("off", "off"), ("no", "off")]:
        monkeypatch.setenv("EMBER_CHECK", text)
        assert EmberConfig().check == meaning


def test_scope_parses_its_values_and_refuses_bad_ones(tmp_path: Path) -> None:
    cfg = EmberConfig()
    with (
        pytest.raises(
            EmberConfigError,
            match=r"config.scope\(kernels='bogus'\) \(for EMBER_KERNELS\) .*'auto', 'extern'",
        ),
        cfg.scope(kernels="bogus"),
    ):
        pass
    for bad in [{"strict": "maybe"}, {"compile_workers": 1.5}, {"check": 2}, {"cache_size_mb": -1}]:
        pattern = rf"config.scope\({next(iter(bad))}="
        with pytest.raises(EmberConfigError, match=pattern), cfg.scope(**bad):
            pass
    assert cfg._overrides == {}  # a refused scope leaves nothing behind
    with cfg.scope(check=True, fallback=False, debug_dir=None, compile_workers=2, layout="KEEP"):
        assert (cfg.check, cfg.fallback, cfg.debug_dir) == ("raise", False, None)
        assert (cfg.compile_workers, cfg.layout) == (2, "keep")
    with cfg.scope(cache_dir=tmp_path, debug_dir=str(tmp_path), check="warn"):
        assert cfg.cache_dir == tmp_path and cfg.debug_dir == tmp_path and cfg.check == "warn"


def _graph() -> torch.fx.GraphModule:
    return make_fx(lambda x: torch.sin(x) * 2 + 1, tracing_mode="fake")(torch.randn(8))


def test_bad_setting_raises_from_compile_graph_without_strict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad value is the user's to fix: never the compile failure that runs eagerly."""
    monkeypatch.setenv("EMBER_STRICT", "0")
    monkeypatch.setenv("EMBER_FALLBACK", "maybe")
    start = len(compile_records)
    with pytest.raises(EmberConfigError, match="EMBER_FALLBACK='maybe'"):
        compile_graph(_graph(), name="bad_setting")
    # also where the value turns bad after the compile's own check, inside its stages
    monkeypatch.setattr(config, "validate", lambda: None)
    with pytest.raises(EmberConfigError, match="EMBER_FALLBACK='maybe'"):
        compile_graph(_graph(), name="bad_setting")
    assert all(r.ran_eagerly is None for r in compile_records[start:])


def test_bad_setting_raises_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_STRICT", raising=False)
    monkeypatch.setenv("EMBER_PARTITIONER", "greedy")  # read by training graphs only
    with pytest.raises(Exception, match="EMBER_PARTITIONER='greedy' is not valid") as e:
        torch.compile(lambda x: x.cos() + 1, backend="ember")(torch.randn(4))
    # Dynamo wraps a backend's error (BackendCompilerFailed) and keeps it
    assert isinstance(getattr(e.value, "inner_exception", e.value), EmberConfigError)


def test_logs_is_checked_at_every_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_LOGS", raising=False)
    with config.scope(kernels="extern"):
        compile_graph(_graph(), name="logs_ok")
        monkeypatch.setenv("EMBER_LOGS", "loud")
        with pytest.raises(EmberConfigError, match=r"EMBER_LOGS='loud'.*'info', 'debug'"):
            compile_graph(_graph(), name="logs_bad")
        monkeypatch.setattr(config, "validate", lambda: None)
        with pytest.raises(EmberConfigError, match="EMBER_LOGS='loud'"):
            setup_logging()


def test_unknown_variables_warn_once_each_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_module, "_warned_unknown", set())
    for name in [n for n in os.environ if n.startswith("EMBER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EMBER_FALBACK", "0")
    monkeypatch.setenv("EMBER_XYZZY", "1")
    monkeypatch.setenv("EMBER_UPDATE_GOLDEN", "1")  # the golden tests' switch, not a setting
    monkeypatch.setenv("EMBER_STRICT", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EmberConfig().validate()
        EmberConfig().validate()
        with config.scope(kernels="extern"):
            compile_graph(_graph(), name="unknown_variables")
    messages = sorted(str(w.message) for w in caught if w.category is UserWarning)
    assert len(messages) == 2, messages
    assert messages[0].startswith("EMBER_FALBACK is set, but ember has no such setting")
    assert messages[0].endswith("did you mean EMBER_FALLBACK?")
    assert messages[1].startswith("EMBER_XYZZY is set") and "ember config" in messages[1]
