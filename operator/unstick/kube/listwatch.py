"""The list+watch loop both long-running parts use (the controller's pod watcher and the
agent's Remediation watch): relist on 410 Gone, reconnect with backoff on other errors,
and the line splitting of a raw watch response."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException


def list_watch(
    stop: threading.Event,
    relist: Callable[[], str],
    watch: Callable[[str], str],
    *,
    log: logging.Logger,
    what: str,
    backoff_s: float = 0.5,
    backoff_max_s: float = 30.0,
) -> None:
    """Until `stop` is set: `relist()` → a resourceVersion, then `watch(version)` → the last
    version seen, again and again. 410 Gone (the version expired) → relist; any other
    error → reconnect from the last version after a doubling backoff."""
    version: str | None = None
    backoff = backoff_s
    while not stop.is_set():
        try:
            if version is None:
                version = relist()
            version = watch(version)
            backoff = backoff_s
            continue
        except ApiException as exc:
            if exc.status == 410:
                log.info("%s: resourceVersion expired (410 Gone), relisting", what)
                version = None
                continue
            log.warning("%s: API error %s, reconnecting in %.1fs", what, exc.status, backoff)
        except Exception as exc:  # connection refused/reset, timeouts, bad JSON ...
            if stop.is_set():
                return
            log.warning("%s: %s: %s, reconnecting in %.1fs", what, type(exc).__name__, exc, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, backoff_max_s)


def watch_lines(response: Any) -> Iterator[bytes]:
    """The non-empty lines (one JSON watch event each) of a raw streaming response."""
    buffer = bytearray()
    for chunk in response.stream(amt=None, decode_content=False):
        buffer.extend(chunk)
        while (cut := buffer.find(b"\n")) != -1:
            line = bytes(buffer[:cut])
            del buffer[: cut + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)


class WatchStream:
    """One watch connection at a time: follows it event by event, and can be shut from
    another thread (which ends a read waiting for the next event)."""

    def __init__(self) -> None:
        self._response: Any = None

    def follow(
        self,
        kube: Any,
        path: str,
        query: dict[str, str],
        *,
        timeout_s: float,
        stop: threading.Event,
        apply: Callable[[dict[str, Any]], str | None],
    ) -> str:
        """Watch `path` from `query["resourceVersion"]`; `apply(event)` returns the event's
        resourceVersion (or None). Returns the last version seen."""
        version = query["resourceVersion"]
        response = kube.watch_stream(path, query, timeout_s)
        self._response = response
        try:
            for line in watch_lines(response):
                if stop.is_set():
                    break
                version = apply(json.loads(line)) or version
        finally:
            self._response = None
            response.release_conn()
        return version

    def shutdown(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks a read in progress (urllib3 >= 2.3)
            except Exception:  # already closed, or an older urllib3
                pass
