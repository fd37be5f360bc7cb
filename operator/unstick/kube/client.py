"""A thin adapter over the `kubernetes` package: auth, User-Agent, retries, raw JSON.

Every call returns plain dicts parsed from the API server's JSON (`_preload_content=False`):
the client's model objects are never built, which keeps memory and CPU low and gives the
diagnosis core the objects exactly as the API returns them (the snapshot bundle format).

Transient errors (429 honouring Retry-After, 5xx, connection resets/timeouts) are retried
with tenacity. A 409 Conflict is NOT retried here: the caller re-reads and re-decides.
A write that must not be repeated (an act: the pod DELETE, the finalizer patch) is sent
once (`request(..., retry=False)`): when its answer is lost the API server may have carried
it out, and a retry would be answered 404/409/422 as if nothing had been done
(kube/actions.py settles such an act by looking).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import kubernetes.client
import kubernetes.config
import tenacity
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from unstick import __version__
from unstick.core import remediation
from unstick.kube.server_clock import ServerClock

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
    context: str | None = None  # None: the kubeconfig's current-context
    user_agent: str = USER_AGENT
    timeout_s: float = 30.0
    retry_attempts: int = 6
    retry_max_wait_s: float = 30.0
    pool_size: int = POOL_SIZE


class KubeconfigError(kubernetes.config.ConfigException):
    """A kubeconfig that cannot be used. Its text is one line: the file, what is wrong with
    it and what to do (for a person at a terminal; never a traceback)."""


@dataclass(frozen=True, slots=True)
class KubeconfigView:
    """What a kubeconfig selects, read before the client loads it."""

    files: tuple[str, ...]  # the files read, in order (several with $KUBECONFIG=a:b)
    context: str
    namespace: str  # the context's namespace, "default" when it names none


def kubeconfig_files(explicit: str | None) -> tuple[tuple[str, ...], str]:
    """The files kubectl would read and what chose them: --kubeconfig, $KUBECONFIG (a list),
    or ~/.kube/config."""
    if explicit:
        return (explicit,), "--kubeconfig"
    listed = tuple(p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p)
    if listed:
        return listed, "$KUBECONFIG"
    return (str(Path("~/.kube/config").expanduser()),), "the default kubeconfig"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


_WHAT_TO_DO = "pass --kubeconfig PATH or set KUBECONFIG"


def _read_kubeconfig(path: str) -> dict[str, Any] | None:
    """One file parsed; None when it does not exist; KubeconfigError when unusable."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise KubeconfigError(f"kubeconfig {path}: not UTF-8 text; {_WHAT_TO_DO}") from None
    except OSError as err:
        why = err.strerror or str(err)
        raise KubeconfigError(f"kubeconfig {path}: cannot read it ({why}); {_WHAT_TO_DO}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "cannot parse"
        raise KubeconfigError(
            f"kubeconfig {path}: not valid YAML{where} ({_one_line(problem)}); fix the file or "
            f"{_WHAT_TO_DO}"
        ) from None
    if doc is None:
        raise KubeconfigError(f"kubeconfig {path}: the file is empty; {_WHAT_TO_DO}")
    if not isinstance(doc, dict):
        raise KubeconfigError(
            f"kubeconfig {path}: not a kubeconfig (a YAML mapping with clusters, users and "
            f"contexts); {_WHAT_TO_DO}"
        )
    return doc


def _named(doc: dict[str, Any], key: str, path: str) -> dict[str, tuple[dict[str, Any], str]]:
    """The `key` list (clusters, users, contexts) of one file by name: (entry, file)."""
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise KubeconfigError(f"kubeconfig {path}: {key} is not a list; fix the file")
    out = {}
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            out[item["name"]] = (item, path)
    return out


def check_kubeconfig(files: tuple[str, ...], chosen_by: str, context: str | None) -> KubeconfigView:
    """Read the kubeconfig the way kubectl merges it (the first file naming a context, user or
    cluster wins; files of a $KUBECONFIG list that do not exist are skipped) and check what
    the client would trip over: the file, its YAML, the context, its cluster and user, and
    that a user's exec plugin is installed. KubeconfigError: one line naming the file."""
    contexts: dict[str, tuple[dict[str, Any], str]] = {}
    users: dict[str, tuple[dict[str, Any], str]] = {}
    clusters: dict[str, tuple[dict[str, Any], str]] = {}
    current, found = "", []
    for path in files:
        doc = _read_kubeconfig(path)
        if doc is None:
            continue
        found.append(path)
        for key, into in (("contexts", contexts), ("users", users), ("clusters", clusters)):
            for named, found_in in _named(doc, key, path).items():
                into.setdefault(named, found_in)
        current = current or str(doc.get("current-context") or "")
    where = " / ".join(files)
    if not found:
        if chosen_by == "the default kubeconfig":
            raise KubeconfigError(
                f"kubeconfig {where}: no such file, and not running in a pod; {_WHAT_TO_DO}"
            )
        if chosen_by == "--kubeconfig":
            todo = "check the path, or leave --kubeconfig out to use $KUBECONFIG or ~/.kube/config"
        else:
            todo = "fix KUBECONFIG or pass --kubeconfig PATH"
        raise KubeconfigError(f"kubeconfig {where} ({chosen_by}): no such file; {todo}")
    name = context or current
    if not name:
        raise KubeconfigError(
            f"kubeconfig {found[0]}: no current context; pass --context NAME or run "
            "kubectl config use-context NAME"
        )
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        how = "--context" if context else "current-context"
        raise KubeconfigError(
            f"kubeconfig {where}: no context {name!r} ({how}; the file has: {known}); pass "
            "--context with one of them or run kubectl config use-context NAME"
        )
    entry, path = contexts[name]
    spec = entry.get("context")
    if not isinstance(spec, dict):
        raise KubeconfigError(
            f"kubeconfig {path}: context {name!r} has no cluster or user; fix the file"
        )
    cluster = spec.get("cluster")
    if not cluster or cluster not in clusters:
        raise KubeconfigError(
            f"kubeconfig {path}: context {name!r} names cluster {cluster!r}, which the file "
            "does not define; fix the context or pass --context with another one"
        )
    user = spec.get("user")
    if user and user not in users:
        raise KubeconfigError(
            f"kubeconfig {path}: context {name!r} names user {user!r}, which the file does "
            "not define; fix the context or pass --context with another one"
        )
    if user:
        _check_exec(users[user], name)
    namespace = spec.get("namespace")
    return KubeconfigView(
        tuple(found), name, namespace if isinstance(namespace, str) and namespace else "default"
    )


def _check_exec(user: tuple[dict[str, Any], str], context: str) -> None:
    """A user whose credentials come from an exec plugin (aws, gke-gcloud-auth-plugin,
    kubelogin ...): the plugin must be installed, or the client would go on without them."""
    entry, path = user
    exec_ = (entry.get("user") or {}).get("exec") if isinstance(entry.get("user"), dict) else None
    if not isinstance(exec_, dict):
        return
    command = str(exec_.get("command") or "")
    if not command:
        raise KubeconfigError(
            f"kubeconfig {path}: user {entry['name']!r} has an exec section without a command; "
            "fix the file"
        )
    relative = str(Path(path).parent / command)  # client-go: relative to the kubeconfig
    if shutil.which(command) is None and ("/" not in command or shutil.which(relative) is None):
        hint = _one_line(exec_.get("installHint") or "")
        todo = f"install it ({hint})" if hint else "install it or put it on PATH"
        raise KubeconfigError(
            f"kubeconfig {path}: context {context!r} gets its credentials from the exec plugin "
            f"{command!r}, which is not found on PATH; {todo}, or pass --context with another "
            "context"
        )


def _in_cluster(config: kubernetes.client.Configuration) -> bool:
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        return False
    return True


def load_configuration(
    kubeconfig: str | None, context: str | None = None
) -> kubernetes.client.Configuration:
    """Configuration as kubectl finds it: `kubeconfig` (or $KUBECONFIG) when given, else the
    in-cluster service account in a pod, else ~/.kube/config; `context` overrides the
    current one. KubeconfigError (one line, naming the file) when it cannot be used.

    urllib3 makes no retries of its own: the caller's retries (tenacity, `Kube`) are the
    only ones, so a failing request is tried as often as they say and not 4 times that."""
    config = kubernetes.client.Configuration()
    files, chosen_by = kubeconfig_files(kubeconfig)
    if not (context or kubeconfig or chosen_by == "$KUBECONFIG") and _in_cluster(config):
        _no_urllib3_retries(config)
        return config
    check_kubeconfig(files, chosen_by, context)
    try:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(files), context=context, client_configuration=config
        )
    except (kubernetes.config.ConfigException, yaml.YAMLError, OSError, LookupError,
            TypeError, ValueError, AttributeError) as err:  # fmt: skip
        raise KubeconfigError(
            f"kubeconfig {' / '.join(files)}: {_one_line(err)}; fix the file or pass "
            "--kubeconfig PATH / --context NAME"
        ) from None
    _no_urllib3_retries(config)
    return config


