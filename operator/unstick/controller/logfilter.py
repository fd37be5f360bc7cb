"""Log levels that mean something: a retryable answer is a warning, not an error.

Right after `helm install` the API server answers requests for the new CRDs with
`429 storage is (re)initializing` for a few seconds. Kopf logs each retried attempt as
ERROR ("Request attempt #1/6 failed; will retry: ... APITooManyRequestsError(429 ...)"),
and a reconcile pass whose request still failed after the client's retries was logged
with a traceback — although both are retried and nothing is wrong. ERROR is kept for
what needs a person: the attempt Kopf gives up on ("escalating"), 403 Forbidden (RBAC),
and every other failure.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue

from unstick.kube.client import is_transient

_RETRIED = "failed; will retry:"
_NOT_TRANSIENT = ("APIForbiddenError", "APIUnauthorizedError")


def is_retried_attempt(record: logging.LogRecord) -> bool:
    """Kopf's record of an API request attempt it retries after a transient answer."""
    if not record.name.startswith("kopf") or record.levelno != logging.ERROR:
        return False
    message = record.getMessage()
    return (
        message.startswith("Request attempt")
        and _RETRIED in message
        and not any(name in message for name in _NOT_TRANSIENT)
    )


class RetryableAsWarning(logging.Filter):
    """A handler filter: Kopf's retried request attempts become WARNING records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if is_retried_attempt(record):
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        return True


def install(root: logging.Logger | None = None) -> None:
    """Put the filter on every handler of the root logger (after `basicConfig`)."""
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, RetryableAsWarning) for f in handler.filters):
            handler.addFilter(RetryableAsWarning())


def failure_level(exc: BaseException) -> int:
    """WARNING for a transient API answer (429, 5xx, connection) the caller retries,
    else ERROR."""
    return logging.WARNING if is_transient(exc) else logging.ERROR


def log_retried_failure(log: logging.Logger, exc: BaseException, msg: str, *args: object) -> None:
    """Log a failure that will be retried: a transient one as a one-line WARNING, any
    other as ERROR with its traceback."""
    if is_transient(exc):
        log.warning(msg + ": %s", *args, exc)
    else:
        log.error(msg, *args, exc_info=exc)


def write_off_thread(root: logging.Logger | None = None) -> logging.handlers.QueueListener:
    """Worker threads hand their records to a queue; one thread writes them with the
    root logger's handlers (and their filters). Found by profiling the 2,000-pod burst:
    with 32 workers logging three lines per pod, 44 % of the busy samples waited for the
    stream handler's lock (a convoy behind the GIL). Stopped (and flushed) at exit."""
    root = root or logging.getLogger()
    handlers = list(root.handlers)
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, *handlers, respect_handler_level=True)
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(records))
    listener.start()

    def flush() -> None:
        if listener._thread is not None:  # not stopped by its owner already
            listener.stop()

    atexit.register(flush)
    return listener
