"""The API's request bodies (OpenAI's completions and chat completions, with vLLM's extensions we honour).

Fields the engine cannot honour are refused with a 400 naming them, never silently dropped: `n` other than 1,
`logprobs`, `best_of`, penalties other than 0. Unknown fields are ignored, as OpenAI-compatible servers do, so
clients that send their own extras still work.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batching.engine.params import RequestParams, SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationFields(BaseModel):
    """What both endpoints share: the model, how many tokens, how they are chosen, and streaming."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @model_validator(mode="after")
    def _only_what_we_honour(self) -> GenerationFields:
        if self.n != 1:
            raise ValueError(f"n={self.n} is not supported: this server returns one choice per request (n=1)")
        if self.best_of not in (None, 1):
            raise ValueError(f"best_of={self.best_of} is not supported: use 1 or leave it out")
        if self.logprobs not in (None, False, 0):
            raise ValueError("logprobs is not supported by this server: leave it out")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0.0:
                raise ValueError(f"{name} is not supported: use repetition_penalty (vLLM's extension) instead")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if any(not stop for stop in stops):
            raise ValueError("stop strings must not be empty")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def request_params(self, default_max_tokens: int, default_sampling: SamplingParams) -> RequestParams:
        """The engine's parameters: absent fields take the server's defaults; temperature 0 means greedy."""
        cap = self.max_completion_tokens or self.max_tokens or default_max_tokens
        base = default_sampling
        temperature = base.temperature if self.temperature is None else self.temperature
        do_sample = base.do_sample if self.temperature is None else self.temperature > 0
        sampling = SamplingParams(
            do_sample=do_sample,
            temperature=temperature if do_sample else 1.0,
            top_k=base.top_k if self.top_k is None else max(self.top_k, 0),
            top_p=base.top_p if self.top_p is None else self.top_p,
            repetition_penalty=base.repetition_penalty if self.repetition_penalty is None else self.repetition_penalty,
            seed=base.seed if self.seed is None else self.seed,
        )
        return RequestParams(cap, sampling, self.stop_strings(), self.ignore_eos)


class CompletionRequest(GenerationFields):
    """`POST /v1/completions`: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: object) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError(f"{len(prompt)} prompts in one request are not supported: send one per request")
            prompt = prompt[0]
        if isinstance(prompt, str | list):
            return prompt
        raise ValueError("prompt must be a string or a list of token ids")

    def one_prompt(self) -> str | list[int]:
        """The prompt, once the validator has reduced a one-element batch to it."""
        prompt = self.prompt
        if isinstance(prompt, str) or all(isinstance(token, int) for token in prompt):
            return prompt  # type: ignore[return-value]
        raise ValueError("prompt must be a string or a list of token ids")

    @model_validator(mode="after")
    def _no_echo_or_suffix(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported: leave it out")
        if self.suffix:
            raise ValueError("suffix is not supported: leave it out")
        return self


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationFields):
    """`POST /v1/chat/completions`: a conversation, rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)

    def conversation(self) -> list[dict[str, str]]:
        """Messages as the chat template takes them (OpenAI's `developer` role is a system message)."""
        return [
            {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
            for message in self.messages
        ]
