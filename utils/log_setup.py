"""Logging for the entry points (the page, the CLI, the server): configured once per process."""

from __future__ import annotations

import logging

# Our packages log at INFO (model loaded, sessions reaped, engine faults); everything else stays at WARNING.
PACKAGES = ("batching", "config", "model", "utils")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: int = logging.INFO) -> None:
    """Send log lines to stderr once: `basicConfig` adds no handler when the root logger has one (page reruns)."""
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    for name in PACKAGES:
        logging.getLogger(name).setLevel(level)
