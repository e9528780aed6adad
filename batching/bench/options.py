"""What the bench's subcommands share, defined once: the options several take (`add`), the model the flags name
(`load`), and the two ways a subcommand fails (`BadInput`, `RunFailed`), which the CLI reports as one line.

A subcommand takes a shared option with its own default where it needs one (the sweep runs one torch thread as the
page's engine does, the race as many as torch has), and the option's help says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batching.engine.scheduler import POLICIES
from config.settings import Settings
from model.loader import LoadedModel, load_model

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16")


class BadInput(Exception):
    """Bad input (a flag, a workload, a model or server it cannot use): one line on stderr, exit code 2."""


class RunFailed(Exception):
    """A run that went through but measured nothing it may report (a request failed, a server would not start):
    one line on stderr after what it printed, exit code 1."""


SHARED: dict[str, dict[str, Any]] = {
    "--model": {"help": "builtin, a hub id or a local folder"},
    "--model-shape": {
        "help": "a real size with random weights, built here once (e.g. qwen2-0.5b, or qwen2-0.5b:4)",
        "unset": "",
    },
    "--device": {"choices": DEVICES},
    "--dtype": {"choices": DTYPES},
    "--threads": {"type": int, "help": "torch CPU threads"},
    "--workload": {"help": "the prompt mix: a built-in name, 'random', or a .json/.csv file"},
    "--requests": {"type": int, "help": "requests per rate"},
    "--repeat": {"type": int, "help": "runs of each, alternating; the median is shown"},
    "--seed": {"type": int, "help": "seed of the arrivals and of the random workload"},
    "--batch-size": {"type": int, "help": "slots"},
    "--max-batched-tokens": {"type": int, "help": "tokens per step"},
    "--policy": {"choices": list(POLICIES), "help": "admission order"},
    "--max-new-tokens": {"type": int, "help": "cap of the requests the workload leaves uncapped"},
    "--ignore-eos": {"action": "store_true", "help": "every answer runs to its cap"},
    "--vllm-python": {"help": "vLLM's environment's Python", "unset": "settings, else scripts/install-vllm.sh's"},
    "--json": {"type": Path, "help": "write every figure here (JSON)", "unset": ""},
    "--plot": {"type": Path, "help": "write the charts here (PNG)", "unset": ""},
    "--no-progress": {"action": "store_true", "help": "no progress bar"},
}


def add(parser: argparse.ArgumentParser, flag: str, default: Any = None, said: str | None = None, **spec: Any) -> None:
    """Add the shared option `flag` to a subcommand's parser with this subcommand's `default`, said in its help as
    `said` (else the default itself; without one, the option's own words, "settings" unless it says otherwise);
    `spec` adds to the shared definition."""
    options = {**SHARED[flag], **spec}
    unset = options.pop("unset", "settings")
    text = options.get("help", flag.removeprefix("--"))
    if options.get("action") != "store_true" and not options.get("required"):
        options["default"] = default
        words = said or (unset if default is None else str(default))
        text = f"{text} (default: {words})" if words else text
    parser.add_argument(flag, help=text, **{key: value for key, value in options.items() if key != "help"})


def add_all(parser: argparse.ArgumentParser, *flags: str) -> None:
    """Several shared options, each with no default of its own (the settings' then, or off)."""
    for flag in flags:
        add(parser, flag)


def load(args: argparse.Namespace, settings: Settings) -> LoadedModel:
    """The model and tokenizer `--model`, `--device` and `--dtype` name (each, when not given, the settings')."""
    updates = {"name_or_path": args.model, "device": args.device, "dtype": args.dtype}
    model_settings = settings.model.model_copy(update={key: value for key, value in updates.items() if value})
    return load_model(model_settings, settings.tokenizer)
