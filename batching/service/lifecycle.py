"""The engine process's life, from its client's side: start it, write its command pipe, read its outputs, watch its
heartbeat, and restart it when it dies or stops making progress.

Like vLLM V1's engine-core client (`vllm/v1/engine/core_client.py`: a monitor thread waits on the core's process
and marks the engine dead), a receiver thread reads the outputs and notices the process exit; unlike vLLM, which
then shuts its server down, the receiver restarts the engine at once, off every caller's thread, so a server comes
back without any request arriving. A watchdog thread reads the engine's heartbeat (`Heartbeat`, sent from a thread
of its own every `HEARTBEAT_S`, carrying how many rounds its loop has run): an engine silent for
`heartbeat_timeout_s` (stopped by SIGSTOP, or its interpreter hung), or whose loop ran no round for
`step_timeout_s` (a hung step), is killed and restarted. Either way everything still waiting ends with an error at
once (`Routes.engine_died`). More than `max_restarts` restarts within `restart_window_s` and it gives up, telling
`on_give_up` (the API server exits non-zero then, for its process manager to restart it; the page starts the engine
again when a person next asks).

Commands go through a writer thread with a queue of its own per process: a caller never blocks on a full pipe (a
stopped engine reads none), and the commands keep their order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import queue
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Protocol

from batching.engine.model_support import UnsupportedModelError
from batching.service.handles import EngineDeadError
from batching.service.launch import EngineProcess
from batching.service.messages import (
    Command,
    EngineConfig,
    EngineInfo,
    EngineStats,
    Heartbeat,
    LaneOutputs,
    LoadFailed,
    Outputs,
    Progress,
    RaceEnded,
    Ready,
    RunEnded,
    Shutdown,
)
from model.loader import ModelLoadError

logger = logging.getLogger(__name__)

DEATH_CHECK_S = 0.5
WATCH_EVERY_S = 0.1
# A starting engine may be silent longer: a fresh interpreter imports torch before its heartbeat starts, and a
# model's load or a graph's build can hold the interpreter lock for seconds at a time.
START_SILENCE_S = 120.0
SIGNALLED_GRACE_S = 0.5

Routed = Outputs | RunEnded | LaneOutputs | RaceEnded


class EngineState(enum.Enum):
    RUNNING = "ok"
    RESTARTING = "restarting"
    GAVE_UP = "gave up"  # restarted too often: not restarted again until a person asks (`ensure_running`)
    STOPPED = "stopped"  # closed on purpose


# Why an engine was restarted, as counted (`restart_causes`)
EXITED, SILENT, HUNG = "exited", "unresponsive", "hung"
CAUSES = (EXITED, SILENT, HUNG)


class Routes(Protocol):
    """Where the engine's outputs go, and who hears of its death and restart (`batching.service.routing.Router`)."""

    def deliver(self, message: Routed) -> None: ...
    def engine_died(self, message: str) -> None: ...
    def engine_restarted(self) -> None: ...


