"""Logging is configured once per process: the engine's INFO lines reach stderr, once, however often it is called."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = """
import logging
from utils.log_setup import configure_logging
for _ in range(3):  # the page calls it on every rerun
    configure_logging()
logging.getLogger("batching.engine.batcher").info("engine line")
logging.getLogger("model.loader").info("loader line")
logging.getLogger("some.library").info("library chatter")
logging.getLogger("some.library").warning("library warning")
"""


def test_our_info_lines_show_once_and_other_libraries_stay_at_warning() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert sum("INFO batching.engine.batcher: engine line" in line for line in lines) == 1
    assert sum("INFO model.loader: loader line" in line for line in lines) == 1
    assert not any("library chatter" in line for line in lines)
    assert sum("WARNING some.library: library warning" in line for line in lines) == 1
