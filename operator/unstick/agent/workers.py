"""The agent's handler threads: one Remediation's events in order, others meanwhile."""

from __future__ import annotations

import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable

log = logging.getLogger(__name__)


class KeyedWorkers:
    """Runs jobs on `count` threads: all jobs of one key on the same thread, in the order
    they were submitted; jobs of other keys meanwhile on the others. A job that raises is
    logged and the thread goes on."""

    def __init__(self, count: int, name: str = "worker") -> None:
        self._stopping = threading.Event()
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(max(1, count))
        ]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def shard(self, key: str) -> int:
        """The thread a key's jobs run on (stable for the process's life)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(self._queues)

    def submit(self, key: str, job: Callable[[], None]) -> None:
        self._queues[self.shard(key)].put(job)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Let the jobs that run finish (at most `timeout_s` in all); those not started
        are dropped (after a restart the relist hands every Remediation over again)."""
        self._stopping.set()
        for q in self._queues:
            q.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := jobs.get()) is not None:
            if self._stopping.is_set():
                continue
            try:
                job()
            except Exception:
                log.exception("worker job failed")
