"""The API's request bodies: OpenAI's completions and chat completions, with the vLLM extensions we honour.

Parsed as the OpenAPI schema reads them (JSON types, no "1" for 1 nor true for 1), so what the schema allows is what
the routes take. Nothing is silently dropped: OpenAI's and vLLM's fields this server cannot honour are taken only at
their neutral value (`REFUSED`), and any field this server does not know is refused by name, as OpenAI's API does.
The fields the field's routers add to every request they forward (vllm-router 0.1.17 and sglang-router 0.3.2 parse
the body into SGLang's request type and send its defaults along: `no_stop_trim`, `skip_special_tokens`,
`return_hidden_states`, `ignore_eos`, `echo`, and on chat `logprobs`, `continue_final_message` and the reasoning
switches) are taken where they cannot change the answer: at the value this server always behaves by, or at any value
when this server has nothing they act on (no reasoning parser). Any other value stays a 400 naming the field.
Limits that depend on the served model (its name, vocabulary and context) are set per server by `served_models`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, field_validator

from batching.engine.params import MAX_SEED, RequestParams, SamplingParams
from batching.serve.stops import MAX_STOP_CHARS, MAX_STOP_STRINGS

# Below this a temperature is raised to it, as vLLM does: logits divided by less overflow float32 (0 means greedy).
MIN_TEMPERATURE = 0.01

# Fields of OpenAI's API (and vLLM's) this server cannot honour: taken only at their neutral value, else a 400
# naming them with what to do instead.
REFUSED = {
    "n": "this server returns one choice per request: use 1 or leave it out",
    "best_of": "this server returns one choice per request: use 1 or leave it out",
    "logprobs": "this server returns no log probabilities: leave it out",
    "top_logprobs": "this server returns no log probabilities: leave it out",
    "echo": "leave it out",
    "suffix": "leave it out",
    "presence_penalty": "use repetition_penalty (vLLM's extension) instead",
    "frequency_penalty": "use repetition_penalty (vLLM's extension) instead",
    "logit_bias": "leave it out",
    "min_p": "use top_p or top_k",
    "stop_token_ids": "use stop strings",
    "tools": "this server has no tool calling: leave it out",
    "tool_choice": "this server has no tool calling: leave it out",
    "response_format": "this server has no structured output: leave it out",
    # SGLang's, which vllm-router and sglang-router add to every request they forward, at these neutral values
    "no_stop_trim": "this server always leaves the stop string out of the text: use false or leave it out",
    "skip_special_tokens": "this server always leaves special tokens out of the text: use true or leave it out",
    "return_hidden_states": "this server returns no hidden states: use false or leave it out",
    "continue_final_message": "this server always starts a new assistant turn: use false or leave it out",
}


def _whole(value: object) -> object:
    """JSON Schema's integer: 3.0 is one."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _json_equal(expected: object) -> BeforeValidator:
    """Equality as JSON has it (true is not 1) for a field taken only at one value: Python's `True == 1`."""

    def check(value: object) -> object:
        if value is not None and isinstance(value, bool) != isinstance(expected, bool):
            raise ValueError(f"Input should be {expected!r}")
        return _whole(value)

    return BeforeValidator(check)