class CommandWriter:
    """One process's command pipe, written by a thread of its own from a queue: `put` never blocks."""

    def __init__(self, commands: Connection) -> None:
        self._queue: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._commands = commands
        threading.Thread(target=self._write, name="batchscope-commands", daemon=True).start()

    def put(self, command: Command) -> None:
        self._queue.put(command)

    def stop(self) -> None:
        self._queue.put(None)

    def _write(self) -> None:
        while (command := self._queue.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:  # the process is gone: its receiver says so
                return


class EngineLifecycle:
    """One engine process at a time for `config`: started (the model loaded) on creation, replaced when it dies or
    hangs. Raises ModelLoadError, UnsupportedModelError or RuntimeError if the first process cannot start."""

    def __init__(self, config: EngineConfig, routes: Routes, on_give_up: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.routes = routes
        self.on_give_up = on_give_up
        self.restarts = 0
        self.restart_causes = dict.fromkeys(CAUSES, 0)
        self.last_error: str | None = None
        self.stats = EngineStats()
        self.process: EngineProcess | None = None
        self.state = EngineState.RESTARTING
        # One order for commands; a submit holds it around its bookkeeping too, so a cancel never overtakes it.
        self.send_lock = threading.Lock()
        self.stopping = threading.Event()  # set when the client stops its engine on purpose (close, exit)
        self._start_lock = threading.Lock()
        self._writer: CommandWriter | None = None
        self._generation = 0
        self._cause = EXITED
        self._recent: deque[float] = deque()  # when the latest restarts began (time.monotonic)
        self._heard = self._progressed = time.monotonic()  # the latest message, and the latest new round
        self._rounds = 0
        self._finalizer: weakref.finalize | None = None
        self.info: EngineInfo = self._start()
        threading.Thread(target=self._watch, name="batchscope-watchdog", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.state is EngineState.RUNNING

    @property
    def generation(self) -> int:
        """Which process this is: 1 for the first, one more for each restart."""
        return self._generation

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _start(self, restart: str | None = None) -> EngineInfo:
        """Start the engine process and wait until its model is loaded; raises ModelLoadError or RuntimeError.
        `restart`: why the last one went (the restart is counted as the new one comes up); it keeps the first
        start's torch thread count."""
        config = self.config
        if restart is not None and config.threads is None:
            config = dataclasses.replace(config, threads=self.info.thread_choice)
        process = EngineProcess(config)
        first = self._first_answer(process)
        if isinstance(first, LoadFailed):
            process.wait(5)
            if first.unsupported:
                raise UnsupportedModelError(first.message)
            raise (ModelLoadError if first.model_error else RuntimeError)(first.message)
        with self.send_lock:
            self.process, self._writer = process, CommandWriter(process.commands)
            self._generation += 1
            self.stats = EngineStats()
            self._heard = self._progressed = time.monotonic()
            self._rounds = 0
            if restart is not None:
                self.restarts += 1
                self.restart_causes[restart] += 1
            self.state = EngineState.RUNNING
        if self._finalizer is not None:  # the last process is gone
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shut_down, process, self._writer, self.stopping)
        threading.Thread(
            target=self._receive, args=(process, self._generation), name="batchscope-receiver", daemon=True
        ).start()
        logger.info("engine process %d ready (%s)", process.pid, first.info.name)
        return first.info

    def _first_answer(self, process: EngineProcess) -> Ready | LoadFailed:
        """`Ready` or `LoadFailed`, logging the start's progress lines; a start that dies or falls silent (no
        heartbeat for `START_SILENCE_S`) is a RuntimeError."""
        silence = max(START_SILENCE_S, self.config.engine.heartbeat_timeout_s)
        try:
            while True:
                if not process.outputs.poll(silence):
                    process.kill()
                    raise RuntimeError(f"the engine process went silent for {silence:.0f} s while starting")
                message = process.outputs.recv()
                if isinstance(message, Progress):
                    logger.info("%s", message.line)
                elif isinstance(message, Ready | LoadFailed):
                    return message
        except (EOFError, OSError):
            process.wait(5)
            raise RuntimeError(f"the engine process exited while starting ({process.describe_exit()})") from None

    def ensure_running(self) -> bool:
        """Start a new engine process now if the supervisor gave up on the last one (a person asked); True when it
        did. Raises EngineDeadError while a restart is under way (it does not wait for it)."""
        if self.alive or self.stopping.is_set():
            return False
        if self.state is EngineState.RESTARTING:
            raise EngineDeadError(self.dead_message())
        with self._start_lock:
            if self.alive:
                return False
            logger.warning("starting the engine again, as asked (%s)", self.last_error)
            self._recent.clear()
            self.info = self._start(restart=self._cause)
            self.routes.engine_restarted()
            return True

    def stop_restarting(self) -> None:
        """The client is going away (a signal told its server to stop, and may have told the engine too): an
        engine that ends from now on is not restarted. `close` stops it."""
        self.stopping.set()

    def close(self) -> None:
        """Stop the engine process (also done at interpreter exit)."""
        with self.send_lock:
            self.state = EngineState.STOPPED
            if self.process is not None and self._writer is not None:
                _shut_down(self.process, self._writer, self.stopping)

    def send(self, command: Command) -> None:
        with self.send_lock:
            self.send_unlocked(command)

    def send_unlocked(self, command: Command) -> None:
        """`send` for a caller that already holds `send_lock`; raises EngineDeadError. Never blocks on the pipe."""
        if not self.alive or self._writer is None:
            raise EngineDeadError(self.dead_message())
        self._writer.put(command)

    def send_if_alive(self, command: Command) -> None:
        """Send a command that a dead engine has carried out already (a cancel, a close: its work has ended)."""
        if self.alive:
            with contextlib.suppress(EngineDeadError):
                self.send(command)

    def dead_message(self) -> str:
        cause = self.last_error or "not running"
        if self.state is EngineState.STOPPED:
            return "the engine was stopped (its client closed it)"
        if self.state is EngineState.GAVE_UP:
            config = self.config.engine
            return (
                f"the engine stopped ({cause}) after {config.max_restarts} restarts within "
                f"{config.restart_window_s:.0f} s, and is not restarted again"
            )
        return f"the engine stopped ({cause}); it is being restarted: try again in a moment"

    # --- the receiver and the watchdog ------------------------------------------------------------------------
    def _receive(self, process: EngineProcess, generation: int) -> None:
        """Hand on the engine's messages until its pipe closes or it exits; then fail everything still waiting and
        start a new process.

        (The exit check: another engine forked from this process may hold a copy of this pipe, hiding the EOF.)
        """
        outputs = process.outputs
        try:
            while True:
                if not outputs.poll(DEATH_CHECK_S):
                    if process.exit_code() is not None:
                        break
                    continue
                message = outputs.recv()
                self._heard = time.monotonic()
                if isinstance(message, Heartbeat):
                    if message.rounds != self._rounds:
                        self._rounds, self._progressed = message.rounds, self._heard
                elif isinstance(message, EngineStats):
                    self.stats = message
                elif isinstance(message, Outputs | RunEnded | LaneOutputs | RaceEnded):
                    self.routes.deliver(message)
        except (EOFError, OSError):
            pass
        process.wait(2)
        self._lost(generation, f"the engine process stopped: {process.describe_exit()}", EXITED)
        if process.exit_code() in (-signal.SIGTERM, -signal.SIGINT):  # sent on purpose, perhaps to us too:
            self.stopping.wait(SIGNALLED_GRACE_S)  # a server told to stop by it says so first
        if generation == self._generation and not self.stopping.is_set():
            self._restart()

    def _watch(self) -> None:
        """Kill an engine that went silent or whose loop stopped going round (its receiver restarts it)."""
        config = self.config.engine
        while not self.stopping.is_set():
            time.sleep(WATCH_EVERY_S)
            process, generation, now = self.process, self._generation, time.monotonic()
            if not self.alive or process is None:
                continue
            if now - self._heard > config.heartbeat_timeout_s:
                cause = (
                    f"no heartbeat for {now - self._heard:.1f} s (heartbeat_timeout_s={config.heartbeat_timeout_s:g}):"
                    " stopped or hung"
                )
                kind = SILENT
            elif now - self._progressed > config.step_timeout_s:
                cause = (
                    f"one round of steps ran {now - self._progressed:.1f} s (step_timeout_s={config.step_timeout_s:g})"
                )
                kind = HUNG
            else:
                continue
            if self._lost(generation, cause, kind):
                process.kill()

    def _lost(self, generation: int, cause: str, kind: str) -> bool:
        """Process `generation` is gone or useless: say why, end everything waiting on it; False if that was said
        already (or it was stopped on purpose)."""
        with self.send_lock:
            if generation != self._generation or not self.alive or self.stopping.is_set():
                return False
            self.state = EngineState.RESTARTING
            self.last_error, self._cause = cause, kind
            if self._writer is not None:
                self._writer.stop()
            logger.error("engine process %s: %s", self.pid, cause)
            self.routes.engine_died(self.dead_message())
            self.stats = EngineStats()
            return True

    def _restart(self) -> None:
        """Start new processes until one is ready, or give up after `max_restarts` within `restart_window_s`."""
        config = self.config.engine
        while not self.stopping.is_set():
            now = time.monotonic()
            while self._recent and now - self._recent[0] > config.restart_window_s:
                self._recent.popleft()
            if len(self._recent) >= config.max_restarts:
                with self.send_lock:
                    self.state = EngineState.GAVE_UP
                message = self.dead_message()
                logger.error("%s", message)
                if self.on_give_up is not None:
                    self.on_give_up(message)
                return
            self._recent.append(now)
            logger.warning(
                "restarting the engine (restart %d within %.0f s, at most %d; cause: %s)",
                len(self._recent),
                config.restart_window_s,
                config.max_restarts,
                self.last_error,
            )
            started = time.perf_counter()
            try:
                with self._start_lock:
                    self.info = self._start(restart=self._cause)
            except (ModelLoadError, UnsupportedModelError, RuntimeError) as exc:
                logger.error("the engine did not restart: %s", exc)
                continue
            logger.warning("engine restarted in %.1f s (cause: %s)", time.perf_counter() - started, self.last_error)
            self.routes.engine_restarted()
            return


def _shut_down(process: EngineProcess, writer: CommandWriter, stopping: threading.Event) -> None:
    """Ask the engine process to stop, then make sure it has (a stopped one, which reads nothing, is killed)."""
    stopping.set()
    writer.put(Shutdown())
    process.wait(3)
    if process.exit_code() is None:
        process.kill()
