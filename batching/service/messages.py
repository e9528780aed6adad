"""What crosses the pipe between the engine process and its client: plain picklable dataclasses.

Client -> engine: `Submit`, `Cancel`, `OpenPrivate`, `RunPrivate`, `ClosePrivate`, the race's `StartRace`,
`RaceAdd`, `RacePace`, `StopRace`, `CloseRace`, and `Shutdown`.
Engine -> client: `Progress` lines while it starts, `Ready` or `LoadFailed` once, then `Outputs` (one per batcher
step), `RunEnded`, `LaneOutputs` (one per race step), `RaceEnded`, `EngineStats`; and a `Heartbeat` every
`HEARTBEAT_S` from its start to its end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from batching.arrivals import Schedule
from batching.engine.compiled import CompileState
from batching.engine.events import Event
from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions
from batching.engine.request import Request
from batching.engine.threads import ThreadChoice
from batching.race import LaneStep
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
    # A batcher whose compiled graphs (and the paged-decode operator) are made before the engine says `Ready`, each
    # said in a `Progress` line: the API server's, so no request it serves waits on a compiler. None: made in the
    # background when first asked (the page's engine).
    prepare: BatcherOptions | None = None
    # A batcher whose compiled graphs start being made in the background once the engine is ready, while it is idle
    # (the page's default race): a race waits for its graphs before its first step, so the sooner they are made,
    # the less a first race waits. None: made when a race or a step first asks.
    background_graphs: BatcherOptions | None = None
    # The torch thread count to run on, untimed: a restart keeps its first start's choice (`EngineInfo.thread_choice`),
    # so it neither times the counts again (seconds on a busy machine) nor makes graphs for another count. None: timed.
    threads: ThreadChoice | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the page shows about the loaded model, sent by the engine once it is ready."""

    name: str
    num_parameters: int
    device: str
    dtype: str
    load_seconds: float
    pid: int
    geometry: PoolGeometry  # what sizes a batcher's KV pool and bounds its requests (`Admission` checks by it)
    features: str = ""  # the attention features in use, e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50"
    thread_choice: ThreadChoice | None = None  # how many torch threads the engine runs on, and why
    weights: str = ""  # the weights' precision and bytes, e.g. "4-bit GPTQ, group 128 weights, 3.2 MiB"
    # Which way compiled steps run, e.g. "torch internals: on (checked on torch 2.13)" (`torch_gate`); "" when off.
    compile_route: str = ""

    @property
    def threads(self) -> str:
        """The thread choice in one line (`engine.threads.ThreadChoice.line`)."""
        return "" if self.thread_choice is None else self.thread_choice.line()


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
class StartRace:
    """Race these requests on a continuous and a static lane of the client's own (see `batching.race`);
    `cpu_clock`: the lanes' clocks count the engine thread's CPU time during their steps, where that is all of a
    step's work (a load sweep; else wall time, as every race)."""

    race_id: str
    options: BatcherOptions
    requests: tuple[Request, ...]
    schedule: Schedule
    pause_s: float = 0.0
    cpu_clock: bool = False


@dataclass(frozen=True)
class RaceAdd:
    """A request typed during the race: it joins every lane at the same clock time."""

    race_id: str
    request: Request


@dataclass(frozen=True)
class RacePace:
    """Slow motion: pause this long between the race's steps (outside both clocks)."""

    race_id: str
    pause_s: float


@dataclass(frozen=True)
class StopRace:
    race_id: str


@dataclass(frozen=True)
class CloseRace:
    race_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (
    Submit
    | Cancel
    | OpenPrivate
    | RunPrivate
    | ClosePrivate
    | StartRace
    | RaceAdd
    | RacePace
    | StopRace
    | CloseRace
    | Shutdown
)


# --- engine -> client -----------------------------------------------------------------------------------------
HEARTBEAT_S = 0.5


@dataclass(frozen=True)
class Heartbeat:
    """The engine process is scheduled and its interpreter runs (sent by a thread of its own); `rounds`: how many
    times its loop has gone round, so a loop stuck in one step shows too."""

    rounds: int


@dataclass(frozen=True)
class Progress:
    """A line about the engine's start (a graph being made, and how long it took), logged by the client."""

    line: str


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
class LaneOutputs:
    """One step of one lane of a race."""

    race_id: str
    step: LaneStep


@dataclass(frozen=True)
class RaceEnded:
    """Every lane of a race is done (`walls`: each lane's (mode, start, end) on its clock, which counted `clock`:
    wall or cpu time), or why it failed."""

    race_id: str
    walls: tuple[tuple[str, float, float], ...] = ()
    error: str | None = None
    clock: str = "wall"


@dataclass(frozen=True)
class EngineStats:
    """Live batchers and the compiled steps' state, sent whenever either changes."""

    shared: tuple[BatcherOptions, ...] = ()
    private: int = 0
    compile: CompileState = field(default_factory=lambda: CompileState("off"))

    @property
    def live_batchers(self) -> int:
        """Every batcher in the engine process: shared, private, and race lanes."""
        return len(self.shared) + self.private