_WHOLE = BeforeValidator(_whole)
One = Annotated[Literal[1], _json_equal(1)]
No = Annotated[Literal[False], _json_equal(False)]
Yes = Annotated[Literal[True], _json_equal(True)]
Cap = Annotated[int, Field(ge=1), _WHOLE]
TopK = Annotated[int, Field(ge=-1), _WHOLE]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), _WHOLE]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopStrings = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
PromptText = Annotated[str, Field(pattern=r"\S")]  # some text besides whitespace (str.strip's, as the engine's)
Zero = Annotated[float, Field(ge=0.0, le=0.0)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", regex_engine="python-re", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _unicode(cls, value: object) -> object:
        """Text must be Unicode: JSON's escapes can spell a lone surrogate (`"\\ud83d"`), which no tokenizer takes."""
        for text in value if isinstance(value, list) else (value,):
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ValueError(
                        f"character {exc.start} is a lone surrogate ({text[exc.start]!r}), not text: send whole "
                        "characters (a surrogate pair, or UTF-8)"
                    ) from None
        return value


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: every chunk carries the usage so far


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that leaves a sampling field out gets: the model's generation config, else OpenAI's defaults
    (temperature 1, so a request without `temperature` samples, as on OpenAI's API and vLLM's server)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0


class GenerationFields(_Body):
    """What both endpoints share: the model, how many tokens, how they are chosen, and streaming."""

    model: str | None = None
    max_tokens: Cap | None = None
    max_completion_tokens: Cap | None = None
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: StopString | StopStrings | None = None
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user id, for the server's own records: it changes nothing in the answer
    # Taken only at their neutral value (REFUSED)
    n: One | None = None
    presence_penalty: Zero | None = None
    frequency_penalty: Zero | None = None
    logit_bias: None = None
    min_p: Zero | None = None
    stop_token_ids: None = None
    tools: None = None
    tool_choice: None = None
    response_format: None = None
    # SGLang's, sent by the routers at these values (REFUSED at any other)
    no_stop_trim: No | None = Field(None, description="SGLang's: the stop string is always left out here")
    skip_special_tokens: Yes | None = Field(None, description="SGLang's: special tokens are always left out here")
    return_hidden_states: No | None = Field(None, description="SGLang's: no hidden states are returned here")

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def cap(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def request_params(self, cap: int, defaults: SamplingDefaults) -> RequestParams:
        """The engine's parameters: absent fields take `defaults`; temperature 0 means greedy; no seed, a fresh one
        (two identical sampled requests differ, as on OpenAI's API)."""
        temperature = defaults.temperature if self.temperature is None else self.temperature
        penalty = defaults.repetition_penalty if self.repetition_penalty is None else self.repetition_penalty
        greedy = temperature == 0
        sampling = SamplingParams(
            do_sample=not greedy,
            temperature=1.0 if greedy else max(temperature, MIN_TEMPERATURE),
            top_k=defaults.top_k if self.top_k is None else max(self.top_k, 0),
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            repetition_penalty=penalty,
            seed=secrets.randbits(63) if self.seed is None else self.seed,
        )
        return RequestParams(cap, sampling, self.stop_strings(), bool(self.ignore_eos))


class CompletionRequest(GenerationFields):
    """`POST /v1/completions`: one prompt, as text or token ids."""

    prompt: PromptText | list[int] | list[PromptText] | list[list[int]]
    best_of: One | None = None
    logprobs: None = None
    echo: No | None = None
    suffix: Literal[""] | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: object) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one (the schema allows no more)
        if isinstance(prompt, str | list):
            return prompt
        raise ValueError("prompt must be a string or a list of token ids")

    def one_prompt(self) -> str | list[int]:
        """The prompt, once the validator has reduced a one-element batch to it."""
        prompt = self.prompt
        if isinstance(prompt, str) or all(isinstance(token, int) for token in prompt):
            return prompt  # type: ignore[return-value]
        raise ValueError("prompt must be a string or a list of token ids")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None  # handed to the chat template with the message, as vLLM does

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationFields):
    """`POST /v1/chat/completions`: a conversation, rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: No | None = None
    top_logprobs: None = None
    continue_final_message: No | None = Field(None, description="vLLM's: a new assistant turn is always started here")
    # vLLM's and SGLang's reasoning fields, sent by the routers: no reasoning parser here, so any value is the same
    separate_reasoning: bool | None = Field(None, description="SGLang's: no reasoning parser here, no effect")
    stream_reasoning: bool | None = Field(None, description="SGLang's: no reasoning parser here, no effect")
    include_reasoning: bool | None = Field(None, description="vLLM's: no reasoning parser here, no effect")

    def conversation(self) -> list[dict[str, str]]:
        """Messages as the chat template takes them (OpenAI's `developer` role is a system message)."""
        turns = []
        for message in self.messages:
            turn = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
            if message.name is not None:
                turn["name"] = message.name
            turns.append(turn)
        return turns


@dataclass(frozen=True)
class ServedLimits:
    """What the served model takes: its id, its vocabulary, the longest prompt in token ids, and its window (the
    positions a prompt and its answer share: the context, or the KV cache if smaller)."""

    model_id: str
    vocab_size: int
    max_prompt_tokens: int
    window: int

    @property
    def max_new_tokens(self) -> int:
        """The largest `max_tokens`, a one-token prompt's room; a smaller one that does not fit beside a longer
        prompt is cut to the room it leaves, as vLLM does (the answer ends with "length")."""
        return self.window - 1


def served_models(limits: ServedLimits) -> tuple[type[CompletionRequest], type[ChatCompletionRequest]]:
    """The two request bodies with this server's limits in their fields, so its OpenAPI schema states them."""
    cap = Annotated[int, Field(ge=1, le=limits.max_new_tokens), _WHOLE]
    token = Annotated[int, Field(ge=0, lt=limits.vocab_size), _WHOLE]
    ids = Annotated[list[token], Field(min_length=1, max_length=limits.max_prompt_tokens)]
    one = {"min_length": 1, "max_length": 1}
    prompt = PromptText | ids | Annotated[list[PromptText], Field(**one)] | Annotated[list[ids], Field(**one)]
    shared: dict[str, Any] = {
        "model": (str | None, Field(None, json_schema_extra={"enum": [limits.model_id, None]})),
        "max_tokens": (cap | None, None),
        "max_completion_tokens": (cap | None, None),
    }
    completion = create_model("CompletionRequest", __base__=CompletionRequest, prompt=(prompt, ...), **shared)
    chat = create_model("ChatCompletionRequest", __base__=ChatCompletionRequest, **shared)
    return completion, chat
