"""Make a GPTQ-quantised copy of a local model, offline: `python -m model.quantize SRC OUT --bits 4`.

SRC is `builtin`, a folder saved with `save_pretrained` or a hub id; OUT is the folder to write, which then loads as
itself (`BATCHSCOPE_MODEL__NAME_OR_PATH=OUT`). Calibration texts come from the embedded corpus unless a text file is
given (one text a line): nothing is fetched. gptqmodel shows each layer's progress as it quantises.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.errors import ModelLoadError
from model.gptq import BUILTIN_CALIBRATION, calibration_texts, quantize
from model.loader import resolve_source


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="builtin, a local model folder or a hub id")
    parser.add_argument("out", type=Path, help="the folder to write the quantised model to")
    parser.add_argument("--bits", type=int, choices=(2, 3, 4, 8), default=4)
    parser.add_argument(
        "--calibration",
        default=BUILTIN_CALIBRATION,
        help="builtin (the embedded corpus) or a text file, one text a line",
    )
    args = parser.parse_args(argv)
    try:
        source = resolve_source(args.source)
        made = quantize(source, args.out, args.bits, calibration_texts(args.calibration))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    before = _mib(made.bytes_before) if made.bytes_before else "unknown (a hub model)"
    print(
        f"quantised {args.source} to {made.bits} bits (GPTQ, group size {made.group_size}) in {made.seconds:.1f} s: "
        f"weights {before} -> {_mib(made.bytes_after)}, written to {made.folder}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
