"""Logging and tracing for ember through torch's own machinery.

Logs: every ember module logs under the 'ember' logger tree. Importing ember.runtime
registers 'ember' with `torch._logging`, so `TORCH_LOGS="ember"` (info),
`TORCH_LOGS="+ember"` (debug) and `torch._logging.set_logs(ember=logging.DEBUG)` work as
they do for torch's own components, in torch's format, each line once. `EMBER_LOGS`
(`info`, `debug`) is the way without torch's settings: at the first compile ember
attaches its own stderr handler to 'ember', unless one is already there (torch's,
from TORCH_LOGS, or the program's own), which then stays in charge. Lines used to
print twice under `TORCH_LOGS=ember`: torch had attached a handler to 'ember' (a
TORCH_LOGS name that is an importable module becomes a log) and ember attached its
own beside it. Ember's handler is marked as one of torch's, so that a later
`torch._logging.set_logs` replaces it instead of adding a second.

Tracing: `trace_artifact` writes a compile stage's output (passes, IR, schedule,
kernels, wrapper) to `TORCH_TRACE` as a structured artifact, which tlparse lists
under the compile that made it. Without TORCH_TRACE it costs one check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch._logging import _internal as torch_logging

from ember.runtime.config import config

_LEVELS = {
    "": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
_configured = False
# The name of ember's logger tree as torch._logging knows it (TORCH_LOGS, set_logs).
LOG_NAME = "ember"


def register_with_torch() -> None:
    """Make 'ember' a log name of torch._logging (once; importing ember.runtime does)."""
    if not torch_logging.log_registry.is_log(LOG_NAME):  # type: ignore[no-untyped-call]  # torch stub
        torch_logging.register_log(LOG_NAME, LOG_NAME)


def setup_logging() -> None:
    """Attach a stderr handler to the 'ember' logger once, at the EMBER_LOGS level,
    where no handler is there yet (see the module's docstring).

    EMBER_LOGS is read (so checked: `EmberConfigError`) at every call, not only the
    first, so that a bad value set later in the process is not passed over."""
    global _configured
    level_name = config.logs
    if _configured:
        return
    _configured = True
    logger = logging.getLogger(LOG_NAME)
    if logger.handlers:  # torch's (TORCH_LOGS) or the program's: theirs to configure
        return
    logger.setLevel(_LEVELS[level_name])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
    # marked as torch's: torch._logging's next reset replaces it rather than adding one
    logger.addHandler(torch_logging._track_handler(handler))  # type: ignore[no-untyped-call]
    logger.propagate = False


def tracing() -> bool:
    """Whether structured artifacts go anywhere (TORCH_TRACE is set)."""
    return bool(torch_logging.trace_log.handlers)


def trace_artifact(name: str, text: Callable[[], str]) -> None:
    """Write `text()` to TORCH_TRACE as the string artifact `name` (tlparse shows it
    under the compile it belongs to); `text` is called only when tracing."""
    if not tracing():
        return
    torch_logging.trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "string"},
        payload_fn=text,
    )


register_with_torch()
