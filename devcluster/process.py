"""Child processes of the local control plane: started with their output in a log file,
killed with their parent (PR_SET_PDEATHSIG), and stopped by PID — TERM, then KILL."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_running: dict[int, subprocess.Popen[bytes]] = {}


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """One long-running child, its log in `log_path`."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        log = self.log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (only prctl, async-signal-safe)
            )
        finally:
            log.close()
        _running[self.popen.pid] = self.popen
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        popen, self.popen = self.popen, None
        if popen is None:
            return
        _running.pop(popen.pid, None)
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()


@atexit.register
def _stop_all() -> None:
    for popen in list(_running.values()):
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        popen.wait()
    _running.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(
    ready: Callable[[], T], *, timeout: float, what: str, process: Process | None = None
) -> T:
    """Poll `ready` until it returns something true, and return that; fail early, with the
    log, if `process` died."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and not process.alive():
            raise RuntimeError(
                f"{process.name} exited while waiting for {what}:\n{process.log_tail()}"
            )
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = process.log_tail() if process else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{tail}")
        time.sleep(0.1)


def env_with_path(bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env
