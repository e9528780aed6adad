"""Load a causal LM and its tokenizer from `builtin`, a local folder or a hub id, on the chosen device and dtype."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from config.settings import ModelSettings, TokenizerSettings
from model import gptq
from model.errors import ModelLoadError

logger = logging.getLogger(__name__)

BUILTIN_NAME = "builtin"
# The embedded model quantised to 4 bits with GPTQ on first use (kept in the cache: `gptq.quantized_copy`).
BUILTIN_4BIT_NAME = "builtin-4bit"
BUILTIN_MODEL_DIR = Path(__file__).resolve().parent / "builtin"
MODEL_SETTING = "BATCHSCOPE_MODEL__NAME_OR_PATH"
# Before loading from the hub, one request checks it answers: unreachable, the hub library retries for about a minute.
HUB_TIMEOUT_S = 3.0
# A hub model that could not be had offline or without a connection fails the same way until something changes:
# remembered per (model settings, offline flag, hub address) for the life of the process, so a new tab does not wait.
_hub_failures: dict[tuple[str, bool, str], ModelLoadError] = {}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference, with what the page shows about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    name: str
    num_parameters: int
    load_seconds: float
    weights: Weights


@dataclass(frozen=True)
class Weights:
    """What the weights are: their precision in words (`float32`, `4-bit GPTQ, group 128`) and the bytes they take."""

    precision: str
    bytes: int
    quantized: bool = False

    @classmethod
    def of(cls, model: PreTrainedModel) -> Weights:
        # Quantised layers keep their packed weights and scales as buffers; persistent buffers are weights too.
        size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        quantization = getattr(model.config, "quantization_config", None)
        if quantization is None:
            return cls(str(model.dtype).removeprefix("torch."), size)
        settings = quantization if isinstance(quantization, dict) else quantization.to_dict()
        method = str(settings.get("quant_method", "quantised")).removeprefix("QuantizationMethod.").upper()
        group = settings.get("group_size")
        return cls(f"{settings.get('bits')}-bit {method}" + (f", group {group}" if group else ""), size, True)

    def line(self) -> str:
        return f"{self.precision} weights, {self.bytes / 2**20:,.1f} MiB"


def resolve_device(choice: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit choice that is not present is an error."""
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if choice == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if choice == "cuda" and not cuda:
        raise ModelLoadError("BATCHSCOPE_MODEL__DEVICE=cuda but no CUDA GPU is visible; use auto or cpu")
    if choice == "mps" and not mps:
        raise ModelLoadError("BATCHSCOPE_MODEL__DEVICE=mps but Apple MPS is not available; use auto or cpu")
    return torch.device(choice)


def resolve_dtype(choice: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 (float16 without bf16 support) on cuda, float32 on cpu and mps.

    float16 on mps flips greedy near-ties, so it is never picked automatically there.
    """
    if choice != "auto":
        return getattr(torch, choice)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def resolve_source(name_or_path: str) -> str:
    """Map `builtin` to the embedded model's folder; anything else is a local folder or a hub id."""
    if name_or_path in (BUILTIN_NAME, BUILTIN_4BIT_NAME):
        if not (BUILTIN_MODEL_DIR / "config.json").is_file():
            raise ModelLoadError(
                f"the embedded model is missing from {BUILTIN_MODEL_DIR}; rebuild it with "
                f"`python -m training.train` or set {MODEL_SETTING} to a folder or hub id"
            )
        return str(BUILTIN_MODEL_DIR)
    looks_like_path = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).expanduser().exists()
    if looks_like_path:
        folder = Path(name_or_path).expanduser()
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"{MODEL_SETTING}={name_or_path}: no config.json in that folder; "
                "give a folder saved with save_pretrained, a hub id, or builtin"
            )
        return str(folder)
    return name_or_path


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _hub_error(settings: ModelSettings, exc: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"could not load {MODEL_SETTING}={settings.name_or_path}: not a local folder, and the model hub "
        f"could not provide it ({_first_line(exc)[:160]}); set {MODEL_SETTING}=builtin or to a local folder"
    )


def check_local_folder(folder: Path, name: str) -> None:
    """Say what is wrong with a local model folder's config.json before transformers reads it."""
    config = folder / "config.json"
    problem = None
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or type(exc).__name__})"
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02X} at offset {exc.start})"
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    else:
        if not isinstance(data, dict):
            problem = f"holds a JSON {type(data).__name__}, not the object of a model's configuration"
    if problem:
        raise ModelLoadError(
            f"{MODEL_SETTING}={name}: {config} {problem}; save the model again with save_pretrained, "
            f"or set {MODEL_SETTING}=builtin"
        )


