"""Starting the engine process, and the handle the client keeps on it.

Forked when the client's process has not initialised CUDA (vLLM's default rule too): the child starts with torch and
transformers already imported, so a cold start pays for loading the model only, not for importing the stack again
(measured here: 0.5 s against 5-14 s for a fresh interpreter). A client that has initialised CUDA, which a forked
child could not use, starts a fresh interpreter instead (`python -m batching.service`). Not multiprocessing's spawn:
spawn re-runs the parent's `__main__`, which under Streamlit is the page script itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from batching.service.messages import EngineConfig
from batching.service.process import engine_main


class EngineProcess:
    """The running engine process, and the two pipes to it (commands in, outputs out)."""

    def __init__(self, config: EngineConfig, fresh: bool | None = None) -> None:
        """`fresh`: start a fresh interpreter rather than fork (None: only if this process initialised CUDA)."""
        commands_out, commands_in = os.pipe()
        outputs_out, outputs_in = os.pipe()
        self._process: BaseProcess | subprocess.Popen
        if torch.cuda.is_initialized() if fresh is None else fresh:
            self._process = _fresh_interpreter(commands_out, outputs_in)
        else:
            self._process = _forked(config, commands_out, outputs_in, parent_ends=(commands_in, outputs_out))
        os.close(commands_out)  # the child holds its own copies: EOF on `outputs` means the child is gone
        os.close(outputs_in)
        self.commands = Connection(commands_in, readable=False)
        self.outputs = Connection(outputs_out, writable=False)
        if isinstance(self._process, subprocess.Popen):
            self.commands.send(config)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def exit_code(self) -> int | None:
        """None while it runs; negative: killed by that signal."""
        if isinstance(self._process, subprocess.Popen):
            return self._process.poll()
        return self._process.exitcode

    def describe_exit(self) -> str:
        code = self.exit_code()
        if code is None:
            return "still running but not answering"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def wait(self, seconds: float) -> None:
        if isinstance(self._process, subprocess.Popen):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(seconds)
        else:
            self._process.join(seconds)

    def kill(self) -> None:
        self._process.kill()
        self.wait(3)


def _forked(config: EngineConfig, commands_fd: int, outputs_fd: int, parent_ends: tuple[int, int]) -> BaseProcess:
    process = multiprocessing.get_context("fork").Process(
        target=_forked_main, args=(config, commands_fd, outputs_fd, parent_ends), name="batchscope-engine", daemon=True
    )
    process.start()
    return process


def _forked_main(config: EngineConfig, commands_fd: int, outputs_fd: int, parent_ends: tuple[int, int]) -> None:
    for fd in parent_ends:  # else the child keeps its own command pipe open and never sees the client go away
        os.close(fd)
    # The parent's handlers (Streamlit's) came along: Ctrl+C is the client's to handle (the engine stops when told
    # or when the client is gone); SIGTERM ends the engine.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    engine_main(config, Connection(commands_fd, writable=False), Connection(outputs_fd, readable=False))


def _fresh_interpreter(commands_fd: int, outputs_fd: int) -> subprocess.Popen:
    # The engine imports this project as the client does, from the same folders.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path or os.getcwd() for path in sys.path)}
    return subprocess.Popen(
        [sys.executable, "-m", "batching.service", str(commands_fd), str(outputs_fd)],
        pass_fds=(commands_fd, outputs_fd),
        env=env,
    )
