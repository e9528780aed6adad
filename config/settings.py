"""The settings tree. Every value can come from the environment (`BATCHSCOPE_GROUP__FIELD`) or a `.env` file."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BATCHSCOPE_"
ENV_DELIMITER = "__"

Policy = Literal["fcfs", "shortest-first", "longest-first"]
# The Q/A format the embedded model was trained on (model.prompting fills it).
DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly customer-support assistant for an online shop. Answer the customer's question."
)
DEFAULT_TEMPLATE = "{system_prompt}\n\nQ: {prompt}\nA:"


class ModelSettings(BaseModel):
    """Which model to load and where to put it."""

    name_or_path: str = Field("builtin", min_length=1, description="`builtin`, a hub id or a local folder")
    revision: str | None = Field(None, description="hub branch, tag or commit")
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = False
    use_gptq: bool = Field(False, description="quantise on load with GPTQ (needs a GPU and gptqmodel)")
    gptq_bits: Literal[2, 3, 4, 8] = 4
    gptq_backend: Literal["auto", "torch", "triton", "exllama_v2", "marlin"] = "auto"
    gptq_dataset: str = Field("c4", description="calibration data set for quantising an unquantised model")


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
    seed: int = Field(0, ge=0)


class BatchingSettings(BaseModel):
    """The engine's shape: slots, per-step token budget, admission order."""

    max_batch_size: int = Field(8, ge=1, le=256, description="slots: requests decoded together")
    max_batched_tokens: int = Field(512, ge=16, le=65536, description="prefill + decode tokens per step")
    policy: Policy = "fcfs"
    max_seq_len: int = Field(2048, ge=16, le=131072, description="prompt + new tokens per request; sizes the KV cache")

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
    """The engine process: how many shared engines may live at once, and when idle engines and gone tabs are dropped."""

    max_engines: int = Field(4, ge=1, le=64, description="shared engines (one per batch size and policy) at once")
    idle_engine_timeout_s: float = Field(60.0, gt=0, le=86400, description="an engine no one used this long is closed")
    session_timeout_s: float = Field(5.0, gt=0, le=3600, description="a silent tab's requests are cancelled")


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


class Settings(BaseSettings):
    """All of Batchscope's settings."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    model: ModelSettings = ModelSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    generation: GenerationSettings = GenerationSettings()
    batching: BatchingSettings = BatchingSettings()
    limits: LimitSettings = LimitSettings()
    engine: EngineSettings = EngineSettings()
    prompt: PromptSettings = PromptSettings()


class SettingsError(ValueError):
    """A setting has a value that is not allowed; the message is one line naming the variable."""


def _env_name(location: tuple[str | int, ...]) -> str:
    return ENV_PREFIX + ENV_DELIMITER.join(str(part).upper() for part in location)


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and `.env`, raising `SettingsError` with one line per bad value."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            value = error.get("input")
            shown = "" if isinstance(value, dict) else f"={value}"
            problems.append(f"{_env_name(error['loc'])}{shown}: {error['msg']}")
        raise SettingsError("; ".join(problems)) from None