def _no_urllib3_retries(config: kubernetes.client.Configuration) -> None:
    config.retries = False  # urllib3: no retry, the error itself (not MaxRetryError)
    config.client_go_retries = False  # nor the client's own Retry-After loop for GETs


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace a bare POD name means, as for kubectl: the context's namespace, in a pod
    its own namespace, else "default". KubeconfigError when the kubeconfig is unusable."""
    files, chosen_by = kubeconfig_files(kubeconfig)
    if not (context or kubeconfig or chosen_by == "$KUBECONFIG"):
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as fh:
                return fh.read().strip() or "default"
        except OSError:
            pass
    return check_kubeconfig(files, chosen_by, context).namespace


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


def _guard_connections(pools: urllib3.PoolManager, guard: Callable[[], Any]) -> None:
    """Call `guard()`'s check once more inside the connection, right before a request that
    is not a GET is written to it: in `endheaders`, the call that puts the request line and
    headers on the socket — after the pool handed the connection out, after its TCP connect
    and TLS handshake, after urllib3 framed the request — the slowest steps between
    `Kube._call`'s check and the send. A process stopped there (SIGSTOP) and resumed after
    it lost the lease would otherwise send a write it checked before the stop."""

    def checked(base: type[urllib3.connection.HTTPConnection]) -> type[Any]:
        class Guarded(base):  # type: ignore[valid-type,misc]
            _sending: tuple[str, str] = ("GET", "")

            def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:
                self._sending = (method, url)
                super().request(method, url, *args, **kwargs)

            def endheaders(self, *args: Any, **kwargs: Any) -> None:
                method, url = self._sending
                check = guard()
                if method != "GET" and check is not None:
                    check(method, url)
                super().endheaders(*args, **kwargs)

        return Guarded

    class HTTPPool(urllib3.HTTPConnectionPool):
        ConnectionCls = checked(urllib3.connection.HTTPConnection)

    class HTTPSPool(urllib3.HTTPSConnectionPool):
        ConnectionCls = checked(urllib3.connection.HTTPSConnection)

    pools.pool_classes_by_scheme = {"http": HTTPPool, "https": HTTPSPool}


def status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


class Kube:
    """Raw-JSON access to the API server with retries. Blocking: call from a thread."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.configuration = load_configuration(settings.kubeconfig, settings.context)
        self.configuration.connection_pool_maxsize = settings.pool_size
        self.api = kubernetes.client.ApiClient(self.configuration)
        self.api.user_agent = settings.user_agent
        # Called right before every request that is not a GET, each attempt (the leader
        # election's "I hold the lease now", controller/leader.py); it raises to refuse.
        self.write_guard: Callable[[str, str], None] | None = None
        # The API server's clock, from the `Date` of every answer (kube/server_clock.py).
        self.server_clock = ServerClock()
        _guard_connections(self.api.rest_client.pool_manager, lambda: self.write_guard)
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
        if method != "GET" and self.write_guard is not None:
            self.write_guard(method, path)
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
        sent = time.time()
        response = self.api.call_api(
            *serialized, _request_timeout=timeout or self.settings.timeout_s
        )
        self.server_clock.answered(sent, time.time(), response.getheader("Date"))  # type: ignore[no-untyped-call]
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
        retry: bool = True,
    ) -> JSON:
        """One call with retries on transient errors (`retry=False`: sent once, the error
        raised as it came); the parsed JSON answer."""

        def once() -> JSON:
            resp = self._call(method, path, query=query, body=body, content_type=content_type)
            data = resp.data
            return json.loads(data) if data else {}

        return self._retrying(once) if retry else once()

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
