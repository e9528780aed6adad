"""llama.cpp's HTTP server from the xllamacpp wheel, started with the `llama-server` flags the peer uses.

    python batching/bench/peers/llamacpp_server.py -m model.gguf --port 8080 --parallel 8 -c 4096 -t 1 -tb 1 ...

xllamacpp embeds llama.cpp's own server (the same C++ code as the `llama-server` binary) in a Python extension;
this entry point gives it the binary's command line, so the peer starts either the same way. It serves until it is
terminated; like the binary, it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    prog = "python batching/bench/peers/llamacpp_server.py"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("-tb", "--threads-batch", type=int)
    parser.add_argument("-b", "--batch-size", type=int, default=2048)
    parser.add_argument("-ub", "--ubatch-size", type=int, default=512)
    parser.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    parser.add_argument("-kvu", "--kv-unified", action="store_true", default=False)
    parser.add_argument("-no-kvu", "--no-kv-unified", action="store_false", dest="kv_unified")
    parser.add_argument("-cram", "--cache-ram", type=int)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--cont-batching", action="store_true", default=True)
    parser.add_argument("--no-webui", action="store_true")
    return parser


def params(args: argparse.Namespace, xllamacpp: Any) -> Any:
    """xllamacpp's CommonParams set as the binary would set them from the same flags."""
    common = xllamacpp.CommonParams()
    common.model.path = args.model
    common.port = args.port
    common.n_parallel = args.parallel
    common.n_ctx = args.ctx_size
    common.cpuparams.n_threads = args.threads
    common.cpuparams_batch.n_threads = args.threads_batch or args.threads
    common.n_batch = args.batch_size
    common.n_ubatch = args.ubatch_size
    flash = xllamacpp.llama_flash_attn_type
    common.flash_attn_type = {
        "on": flash.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": flash.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        "auto": flash.LLAMA_FLASH_ATTN_TYPE_AUTO,
    }[args.flash_attn]
    common.kv_unified = args.kv_unified
    if args.cache_ram is not None:
        common.cache_ram_mib = args.cache_ram
    common.endpoint_metrics = args.metrics
    common.cont_batching = args.cont_batching
    return common


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import xllamacpp  # the optional wheel: imported here so --help works without it

    server = xllamacpp.Server(params(args, xllamacpp))
    print(f"listening on {server.listening_address}", flush=True)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda number, _: stopping.append(number))
    while not stopping:
        signal.pause()  # the server runs in its own threads until the peer terminates this process
    del server  # stops the server's threads before the interpreter shuts down
    return 0


if __name__ == "__main__":
    sys.exit(main())
