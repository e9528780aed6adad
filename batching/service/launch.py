"""Starting the engine process, and the handle the client keeps on it.

Forked when the client's process has not initialised CUDA (vLLM's default rule too): the child starts with torch and
transformers already imported, so a cold start pays for loading the model only, not for importing the stack again
(docs/benchmarks.md has the difference). A client that has initialised CUDA, which a forked child could not use, or
imported gptqmodel when the engine will run a GPTQ model (gptqmodel's log writer's thread is not in a forked child,
and the child's first log line waits on it forever), starts a fresh interpreter instead (`python -m
batching.service`). Not multiprocessing's spawn: spawn re-runs the parent's `__main__`, which under Streamlit is the
page script itself. Not multiprocessing's fork either: the child first lets go of every descriptor it inherited but
its pipes (see `neutralise_inherited_descriptors`), and multiprocessing keeps pipes of its own in the child we could
not tell apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

import torch

from batching.service.messages import EngineConfig
from batching.service.process import engine_main
from model.loader import runs_gptq


class EngineProcess:
    """The running engine process, and the two pipes to it (commands in, outputs out)."""

    def __init__(self, config: EngineConfig, fresh: bool | None = None) -> None:
        """`fresh`: start a fresh interpreter rather than fork (None: only where a forked child could not work)."""
        commands_out, commands_in = os.pipe()
        outputs_out, outputs_in = os.pipe()
        self._process: ForkedChild | subprocess.Popen
        if _fork_would_fail(config) if fresh is None else fresh:
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
        return self._process.poll()

    def describe_exit(self) -> str:
        code = self.exit_code()
        if code is None:
            return "still running but not answering"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def wait(self, seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(seconds)

    def kill(self) -> None:
        self._process.kill()
        self.wait(3)


def _fork_would_fail(config: EngineConfig) -> bool:
    """This process initialised CUDA, or imported the gptqmodel a GPTQ engine will run: a forked child could use
    neither."""
    return torch.cuda.is_initialized() or ("gptqmodel" in sys.modules and runs_gptq(config.model))


def _forked(config: EngineConfig, commands_fd: int, outputs_fd: int, parent_ends: tuple[int, int]) -> ForkedChild:
    pid = os.fork()
    if pid:
        return ForkedChild(pid)
    code = 1
    try:
        for fd in parent_ends:  # else the child keeps its own command pipe open and never sees the client go away
            os.close(fd)
        neutralise_inherited_descriptors(keep={0, 1, 2, commands_fd, outputs_fd})
        # The parent's handlers (Streamlit's) came along: Ctrl+C is the client's to handle (the engine stops when
        # told or when the client is gone); SIGTERM ends the engine.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        engine_main(config, Connection(commands_fd, writable=False), Connection(outputs_fd, readable=False))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        # Never back into the parent's code (Streamlit's threads are gone here; its atexit hooks are not ours).
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def neutralise_inherited_descriptors(keep: set[int]) -> None:
    """Point every inherited descriptor outside `keep` at /dev/null.

    A forked child inherits the parent's sockets: the page server's listening socket and a browser's keep-alive
    connection among them. While the child holds a copy, closing the parent's sends no FIN, and the browser's
    next requests on that connection go unanswered (the page's widget scripts never load). Pointing the numbers
    at /dev/null rather than closing them keeps them taken: a Python object of the parent's that still names one
    and closes it some day closes /dev/null, not a descriptor the engine opened since.
    """
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    inherited = [int(name) for name in os.listdir(folder)]  # includes the listing's own, closed by now
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in inherited:
            if fd in keep or fd == null:
                continue
            with contextlib.suppress(OSError):  # the listing's own descriptor is already closed
                os.fstat(fd)
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


class ForkedChild:
    """A child made by `os.fork`, with `poll`, `wait` and `kill` as `subprocess.Popen` has them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: int | None = None

    def poll(self) -> int | None:
        """None while it runs; its exit code, or minus the signal that killed it."""
        if self.exitcode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.exitcode = os.waitstatus_to_exitcode(status)
        return self.exitcode

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _fresh_interpreter(commands_fd: int, outputs_fd: int) -> subprocess.Popen:
    # The engine imports this project as the client does, from the same folders.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path or os.getcwd() for path in sys.path)}
    return subprocess.Popen(
        [sys.executable, "-m", "batching.service", str(commands_fd), str(outputs_fd)],
        pass_fds=(commands_fd, outputs_fd),
        env=env,
    )
