"""The settings tree. Every value can come from the environment (`BATCHSCOPE_GROUP__FIELD`) or a `.env` file."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.choices import ADMISSION_NAMES, BLOCK_SIZES, FCFS, POLICY_NAMES, PREEMPT

ENV_PREFIX = "BATCHSCOPE_"
ENV_DELIMITER = "__"
ENV_FILE = ".env"  # in the working folder
ENV_FILE_ENCODING = "utf-8"

# The Q/A format the embedded model was trained on (model.prompting fills it).
DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly customer-support assistant for an online shop. Answer the customer's question."
)
DEFAULT_TEMPLATE = "{system_prompt}\n\nQ: {prompt}\nA:"
# Settings renamed since they were first published, (group, old field) -> new field: the old name still sets the
# value, so a deployment's environment keeps working, and `setting_warnings` names the new one.
RENAMED = {
    ("engine", "max_engines"): "max_shared_batchers",
    ("engine", "idle_engine_timeout_s"): "idle_shared_batcher_timeout_s",
}


class ModelSettings(BaseModel):
    """Which model to load and where to put it."""

    name_or_path: str = Field("builtin", min_length=1, description="`builtin`, a hub id or a local folder")
    revision: str | None = Field(None, description="hub branch, tag or commit")
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = False
    use_gptq: bool = Field(
        False,
        description="quantise an unquantised model with GPTQ on load, once (the copy is kept in the cache); needs "
        "gptqmodel (requirements-gptq.txt), not a GPU. A GPTQ folder loads as itself without it",
    )
    gptq_bits: Literal[2, 3, 4, 8] = 4
    gptq_dataset: str = Field(
        "builtin",
        min_length=1,
        description="calibration texts for quantising on load: builtin (the embedded corpus) or a text file, one "
        "text a line; nothing is fetched",
    )


class TokenizerSettings(BaseModel):
    """How prompts become token ids."""

    use_fast: bool = True
    padding_side: Literal["left", "right"] = "left"
    truncation_side: Literal["left", "right"] = "left"
    max_prompt_tokens: int = Field(512, ge=1, le=131072)


class GenerationSettings(BaseModel):
    """Defaults for a new request; each request may override them."""

    max_new_tokens: int = Field(128, ge=1, le=131072)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_k: int = Field(0, ge=0, description="0 keeps every token")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    seed: int = Field(0, ge=0, le=2**63 - 1)  # int64, as the engine's SamplingParams (batching/engine/params.py)


# The batching settings that name one of the engine's choices (config/choices.py), and those choices
ENGINE_CHOICES: dict[str, tuple] = {"block_size": BLOCK_SIZES, "policy": POLICY_NAMES, "admission": ADMISSION_NAMES}


def _one_of(value: Any, choices: tuple) -> Any:
    """`value` if it is one of `choices`, else a ValueError listing them (names quoted, as pydantic lists them)."""
    if value not in choices:
        shown = [repr(choice) if isinstance(choice, str) else str(choice) for choice in choices]
        raise ValueError(f"should be {', '.join(shown[:-1])} or {shown[-1]}")
    return value


class BatchingSettings(BaseModel):
    """The engine's shape: slots, per-step token budget, admission order, KV memory."""

    max_batch_size: int = Field(8, ge=1, le=256, description="slots: requests decoded together")
    max_batched_tokens: int = Field(512, ge=16, le=65536, description="prefill + decode tokens per step")
    policy: str = Field(FCFS, description=f"admission order: {', '.join(POLICY_NAMES)}")
    admission: str = Field(
        PREEMPT,
        description="continuous batching's KV blocks: preempt (admit by the prompt's first chunk, preempt the newest "
        "when blocks run out, as vLLM) or reserve (prompt + cap at admission, never preempt, as TensorRT-LLM's "
        "guaranteed-no-evict)",
    )
    max_seq_len: int = Field(2048, ge=16, le=131072, description="prompt + new tokens per request")
    kv_cache_tokens: int | None = Field(
        1024,
        ge=1,
        le=16_777_216,
        description="KV memory of each batcher, in token positions (every layer's keys and values for one token "
        "each); 1,024 makes memory matter on the embedded model: a static wave of 8 reserves more. None: every "
        "slot's whole context",
    )
    kv_cache_mb: float | None = Field(
        None, gt=0, le=1_048_576, description="KV memory of each batcher in MiB; when set, instead of kv_cache_tokens"
    )
    block_size: int = Field(16, description="KV positions per block: one of 1, 2, 4, ... 256")
    prefix_caching: bool = Field(True, description="continuous batching reuses the cached blocks of equal prefixes")

    @field_validator(*ENGINE_CHOICES)
    @classmethod
    def _one_of_the_engines_choices(cls, value: Any, info: ValidationInfo) -> Any:
        return _one_of(value, ENGINE_CHOICES[info.field_name or ""])

    @field_validator("max_batched_tokens")
    @classmethod
    def _budget_leaves_room_for_prompts(cls, budget: int, info: ValidationInfo) -> int:
        slots = info.data.get("max_batch_size")
        if slots is not None and budget <= slots:
            raise ValueError(
                f"must exceed max_batch_size={slots}, so prompts still get prefilled while every slot decodes"
            )
        return budget


