"""GPTQ on any machine torch runs on: what gptqmodel needs before it is imported, the calibration texts (no hub),
the group size a model's widths allow, and quantising a model into a folder that then loads as itself.

gptqmodel (with optimum, through transformers' GPTQ integration) runs on a CPU: its `TorchAtenLinear` kernel
(backend `auto` there) unpacks int4 weights with torch's own int4 ops, and on a GPU `auto` takes its CUDA kernels.
Everything here imports gptqmodel lazily: without it the app still runs unquantised models, and says what to install
when asked for GPTQ.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig
from transformers.utils import is_gptqmodel_available, is_optimum_available

from model.errors import ModelLoadError

logger = logging.getLogger(__name__)

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.txt"
BUILTIN_CALIBRATION = "builtin"  # the embedded model's Q/A corpus (`CALIBRATION_FILE`, written by training.calibration)
GROUP_SIZES = (128, 64, 32)  # the sizes torch's int4 CPU kernel packs (largest first: fewer scales to read)
USE_GPTQ_SETTING = "BATCHSCOPE_MODEL__USE_GPTQ"
# Quantisation methods a folder's config may name: the one we run, and where the others are refused.
RUNNABLE_METHODS = ("gptq",)


def cache_root() -> Path:
    """Where quantised copies made on load, and gptqmodel's own build folder, are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batchscope"


def prepare_gptqmodel() -> None:
    """Set what gptqmodel reads when it is imported: on fewer than 4 cores it refuses to start unless told it may use
    2 workers, and its C++ packer builds under the user's cache unless told where."""
    if (os.cpu_count() or 1) < 4:
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    os.environ.setdefault("GPTQMODEL_TORCH_EXTENSIONS_DIR", str(cache_root() / "gptqmodel-extensions"))


def require_gptq(why: str = f"{USE_GPTQ_SETTING}=true") -> None:
    """gptqmodel and optimum are installed, or one line saying what to install (a GPU is not needed)."""
    missing = [
        name for name, ok in (("gptqmodel", is_gptqmodel_available()), ("optimum", is_optimum_available())) if not ok
    ]
    if missing:
        raise ModelLoadError(
            f"{why} needs the GPTQ backend ({', '.join(missing)} not installed): pip install -r requirements-gptq.txt"
        )
    prepare_gptqmodel()


def quantized_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's quantised linear layers (gptqmodel's kernels: packed `qweight`, no `.weight`)."""
    return [module for module in model.modules() if hasattr(module, "qweight") and hasattr(module, "in_features")]


def layer_width(layer: torch.nn.Module) -> tuple[int, int]:
    """A quantised layer's (in, out) features."""
    return int(getattr(layer, "in_features")), int(getattr(layer, "out_features"))  # noqa: B009


def folder_quantization(folder: Path) -> str | None:
    """The quantisation method a model folder's config names (`gptq`, `awq`, ...), or None for plain weights."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loader's own check says what is wrong with the file
    quantization = data.get("quantization_config") if isinstance(data, dict) else None
    if not isinstance(quantization, dict):
        return None
    return str(quantization.get("quant_method", "unknown")).lower()


def check_runnable(method: str, name: str) -> None:
    """A folder quantised with `method` can run here, or one line naming the method and what is needed."""
    if method not in RUNNABLE_METHODS:
        raise ModelLoadError(
            f"{name} is quantised with {method!r}, which Batchscope does not run (it runs GPTQ-quantised and "
            "unquantised models): quantise the unquantised model with `python -m model.quantize`"
        )
    require_gptq(f"{name} (a GPTQ-quantised model)")


def calibration_texts(source: str = BUILTIN_CALIBRATION) -> list[str]:
    """Calibration texts: the embedded corpus (`builtin`) or a UTF-8 text file's non-empty lines, one text each."""
    path = CALIBRATION_FILE if source == BUILTIN_CALIBRATION else Path(source).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"BATCHSCOPE_MODEL__GPTQ_DATASET={source}: cannot read it as UTF-8 text "
            f"({getattr(exc, 'strerror', None) or type(exc).__name__}); give builtin or a text file, one text a line"
        ) from exc
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise ModelLoadError(f"BATCHSCOPE_MODEL__GPTQ_DATASET={source}: the file holds no text; one text a line")
    return texts


