"""Real-size model shapes with random weights, built here (nothing downloaded), so every contender of the benchmark
can be timed on a model of a size people run: `python -m batching.bench race --model-shape qwen2-0.5b ...`, or
`python -m batching.bench shapes qwen2-0.5b FOLDER` to build one into a folder.

A shape is a config of a real model's sizes over the embedded model's tokenizer (its vocabulary, so prompts and
answers read as the benchmark's workloads do), saved with `save_pretrained` once into the cache folder and reused.
A `NAME:LAYERS` suffix keeps the widths with fewer layers (a quick run, or a test).
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from batching.bench.options import BadInput
from model.loader import BUILTIN_MODEL_DIR


@dataclass(frozen=True)
class ModelShape:
    """A real model's sizes (its config's own fields) and what it stands for."""

    model_type: str
    sizes: dict[str, int | float | bool | list[str]]
    about: str


SHAPES: dict[str, ModelShape] = {
    "qwen2-0.5b": ModelShape(
        "qwen2",
        {
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "rope_theta": 1_000_000.0,
            "tie_word_embeddings": True,
        },
        "Qwen2/Qwen2.5-0.5B's sizes (24 layers, hidden 896, 14/2 heads, MLP 4,864) over the embedded tokenizer",
    ),
    # A hybrid: short-convolution layers beside attention (10 and 6 of 16), as LFM2-350M lays them out.
    "lfm2-350m": ModelShape(
        "lfm2",
        {
            "hidden_size": 1024,
            "intermediate_size": 6656,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "max_position_embeddings": 128_000,
            "conv_L_cache": 3,
            "tie_word_embeddings": True,
            "layer_types": ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
        },
        "LFM2-350M's layout (16 layers: 10 short convolutions, 6 attention; hidden 1,024, 16/8 heads) over the "
        "embedded tokenizer",
    ),
}


def parse_shape(text: str) -> tuple[str, int | None]:
    """`NAME` or `NAME:LAYERS`; raises ValueError naming the bad value and what is allowed."""
    name, _, layers = text.partition(":")
    if name not in SHAPES:
        raise ValueError(f"model shape {text!r} is not allowed: choose one of {', '.join(SHAPES)} (optionally :LAYERS)")
    if not layers:
        return name, None
    if not layers.isdigit() or int(layers) < 1:
        raise ValueError(f"model shape {text!r} is not allowed: LAYERS after ':' must be a whole number >= 1")
    return name, int(layers)


def shape_cache_dir() -> Path:
    """Where built shapes are kept: the user's cache folder, never the repository."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "batchscope" / "model-shapes"


def build_shape(text: str, folder: Path | None = None, seed: int = 0) -> Path:
    """The folder holding shape `text` (built there on first use, in fp32 with random weights); returns it."""
    name, layers = parse_shape(text)
    folder = folder or shape_cache_dir() / text.replace(":", "-")
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty and holds no model: give an empty or new folder")
    shape = SHAPES[name]
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    sizes = dict(shape.sizes)
    if layers:
        sizes["num_hidden_layers"] = layers
        kinds = sizes.get("layer_types")
        if isinstance(kinds, list):  # the first LAYERS layers of the pattern, an attention layer among them
            sizes["layer_types"] = [*kinds[: layers - 1], "full_attention"]
    config = AutoConfig.for_model(
        shape.model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    partial = folder.with_name(folder.name + ".partial")  # a run cut off midway leaves no half-saved model behind
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if folder.exists():
        folder.rmdir()  # empty (checked above)
    partial.rename(folder)
    return folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The shape to build, and where."""
    parser.add_argument("shape", help=f"one of {', '.join(SHAPES)}, optionally NAME:LAYERS")
    parser.add_argument("folder", type=Path, nargs="?", help="where to save it (default: the cache folder)")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench shapes SHAPE [FOLDER]`: the shape built (or found built), and its size."""
    try:
        folder = build_shape(args.shape, args.folder)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())
    print(f"{args.shape}: {parameters / 1e6:,.0f} M parameters (random, fp32) in {folder}")
    return 0
