"""A thin adapter over the `kubernetes` package: auth, User-Agent, retries, raw JSON.

Every call returns plain dicts parsed from the API server's JSON (`_preload_content=False`):
the client's model objects are never built, which keeps memory and CPU low and gives the
diagnosis core the objects exactly as the API returns them (the snapshot bundle format).

Transient errors (429 honouring Retry-After, 5xx, connection resets/timeouts) are retried
with tenacity. A 409 Conflict is NOT retried here: the caller re-reads and re-decides.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import kubernetes.client
import kubernetes.config
import tenacity
import urllib3
from kubernetes.client.exceptions import ApiException

from unstick import __version__
from unstick.core import remediation

log = logging.getLogger(__name__)

USER_AGENT = f"unstick-controller/{__version__}"
# HTTP connections kept open to the API server. The kubernetes client's default is
# 5 x CPUs (10 on 2 cores): fewer than the threads using it (workers, detection, Events,
# pod watchers), so urllib3 would discard connections ("Connection pool is full") and
# open a new TLS connection for each request.
POOL_SIZE = 64
POOL_EXTRA = 16  # threads besides the workers that may hold a connection
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    kubeconfig: str | None = None  # None: in-cluster config, else $KUBECONFIG / ~/.kube/config
    user_agent: str = USER_AGENT
    timeout_s: float = 30.0
    retry_attempts: int = 6
    retry_max_wait_s: float = 30.0
    pool_size: int = POOL_SIZE


def load_configuration(kubeconfig: str | None) -> kubernetes.client.Configuration:
    """Configuration from a kubeconfig file, or in-cluster (service account) when None."""
    config = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)  # type: ignore[no-untyped-call]
        return config
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
    return config


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: throttling, server errors, broken connections."""
    if isinstance(exc, ApiException):
        return exc.status == 429 or (exc.status is not None and exc.status >= 500)
    return isinstance(
        exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError
    )  # ProtocolError, MaxRetryError, ReadTimeoutError, ConnectionResetError ...


def _retry_after(exc: BaseException | None) -> float | None:
    if isinstance(exc, ApiException) and exc.status == 429 and exc.headers:
        value = exc.headers.get("Retry-After")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None
    return None


class _WaitRetryAfter(tenacity.wait.wait_base):
    """Exponential backoff, but exactly Retry-After when the server names it."""

    def __init__(self, max_wait: float) -> None:
        self._backoff = tenacity.wait_exponential(multiplier=0.2, max=max_wait)
        self._max = max_wait

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        after = _retry_after(exc)
        if after is not None:
            return min(after, self._max)
        return float(self._backoff(retry_state))


def status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


class Kube:
    """Raw-JSON access to the API server with retries. Blocking: call from a thread."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.configuration = load_configuration(settings.kubeconfig)
        self.configuration.connection_pool_maxsize = settings.pool_size
        self.api = kubernetes.client.ApiClient(self.configuration)
        self.api.user_agent = settings.user_agent
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            wait=_WaitRetryAfter(settings.retry_max_wait_s),
            stop=tenacity.stop_after_attempt(settings.retry_attempts),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "transient API error, retrying: %s", rs.outcome.exception() if rs.outcome else ""
            ),
        )

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # -- raw calls ---------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> urllib3.HTTPResponse:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        serialized = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            *serialized, _request_timeout=timeout or self.settings.timeout_s
        )
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response  # type: ignore[no-any-return]

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One call with retries on transient errors; the parsed JSON answer."""

        def once() -> JSON:
            resp = self._call(method, path, query=query, body=body, content_type=content_type)
            data = resp.data
            return json.loads(data) if data else {}

        return self._retrying(once)

    def get(self, path: str, query: dict[str, Any] | None = None) -> JSON | None:
        """GET an object; None when it does not exist (404)."""
        try:
            return self.request("GET", path, query=query)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_all(self, path: str, query: dict[str, Any] | None = None) -> list[JSON]:
        """A paginated LIST, all pages; for small collections only."""
        items: list[JSON] = []
        for page in self.list_pages(path, query):
            items.extend(page.get("items") or [])
        return items

    def list_pages(
        self, path: str, query: dict[str, Any] | None = None, limit: int = 500
    ) -> Iterator[JSON]:
        """LIST in pages of `limit` (limit + continue); each page parsed and then dropped."""
        cont: str | None = None
        while True:
            page = self.request(
                "GET", path, query={**(query or {}), "limit": limit, "continue": cont}
            )
            yield page
            cont = (page.get("metadata") or {}).get("continue") or None
            if not cont:
                return

    def watch_stream(
        self, path: str, query: dict[str, Any], timeout_s: int
    ) -> urllib3.HTTPResponse:
        """Open a WATCH; the response streams one JSON event per line. No retries here."""
        return self._call(
            "GET",
            path,
            query={**query, "watch": "true", "timeoutSeconds": timeout_s},
            timeout=(10.0, timeout_s + 30.0),
        )


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    return f"{base}/{quote(name, safe='')}" if name else base


def remediation_path(namespace: str, name: str = "") -> str:
    """A namespace's Remediations, or one of them."""
    base = f"{remediation.API_ROOT}/namespaces/{quote(namespace, safe='')}/{remediation.PLURAL}"
    return f"{base}/{quote(name, safe='')}" if name else base


def policy_path(name: str) -> str:
    """One RemediationPolicy."""
    return f"{remediation.POLICIES}/{quote(name, safe='')}"
