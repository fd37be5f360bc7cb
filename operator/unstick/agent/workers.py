"""The agent's handler threads: one Remediation's events in order, others meanwhile.

Urgent jobs first (docs/agent.md, "The agent's queue"): a Remediation whose node steps are
due finishes its pod, a probe only starts one, so in a burst the steps must not wait behind
every probe queued before them. Within one thread's queue the next job is the first job of
the key with the oldest urgent job waiting (that key's first job: its earlier jobs still
run before its urgent one), else the oldest job. One key's jobs always run on one thread,
one at a time, in the order they were submitted.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Job = Callable[[], None]


@dataclass(frozen=True, slots=True)
class _Queued:
    key: str
    urgent: bool
    job: Job


class _Queue:
    """One thread's jobs: FIFO, except that a key with an urgent job goes first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[_Queued] = deque()
        self._closed = False

    def put(self, item: _Queued) -> None:
        with self._cond:
            self._jobs.append(item)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def get(self) -> Job | None:
        """The next job (waits for one); None once closed (the jobs left are dropped)."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            return self._take().job

    def _take(self) -> _Queued:
        urgent = next((q.key for q in self._jobs if q.urgent), None)
        if urgent is None:
            return self._jobs.popleft()
        # the key's first job: its earlier jobs before its urgent one (per-key order)
        first = next(q for q in self._jobs if q.key == urgent)
        self._jobs.remove(first)
        return first


class KeyedWorkers:
    """Runs jobs on `count` threads: all jobs of one key on the same thread, in the order
    they were submitted; jobs of other keys meanwhile on the others; on one thread, the
    keys with an urgent job before the others (module docstring). A job that raises is
    logged and the thread goes on."""

    def __init__(self, count: int, name: str = "worker") -> None:
        self._stopping = threading.Event()
        self._queues = [_Queue() for _ in range(max(1, count))]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def shard(self, key: str) -> int:
        """The thread a key's jobs run on (stable for the process's life)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(self._queues)

    def submit(self, key: str, job: Job, *, urgent: bool = False) -> None:
        """Queue `job` after the key's earlier jobs; `urgent`: its key goes before the keys
        without an urgent job on its thread."""
        self._queues[self.shard(key)].put(_Queued(key, urgent, job))

    def stop(self, timeout_s: float = 20.0) -> None:
        """Let the jobs that run finish (at most `timeout_s` in all); those not started
        are dropped (after a restart the relist hands every Remediation over again)."""
        self._stopping.set()
        for q in self._queues:
            q.close()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, jobs: _Queue) -> None:
        while (job := jobs.get()) is not None:
            if self._stopping.is_set():
                continue
            try:
                job()
            except Exception:
                log.exception("worker job failed")