def _folder_error(settings: ModelSettings, folder: str, exc: Exception) -> ModelLoadError:
    detail = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip()) or type(exc).__name__
    return ModelLoadError(
        f"{MODEL_SETTING}={settings.name_or_path}: the folder {folder} does not hold a model transformers can load "
        f"({type(exc).__name__}: {detail[:200]}); save the model again with save_pretrained, "
        f"or set {MODEL_SETTING}=builtin"
    )


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def hub_offline() -> bool:
    """HF_HUB_OFFLINE, read now (the hub library reads it once, at import)."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


def hub_unreachable(endpoint: str, timeout_s: float = HUB_TIMEOUT_S) -> str | None:
    """None when the hub answers one request within `timeout_s`, else why not, in a few words.

    Asked from a thread so a name lookup that hangs (which a socket timeout does not cover) cannot hold us longer.
    """
    from huggingface_hub.utils import get_session

    outcome: dict[str, BaseException | None] = {}

    def probe() -> None:
        try:
            get_session().head(endpoint, timeout=timeout_s)
        except Exception as exc:  # any failure to get an answer means: not reachable from here, now
            outcome["error"] = exc
        else:
            outcome["error"] = None

    thread = threading.Thread(target=probe, name="batchscope-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if "error" not in outcome:
        return f"the model hub ({endpoint}) did not answer within {timeout_s:g} s"
    error = outcome["error"]
    return None if error is None else f"the model hub ({endpoint}) cannot be reached ({_first_line(error)[:120]})"


def _offline_error(settings: ModelSettings, reason: str) -> ModelLoadError:
    return ModelLoadError(
        f"could not load {MODEL_SETTING}={settings.name_or_path}: {reason}, and the model is not in the local hub "
        f"cache; set {MODEL_SETTING}=builtin or to a local folder (or connect, and restart the app)"
    )


def load_tokenizer(
    source: str, settings: ModelSettings, tokenizer_settings: TokenizerSettings, local_only: bool = False
) -> PreTrainedTokenizerBase:
    """Load the tokenizer with the configured sides, and make sure it has a pad token."""
    tokenizer = AutoTokenizer.from_pretrained(
        source,
        revision=settings.revision,
        use_fast=tokenizer_settings.use_fast,
        trust_remote_code=settings.trust_remote_code,
        local_files_only=local_only,
    )
    tokenizer.padding_side = tokenizer_settings.padding_side
    tokenizer.truncation_side = tokenizer_settings.truncation_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _failure_key(settings: ModelSettings) -> tuple[str, bool, str]:
    return (settings.model_dump_json(), hub_offline(), hub_endpoint())


def remembered_hub_failure(settings: ModelSettings) -> ModelLoadError | None:
    """The failure a hub id already had in this process with these settings (None: try it)."""
    return _hub_failures.get(_failure_key(settings))


def remember_hub_failure(settings: ModelSettings, error: ModelLoadError) -> None:
    """Remember that a hub id failed to load (in another process, e.g. the engine's), until settings change."""
    if not Path(resolve_source(settings.name_or_path)).is_dir():
        _hub_failures[_failure_key(settings)] = error


def load_model(settings: ModelSettings, tokenizer_settings: TokenizerSettings | None = None) -> LoadedModel:
    """Load model and tokenizer for inference: eval mode, no gradients, placed with accelerate's device_map.

    A hub id is loaded from the local cache alone when HF_HUB_OFFLINE is set or the hub does not answer a short
    request; if that fails, the failure is remembered until the settings change (see `_hub_failures`).
    """
    started = time.perf_counter()
    tokenizer_settings = tokenizer_settings or TokenizerSettings()
    source = resolve_source(settings.name_or_path)
    local = Path(source).is_dir()
    offline_reason = _check_source(settings, source, local)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    try:
        tokenizer = load_tokenizer(source, settings, tokenizer_settings, local_only=offline_reason is not None)
        weights_source = _weights_source(settings, source, local)
        # No quantization_config argument: a quantised folder's own config is what loads it (passing None makes
        # transformers drop it and load random plain linears).
        loaded: tuple[PreTrainedModel, dict] = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]
            weights_source,
            revision=settings.revision if weights_source == source else None,
            dtype=dtype,
            # "auto" lets accelerate spread a model too large for one GPU over several.
            device_map="auto" if device.type == "cuda" else device.type,
            trust_remote_code=settings.trust_remote_code,
            local_files_only=offline_reason is not None,
            output_loading_info=True,
        )
        model, report = loaded
    except ModelLoadError:
        raise
    except Exception as exc:
        error = _load_error(settings, source, local, offline_reason, exc)
        if error is None:
            raise
        raise error from exc
    check_load_report(settings.name_or_path, report)
    model.eval()
    model.requires_grad_(False)
    weights = Weights.of(model)
    if weights.quantized:
        _prepare_quantized_layers(model)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    seconds = time.perf_counter() - started
    logger.info("loaded %s on %s as %s in %.2f s", settings.name_or_path, device, dtype, seconds)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=model.device,
        dtype=dtype,
        name=settings.name_or_path,
        num_parameters=_parameter_count(model),
        load_seconds=seconds,
        weights=weights,
    )


