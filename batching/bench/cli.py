"""`python -m batching.bench SUBCOMMAND [FLAGS]`: the benchmark's one command line.

    python -m batching.bench race --workload seed-lab --modes static,continuous,hf --repeat 3
    python -m batching.bench sweep --workload seed-lab --rates 2,4,8,16
    python -m batching.bench SUBCOMMAND --help

One parser with a subcommand per tool (`COMMANDS`); the options several take are defined once (`options.py`), and
each subcommand's work is its module's `run(args)`. Without a subcommand it prints the list and exits with code 2:
each tool's flags are its own, so a default one would read another's flags as its own (the race, the default
before, is `race` now). Bad input is one line on stderr, `bench SUBCOMMAND: error: ...`, and exit code 2; a run that
measured nothing it may report (a request failed) is one such line after its output, and exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import transformers

from batching.bench import (
    cold_start,
    gpu_check,
    interference,
    memory,
    race,
    race_check,
    shapes,
    steady,
    sweep,
)
from batching.bench.options import BadInput, RunFailed
from batching.bench.peers import serve_peer
from batching.bench.peers.gguf_convert import GGUFConversionError
from batching.bench.peers.llamacpp_peer import LlamaCppError
from batching.bench.peers.local_server import ServerStartError
from batching.command_line import OneLineParser
from batching.engine.model_support import UnsupportedModelError
from config.settings import SettingsError
from model.loader import ModelLoadError
from utils.log_setup import configure_logging

PROG = "python -m batching.bench"
ABOUT = "Batchscope's benchmarks, one subcommand each (`python -m batching.bench SUBCOMMAND --help`: its flags)."
# Reported as one line on stderr with exit code 2: the input, or the setup (a peer's server that fails to start).
BAD_INPUT = (
    BadInput,
    SettingsError,
    ModelLoadError,
    UnsupportedModelError,
    GGUFConversionError,
    LlamaCppError,
    ServerStartError,
)


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, the module whose `add_arguments` and `run` it is, what it does in a line, and
    the level our packages log at while it runs (WARNING: the engine's warnings, the tables on stdout)."""

    name: str
    module: ModuleType
    about: str
    log_level: int = logging.WARNING

    @property
    def run(self) -> Callable[[argparse.Namespace], int]:
        return self.module.run


COMMANDS = (
    Command("race", race, "static and continuous batching and the peers (hf, llama.cpp, vLLM) on one workload"),
    Command("sweep", sweep, "the load sweep: latency and goodput against the request rate, here or on servers"),
    Command("steady", steady, "steady Poisson traffic through a fresh server of ours: latency by window"),
    Command("serve-peer", serve_peer, "our server beside transformers serve and vLLM's, driven by guidellm"),
    Command("memory", memory, "what paging buys on the KV memory of 8 full-length slots"),
    Command("interference", interference, "prefill/decode interference at each per-step token budget", logging.INFO),
    Command("shapes", shapes, "build a real-size model shape with random weights into a folder"),
    Command("race-check", race_check, "the page's race beside the benchmark's, on the same workloads", logging.INFO),
    Command("cold-start", cold_start, "a fresh engine's first race beside its races after the graph", logging.INFO),
    Command("gpu-check", gpu_check, "the benchmark half of the GPU check (scripts/gpu_check.sh)", logging.INFO),
)
NAMES = tuple(command.name for command in COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The one parser: a subparser per command, each with its module's flags; bad flags raise BadInput."""
    parser = OneLineParser(error_type=BadInput, prog=PROG, description=ABOUT)
    commands = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=OneLineParser)
    for command in COMMANDS:
        doc = command.module.__doc__ or command.about
        sub = commands.add_parser(
            command.name, help=command.about, description=doc.split("\n\n")[0], error_type=BadInput
        )
        command.module.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run the subcommand, and turn its failure into one line and an exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in NAMES else None
    where = f"bench {name}" if name else "bench"
    parser = build_parser()
    if name is None and not {"-h", "--help"} & set(argv[:1]):
        parser.print_help(sys.stderr)
        given = f"{argv[0]!r} is not a subcommand" if argv else "no subcommand given"
        print(f"bench: error: {given}: choose one of {', '.join(NAMES)} (the race is `race` now)", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
        command = COMMANDS[NAMES.index(args.command)]
        configure_logging(command.log_level)
        transformers.utils.logging.disable_progress_bar()  # the bench's own bar is the one to watch
        return command.run(args)
    except BAD_INPUT as exc:
        print(f"{where}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"{where}: error: {exc}", file=sys.stderr)
        return 1