class LimitSettings(BaseModel):
    """What one person, and everyone together, may queue at once."""

    max_queue_per_session: int = Field(64, ge=1, le=10000)
    max_queue_total: int = Field(256, ge=1, le=100000)


class EngineSettings(BaseModel):
    """The engine process: how many shared batchers may live in it at once, and when idle ones and gone tabs are
    dropped."""

    max_shared_batchers: int = Field(
        4, ge=1, le=64, description="shared batchers (one per batch size and policy) alive at once"
    )
    idle_shared_batcher_timeout_s: float = Field(
        60.0, gt=0, le=86400, description="a shared batcher no one used this long is closed"
    )
    session_timeout_s: float = Field(5.0, gt=0, le=3600, description="a silent tab's requests are cancelled")
    heartbeat_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="an engine process that sends no heartbeat this long (stopped, or its interpreter hung) is "
        "killed, its requests end with an error, and it is restarted",
    )
    step_timeout_s: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="an engine loop that runs one round of steps this long is taken as hung: killed and restarted "
        "(vLLM's engine iteration timeout is 60 s)",
    )
    max_restarts: int = Field(
        5,
        ge=0,
        le=1000,
        description="more engine restarts than this within restart_window_s and the API server exits non-zero (for "
        "its process manager to restart it); the page starts the engine again when next asked",
    )
    restart_window_s: float = Field(60.0, gt=0, le=86400, description="the window max_restarts counts in")
    compile_steps: bool = Field(
        True, description="compile decode steps (torch.compile) in the background; steps run eager until ready"
    )
    compile_prompt_steps: bool = Field(
        True,
        description="with compile_steps, also compile steps with prompt chunks (every one where attention reads"
        " through the block tables, else up to 128 tokens; a second graph, made when the first such step asks)",
    )
    compile_autotune: bool = Field(
        True,
        description="time inductor's C++ matrix kernels against MKL's and keep the faster: the first compile takes"
        " about 2.5x as long, compiled steps run about 1.4x faster",
    )
    cuda_graphs: bool = Field(
        True, description="on a GPU, replay compiled decode steps from CUDA graphs, captured once per column bucket"
    )
    compile_cache_dir: Path | None = Field(
        None, description="compiled graphs kept on disk; default: <user cache>/batchscope/torch-compile"
    )
    torch_internals: bool = Field(
        True,
        description="compiled steps through torch's private internals (frozen weights, graphs called directly, a "
        "second start that only traces) where the running torch is the one they were checked on; off, or on any "
        "other torch: public torch APIs only (torch.compile), the same answers, slower",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """A value given under a field's old name sets the field, unless the new name is given too."""
        if not isinstance(data, dict):
            return data
        for (group, old), new in RENAMED.items():
            if group == "engine" and old in data:
                data = {new: data[old], **{key: value for key, value in data.items() if key != old}}
        return data


class PromptSettings(BaseModel):
    """The Q/A template the embedded model was trained on."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    template: str = DEFAULT_TEMPLATE

    @field_validator("template")
    @classmethod
    def _template_has_prompt(cls, template: str) -> str:
        if "{prompt}" not in template:
            raise ValueError("must contain {prompt} (and may contain {system_prompt})")
        try:
            template.format(system_prompt="", prompt="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"may only use the fields {{system_prompt}} and {{prompt}}, not {exc}") from None
        return template


class ServerSettings(BaseModel):
    """The OpenAI-compatible API (`python -m batching.serve`, or inside the page's process when `port` is set)."""

    host: str = Field("127.0.0.1", min_length=1, description="where the API listens; 127.0.0.1 keeps it local")
    port: int | None = Field(None, ge=1, le=65535, description="also serve the API from the Streamlit process")
    api_key: str | None = Field(None, min_length=1, description="require `Authorization: Bearer <key>`")
    served_model_name: str | None = Field(None, min_length=1, description="the model id clients use; default: its name")
    max_body_bytes: int = Field(
        2_000_000,
        ge=1024,
        le=2**31 - 1,
        description="a request body over this many bytes is refused (413) before it is read; TGI's default payload "
        "limit",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="a request not answered this long after it came is cancelled and answered 504 (a stream: an "
        "error event); None, as vLLM: no deadline",
    )


class RemoteSettings(BaseModel):
    """A remote OpenAI-compatible server the page can run the queue on instead of the built-in engine."""

    url: str | None = Field(None, min_length=1, description="e.g. http://gpu-box:8000; the page's default address")
    api_key: str | None = Field(None, min_length=1, description="sent as `Authorization: Bearer <key>`")
    model: str | None = Field(None, min_length=1, description="model id to request; default: the first of /v1/models")
    api: Literal["completions", "chat"] = Field("completions", description="/v1/completions or /v1/chat/completions")
    connect_timeout_s: float = Field(5.0, gt=0, le=600, description="longest wait to connect")
    read_timeout_s: float = Field(60.0, gt=0, le=3600, description="longest wait for the next bytes of an answer")
    request_timeout_s: float = Field(600.0, gt=0, le=86400, description="longest one answer may take")
    telemetry_interval_s: float = Field(0.25, ge=0.05, le=60, description="how often /metrics is read")


class PeerSettings(BaseModel):
    """Other engines the benchmarks and tests run next to ours, each installed apart from the app."""

    vllm_python: Path | None = Field(
        None,
        description="the Python of vLLM's own environment (scripts/install-vllm.sh);"
        " default: <user cache>/batchscope/vllm/bin/python",
    )


class Settings(BaseSettings):
    """All of Batchscope's settings."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        env_file=ENV_FILE,
        env_file_encoding=ENV_FILE_ENCODING,
        extra="ignore",
        env_parse_none_str="none",  # e.g. KV_CACHE_TOKENS=none: an optional setting back to None
    )

    model: ModelSettings = ModelSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    generation: GenerationSettings = GenerationSettings()
    batching: BatchingSettings = BatchingSettings()
    limits: LimitSettings = LimitSettings()
    engine: EngineSettings = EngineSettings()
    prompt: PromptSettings = PromptSettings()
    server: ServerSettings = ServerSettings()
    remote: RemoteSettings = RemoteSettings()
    peers: PeerSettings = PeerSettings()


class SettingsError(ValueError):
    """A setting has a value that is not allowed; the message is one line naming the variable."""


def _env_name(location: tuple[str | int, ...]) -> str:
    return ENV_PREFIX + ENV_DELIMITER.join(str(part).upper() for part in location)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment and `.env`, raising `SettingsError` with one line per bad value."""
    try:
        return Settings(**overrides)
    except UnicodeDecodeError as exc:  # only `.env` is read as bytes
        raise SettingsError(_not_utf8(Path(ENV_FILE).resolve(), exc)) from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            value = error.get("input")
            shown = "" if isinstance(value, dict) else f"={value}"
            problems.append(f"{_env_name(error['loc'])}{shown}: {error['msg']}")
        raise SettingsError("; ".join(problems)) from None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    data = exc.object if isinstance(exc.object, bytes) else b""
    line = data[: exc.start].count(b"\n") + 1
    return (
        f"{path}: byte 0x{data[exc.start]:02X} at offset {exc.start} (line {line}) is not {ENV_FILE_ENCODING}; "
        f"save the file as {ENV_FILE_ENCODING.upper()}"
    )


def setting_names() -> list[str]:
    """Every variable name that is a setting: `BATCHSCOPE_<GROUP>__<FIELD>`, and each group as a whole (JSON)."""
    names = []
    for group, info in Settings.model_fields.items():
        names.append(_env_name((group,)))
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)  # every group is a model
        names += [_env_name((group, field)) for field in model.model_fields]
    return names


def setting_warnings(environ: Mapping[str, str] | None = None, env_file: Path | str = ENV_FILE) -> list[str]:
    """One line per `BATCHSCOPE_` environment variable, and per `.env` key, that is not a setting (and so is
    ignored), with the closest valid name. For every entry point at start-up: the page, the CLI, the server."""
    environ = os.environ if environ is None else environ
    valid = setting_names()
    known = set(valid)
    unknown = [(name, "environment variable") for name in environ if name.upper().startswith(ENV_PREFIX)]
    path = Path(env_file)
    if path.is_file():
        try:
            keys = dotenv_values(path, encoding=ENV_FILE_ENCODING)
        except UnicodeDecodeError:  # load_settings says so, in one line
            keys = {}
        unknown += [(key, f"key in {path.resolve()}") for key in keys]
    renamed = {_env_name((group, old)): _env_name((group, new)) for (group, old), new in RENAMED.items()}
    warnings = []
    for name, where in unknown:
        if name.upper() in known:
            continue
        if name.upper() in renamed:
            warnings.append(
                f"{name} ({where}) was renamed {renamed[name.upper()]}: it still works, but use the new name"
            )
            continue
        # Compared without the prefix, which every name shares and which would make any name look close.
        query = name.upper().removeprefix(ENV_PREFIX)
        close = difflib.get_close_matches(query, [v.removeprefix(ENV_PREFIX) for v in valid], n=1, cutoff=0.6)
        hint = (
            f"; did you mean {ENV_PREFIX}{close[0]}?" if close else f"; settings are named {ENV_PREFIX}<GROUP>__<FIELD>"
        )
        warnings.append(f"{name} ({where}) is not a setting and is ignored{hint}")
    return warnings
