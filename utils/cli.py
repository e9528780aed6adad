"""What the command-line entry points share: an argument parser whose bad flags make one line, not a usage page."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """Raises `error_type(message)` on bad flags instead of printing the usage and exiting, so each entry point
    prints the one line itself and chooses its exit code."""

    def __init__(self, *args: Any, error_type: type[Exception] = ValueError, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_type = error_type

    def error(self, message: str) -> NoReturn:
        raise self.error_type(message)