def group_size(config: PretrainedConfig) -> int:
    """The largest group size the int4 kernels pack that divides every linear layer's input width."""
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", 0) or 0
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
    widths = {text.hidden_size, getattr(text, "intermediate_size", text.hidden_size), heads * head_dim}
    widths.discard(0)
    for size in GROUP_SIZES:
        if all(width % size == 0 for width in widths):
            return size
    raise ModelLoadError(
        f"GPTQ needs every linear layer's input width to be a multiple of 32; this model's are {sorted(widths)}"
    )


def folder_bytes(folder: Path) -> int:
    """Bytes of a model folder's weight files."""
    return sum(path.stat().st_size for path in folder.glob("*") if path.suffix in (".safetensors", ".bin"))


@dataclass(frozen=True)
class Quantized:
    """A quantised copy: where it is, and what making it took."""

    folder: Path
    bits: int
    group_size: int
    seconds: float
    bytes_before: int
    bytes_after: int


def quantize(
    source: str,
    out: Path,
    bits: int = 4,
    calibration: Sequence[str] | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Quantized:
    """Quantise `source` (a local folder or a hub id) with GPTQ into `out`, which appears whole or not at all.

    The copy keeps the source's generation defaults (gptqmodel rewrites `do_sample`), and gptqmodel's log folder
    (written into the working folder, with no setting to move it) lands in a scratch folder removed after.
    """
    require_gptq("python -m model.quantize")
    started = time.perf_counter()
    texts = list(calibration) if calibration is not None else calibration_texts()
    config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    group = group_size(config)
    out = out.expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="batchscope-gptq-") as scratch, contextlib.chdir(scratch):
            from gptqmodel import GPTQModel, QuantizeConfig

            quantize_config = QuantizeConfig(bits=bits, group_size=group, offload_to_disk=False, pack_impl="original")
            model = GPTQModel.load(source, quantize_config, trust_remote_code=trust_remote_code, revision=revision)
            model.quantize(texts, batch_size=8)
            model.save(str(staging))
        _keep_generation_defaults(source, revision, staging)
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the copy is an ordinary folder
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    source_folder = Path(source)
    before = folder_bytes(source_folder) if source_folder.is_dir() else 0
    return Quantized(out, bits, group, time.perf_counter() - started, before, folder_bytes(out))


def _keep_generation_defaults(source: str, revision: str | None, folder: Path) -> None:
    from transformers import GenerationConfig

    try:
        defaults = GenerationConfig.from_pretrained(source, revision=revision or "main")
    except OSError:  # the source has none: transformers derives them from the model's config, as for the source
        (folder / "generation_config.json").unlink(missing_ok=True)
        return
    defaults.save_pretrained(folder)


def quantized_copy(
    source: str,
    bits: int,
    calibration: str = BUILTIN_CALIBRATION,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """A GPTQ copy of `source` made once and kept in the cache (keyed by the source, its weights' dates, the bits
    and the calibration texts), for quantising on load; the folder loads as itself afterwards."""
    require_gptq()
    texts = calibration_texts(calibration)
    stamp = source
    source_folder = Path(source)
    if source_folder.is_dir():
        stamp = str(source_folder.resolve()) + "".join(
            f"{path.name}:{path.stat().st_mtime_ns}" for path in sorted(source_folder.glob("*.safetensors"))
        )
    from gptqmodel import __version__ as gptqmodel_version

    key = json.dumps([stamp, revision, bits, texts, gptqmodel_version])
    folder = cache_root() / "gptq" / hashlib.sha256(key.encode()).hexdigest()[:16]
    if not (folder / "config.json").is_file():
        logger.info("quantising %s to %d bits with GPTQ into %s", source, bits, folder)
        made = quantize(source, folder, bits, texts, revision, trust_remote_code)
        logger.info("quantised in %.1f s: %s -> %s bytes", made.seconds, made.bytes_before, made.bytes_after)
    return folder
