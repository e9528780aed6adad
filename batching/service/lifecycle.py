"""The engine process's life, from its client's side: start it, write its command pipe, read its outputs, notice
its death, start a new one.

A receiver thread reads the outputs and hands each to the client's `Routes` (the engine's stats it keeps itself).
When the process dies, everything still waiting ends with an error (`Routes.engine_died`), and the next
`ensure_running` starts a new process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
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

Routed = Outputs | RunEnded | LaneOutputs | RaceEnded


class Routes(Protocol):
    """Where the engine's outputs go, and who hears of its death and restart (`batching.service.routing.Router`)."""

    def deliver(self, message: Routed) -> None: ...
    def engine_died(self, message: str) -> None: ...
    def engine_restarted(self) -> None: ...


class EngineLifecycle:
    """One engine process at a time for `config`: started (the model loaded) on creation, replaced when it dies.

    Raises ModelLoadError, UnsupportedModelError or RuntimeError if the first process cannot start.
    """

    def __init__(self, config: EngineConfig, routes: Routes) -> None:
        self.config = config
        self.routes = routes
        self.restarts = 0
        self.last_error: str | None = None
        self.stats = EngineStats()
        self.process: EngineProcess | None = None
        # One writer on the pipe; a submit holds it around its bookkeeping too, so a cancel never overtakes it.
        self.send_lock = threading.Lock()
        self.stopping = threading.Event()  # set when the client stops its engine on purpose (close, exit)
        self._start_lock = threading.Lock()
        self._commands: Connection | None = None
        self._alive = False
        self._generation = 0
        self.info: EngineInfo = self._start()

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _start(self) -> EngineInfo:
        """Start the engine process and wait until its model is loaded; raises ModelLoadError or RuntimeError."""
        process = EngineProcess(self.config)
        try:
            first = process.outputs.recv()
            while isinstance(first, Progress):
                logger.info("%s", first.line)
                first = process.outputs.recv()
        except EOFError:
            process.wait(5)
            raise RuntimeError(f"the engine process exited while starting ({process.describe_exit()})") from None
        if isinstance(first, LoadFailed):
            process.wait(5)
            if first.unsupported:
                raise UnsupportedModelError(first.message)
            raise (ModelLoadError if first.model_error else RuntimeError)(first.message)
        assert isinstance(first, Ready)
        with self.send_lock:
            self.process, self._commands, self._alive = process, process.commands, True
            self._generation += 1
            self.stats = EngineStats()
        weakref.finalize(self, _shut_down, process, self.stopping)
        threading.Thread(
            target=self._receive, args=(process, self._generation), name="batchscope-receiver", daemon=True
        ).start()
        logger.info("engine process %d ready (%s)", process.pid, first.info.name)
        return first.info

    def ensure_running(self) -> bool:
        """Start a new engine process if the last one died; True when it had to (the page says so)."""
        with self._start_lock:
            if self._alive or self.stopping.is_set():
                return False
            logger.warning("engine process died (%s); starting a new one", self.last_error)
            self.info = self._start()
            self.restarts += 1
            self.routes.engine_restarted()
            return True

    def close(self) -> None:
        """Stop the engine process (also done at interpreter exit)."""
        with self.send_lock:
            if self.process is not None:
                _shut_down(self.process, self.stopping)
            self._alive = False

    def send(self, command: Command) -> None:
        with self.send_lock:
            self.send_unlocked(command)

    def send_unlocked(self, command: Command) -> None:
        """`send` for a caller that already holds `send_lock`; raises EngineDeadError."""
        if not self._alive or self._commands is None:
            raise EngineDeadError(self.dead_message())
        try:
            self._commands.send(command)
        except OSError:
            raise EngineDeadError(self.dead_message()) from None

    def send_if_alive(self, command: Command) -> None:
        """Send a command that a dead engine has carried out already (a cancel, a close: its work has ended)."""
        if self._alive:
            with contextlib.suppress(EngineDeadError):
                self.send(command)

    def dead_message(self) -> str:
        return f"the engine stopped ({self.last_error or 'not running'}); reload the page to restart it"

    def _receive(self, process: EngineProcess, generation: int) -> None:
        """Hand on the engine's messages until its pipe closes or it exits; then fail everything still waiting.

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
                if isinstance(message, EngineStats):
                    self.stats = message
                elif isinstance(message, Outputs | RunEnded | LaneOutputs | RaceEnded):
                    self.routes.deliver(message)
        except (EOFError, OSError):
            pass
        self._on_death(generation)

    def _on_death(self, generation: int) -> None:
        process = self.process
        if process is not None:
            process.wait(2)
        with self.send_lock:
            if generation != self._generation or self.stopping.is_set():
                return
            self._alive = False
            self.last_error = f"the engine process stopped: {process.describe_exit()}" if process else "no engine"
            logger.error("%s", self.last_error)
            self.routes.engine_died(self.dead_message())
            self.stats = EngineStats()


def _shut_down(process: EngineProcess, stopping: threading.Event) -> None:
    """Ask the engine process to stop, then make sure it has."""
    stopping.set()
    with contextlib.suppress(OSError):
        process.commands.send(Shutdown())
    process.wait(3)
    if process.exit_code() is None:
        process.kill()
