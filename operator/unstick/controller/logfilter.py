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

import logging

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