def _parameter_count(model: PreTrainedModel) -> int:
    """Parameters as the model was trained: a quantised layer's packed weights count as its in x out weights."""
    widths = [gptq.layer_width(layer) for layer in gptq.quantized_layers(model)]
    return model.num_parameters() + sum(inputs * outputs for inputs, outputs in widths)


def _prepare_quantized_layers(model: PreTrainedModel) -> None:
    """One forward of one token: gptqmodel's CPU kernel repacks its weights on its first call, a data-dependent
    branch torch.compile cannot trace, so it happens here, before any step is compiled."""
    with torch.inference_mode():
        model(torch.tensor([[model.config.bos_token_id or 0]], device=model.device))


def runs_gptq(settings: ModelSettings) -> bool:
    """Whether loading these settings runs gptqmodel: a GPTQ folder, quantising on load, or `builtin-4bit`."""
    if settings.use_gptq or settings.name_or_path == BUILTIN_4BIT_NAME:
        return True
    source = Path(resolve_source(settings.name_or_path))
    return source.is_dir() and gptq.folder_quantization(source) is not None


def _weights_source(settings: ModelSettings, source: str, local: bool) -> str:
    """Where the weights load from: the source itself (a quantised folder checked runnable here first), or a GPTQ
    copy of it made once when quantising on load is asked for (`builtin-4bit` asks for it)."""
    method = gptq.folder_quantization(Path(source)) if local else None
    if method is not None:
        gptq.check_runnable(method, f"{MODEL_SETTING}={settings.name_or_path}")
        if settings.use_gptq:
            logger.info("%s is already quantised (%s): loaded as it is", settings.name_or_path, method)
        return source
    if settings.name_or_path == BUILTIN_4BIT_NAME:
        return str(gptq.quantized_copy(source, 4))
    if settings.use_gptq:
        return str(
            gptq.quantized_copy(
                source, settings.gptq_bits, settings.gptq_dataset, settings.revision, settings.trust_remote_code
            )
        )
    return source


def check_load_report(name: str, report: dict) -> None:
    """A model whose weights did not all load never serves: any weight missing from the files, left over in them,
    of the wrong shape, or failing to load is an error naming the first few."""
    problems = []
    for key, what in (
        ("missing_keys", "missing from its files (they would be random)"),
        ("unexpected_keys", "in its files but not in the model"),
        ("mismatched_keys", "of another shape than the model's"),
        ("error_msgs", "failed to load"),
    ):
        found = sorted(str(item) for item in report.get(key) or ())
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            problems.append(f"{len(found)} weights {what}: {shown}")
    if problems:
        raise ModelLoadError(
            f"{MODEL_SETTING}={name}: not every weight loaded ({'; '.join(problems)}); a quantised folder needs its "
            "own quantization_config in config.json, anything else needs its files saved again with save_pretrained"
        )


def _check_source(settings: ModelSettings, source: str, local: bool) -> str | None:
    """Check a local folder; for a hub id, why it must come from the local cache alone (None: it need not).

    Raises the failure this hub id already had with these settings, without trying again.
    """
    if local:
        check_local_folder(Path(source), settings.name_or_path)
        return None
    key = _failure_key(settings)
    offline, endpoint = key[1], key[2]
    if key in _hub_failures:
        raise _hub_failures[key]
    return "HF_HUB_OFFLINE is set" if offline else hub_unreachable(endpoint)


def _load_error(
    settings: ModelSettings, source: str, local: bool, offline_reason: str | None, exc: Exception
) -> ModelLoadError | None:
    """The one-line error a failed load becomes (None: let `exc` through as it is); an offline failure is
    remembered."""
    if local:  # a broken folder fails in many ways; each is about the folder
        return _folder_error(settings, source, exc)
    if offline_reason is not None:
        error = _offline_error(settings, offline_reason)
        _hub_failures[_failure_key(settings)] = error
        return error
    if isinstance(exc, (OSError, ValueError)):
        return _hub_error(settings, exc)
    return None
