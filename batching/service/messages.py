"""What crosses the pipe between the engine process and its client: plain picklable dataclasses.

Client -> engine: `Submit`, `Cancel`, `OpenPrivate`, `RunPrivate`, `ClosePrivate`, `Shutdown`.
Engine -> client: `Ready` or `LoadFailed` once, then `Outputs` (one per batcher step), `RunEnded`, `EngineStats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batching.arrivals import Schedule
from batching.engine.batcher import BatcherOptions
from batching.engine.events import Event
from batching.engine.request import Request
from config.settings import EngineSettings, ModelSettings, TokenizerSettings


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine process needs to start: the model to load and its own limits.

    `initializer` (a module-level function, like `multiprocessing.Pool`'s) runs in the engine process before the
    model loads: logging set-up, or a fault a test wants to inject there.
    """

    model: ModelSettings
    tokenizer: TokenizerSettings
    engine: EngineSettings
    initializer: Callable[[], None] | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the page shows about the loaded model, sent by the engine once it is ready."""

    name: str
    num_parameters: int
    device: str
    dtype: str
    context_length: int
    load_seconds: float
    pid: int
    features: str = ""  # the attention features in use, e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50"
    context_reason: str = ""  # why the context is shorter than the model's, if it is


# --- client -> engine -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """A request (already tokenised and checked by the client) for the shared batcher with these options."""

    options: BatcherOptions
    request: Request


@dataclass(frozen=True)
class Cancel:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class OpenPrivate:
    """A batcher of the client's own (a comparison replay, a race lane), stepped in the same loop as the others."""

    batcher_id: str
    mode: str
    options: BatcherOptions


@dataclass(frozen=True)
class RunPrivate:
    """Run these requests on a private batcher, arriving on `schedule` (request i at `schedule.due[i]`)."""

    batcher_id: str
    requests: tuple[Request, ...]
    schedule: Schedule


@dataclass(frozen=True)
class ClosePrivate:
    batcher_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Submit | Cancel | OpenPrivate | RunPrivate | ClosePrivate | Shutdown


# --- engine -> client -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True)
class LoadFailed:
    """The model did not load; `model_error` says the message is a `ModelLoadError`'s (names the setting)."""

    message: str
    model_error: bool
    unsupported: bool = False  # it loaded, but the engine cannot run it exactly (`UnsupportedModelError`)


@dataclass(frozen=True)
class Outputs:
    """Everything one step of one batcher emitted: `source` is the shared batcher's options or a private id."""

    source: BatcherOptions | str
    events: tuple[Event, ...]


@dataclass(frozen=True)
class RunEnded:
    """A private run is over: its clock's start and end (its own steps only), or why it failed."""

    batcher_id: str
    start: float
    end: float
    error: str | None = None


@dataclass(frozen=True)
class EngineStats:
    """Live batchers, sent whenever the set changes."""

    shared: tuple[BatcherOptions, ...] = ()
    private: int = 0

    @property
    def live_engines(self) -> int:
        return len(self.shared) + self.private
