"""What the command-line entry points share: an argument parser whose bad flags make one line, not a usage page."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """Raises `error_type(message)` on bad flags instead of printing the usage and exiting, so each entry point
    prints the one line itself and chooses its exit code."""

    def __init__(self, *args: Any, error_type: type[Exception] = ValueError, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_type = error_type

    def error(self, message: str) -> NoReturn:
        raise self.error_type(message)


def first_below_one(args: argparse.Namespace, flags: Iterable[str]) -> str | None:
    """The one-line complaint about the first of `flags` given below 1, or None."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < 1:
            return f"--{flag.replace('_', '-')}={value} is not allowed: must be >= 1"
    return None


def first_missing_folder(args: argparse.Namespace, flags: Iterable[str] = ("json", "plot")) -> str | None:
    """The one-line complaint about the first output file of `flags` whose folder does not exist, or None."""
    for flag in flags:
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            return f"--{flag} {path}: the folder {path.parent} does not exist"
    return None


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]], gap: str = " ") -> str:
    """Right-aligned columns as wide as their widest cell, a rule of dashes under the header."""
    table = [header, *rows]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    out = [gap.join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)) for cells in table]
    out.insert(1, gap.join("-" * width for width in widths))
    return "\n".join(out)
