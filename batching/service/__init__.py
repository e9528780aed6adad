"""The engine process and its clients: one process per server steps every batcher; pages (and the API) talk to it.

- `client`: `EngineClient` starts the process and hands out `Session`s (on the shared batchers),
  `PrivateBatcher`s (a client's own, e.g. the page's comparison replays), and `RaceHandle`s (a continuous and a
  static lane of a client's own, stepped in turn on fair clocks: `batching.race`). It is made of one part per job:
  `lifecycle` (the process: start, death, restart), `routing` (who waits for what, and the outputs routed to them),
  `admission` (checks and limits on every request), `private` (private batchers and races).
- `launch`: starting the process; `process`: its entry point and loop; `core`: the batchers it owns, stepped
  round-robin.
- `messages`: what crosses the pipe; `handles`: sessions, private runs, races and the errors a client sees.
"""

from batching.service.client import EngineClient, engine_options
from batching.service.handles import (
    BatcherLoad,
    EngineDeadError,
    PrivateBatcher,
    PrivateRun,
    QueueFullError,
    RaceHandle,
    Session,
    Submitted,
)
from batching.service.messages import EngineConfig, EngineInfo, EngineStats

__all__ = [
    "BatcherLoad",
    "EngineClient",
    "EngineConfig",
    "EngineDeadError",
    "EngineInfo",
    "EngineStats",
    "PrivateBatcher",
    "PrivateRun",
    "QueueFullError",
    "RaceHandle",
    "Session",
    "Submitted",
    "engine_options",
]
