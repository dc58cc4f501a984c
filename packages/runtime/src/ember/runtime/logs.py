"""Logging for ember: one 'ember' logger tree, its level set by EMBER_LOGS."""

from __future__ import annotations

import logging

from ember.runtime.config import config

_LEVELS = {
    "": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
_configured = False


def setup_logging() -> None:
    """Attach a stderr handler to the 'ember' logger once, at the EMBER_LOGS level.

    EMBER_LOGS is read (so checked: `EmberConfigError`) at every call, not only the
    first, so that a bad value set later in the process is not passed over."""
    global _configured
    level_name = config.logs
    if _configured:
        return
    _configured = True
    logger = logging.getLogger("ember")
    logger.setLevel(_LEVELS[level_name])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
