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
    """Attach a stderr handler to the 'ember' logger once, at the EMBER_LOGS level."""
    global _configured
    if _configured:
        return
    _configured = True
    level_name = config.logs
    if level_name not in _LEVELS:
        raise ValueError(f"EMBER_LOGS={level_name!r}: expected one of {sorted(_LEVELS)}")
    logger = logging.getLogger("ember")
    logger.setLevel(_LEVELS[level_name])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
