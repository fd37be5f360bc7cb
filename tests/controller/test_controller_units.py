"""Pure parts of the controller: scheduler, token buckets, pod records, opt-in."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from unstick.controller.deciding.policies import PolicyBook, opt_in
from unstick.controller.scheduler import Scheduler
from unstick.core.remediation import remediation_name
from unstick.kube.podwatch import terminating_record


def test_scheduler_wakes_in_due_order_and_reschedule_replaces() -> None:
    s = Scheduler()
    s.schedule("a", 30.0)
    s.schedule("b", 10.0)
    s.schedule("c", 20.0)
    s.schedule("a", 5.0)  # replaces 30
    assert s.next_due() == 5.0
    assert s.pop_due(15.0) == ["a", "b"]
    assert s.pop_due(15.0) == []
    assert s.next_due() == 20.0
    s.cancel("c")
    assert s.next_due() is None
    assert len(s) == 0


def test_schedule_earliest_keeps_the_sooner_time() -> None:
    s = Scheduler()
    s.schedule("a", 10.0)
    s.schedule_earliest("a", 50.0)
    assert s.due_at("a") == 10.0
    s.schedule_earliest("a", 1.0)
    assert s.due_at("a") == 1.0


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 1000)), max_size=200))
def test_scheduler_matches_last_wish_per_key(wishes: list[tuple[str, float]]) -> None:
    s = Scheduler()
    last: dict[str, float] = {}
    for key, due in wishes:
        s.schedule(key, due)
        last[key] = due
    popped = s.pop_due(2000.0)
    assert sorted(popped) == sorted(last)
    assert [last[k] for k in popped] == sorted(last[k] for k in popped)


def _pod(**meta: object) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1", **meta},
        "spec": {"nodeName": "n1"},
        "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]},
    }


def test_only_terminating_pods_become_records() -> None:
    assert terminating_record(_pod()) is None
    rec = terminating_record(
        _pod(
            deletionTimestamp="2026-11-20T10:00:00Z",
            deletionGracePeriodSeconds=30,
            finalizers=["a/b"],
            annotations={"unstick.dev/remediate": "true", "other": "x"},
        )
    )
    assert rec is not None
    assert (rec.node, rec.finalizers, rec.remediate, rec.containers_running) == (
        "n1",
        ("a/b",),
        "true",
        True,
    )
    assert rec.deletion_timestamp == 1795168800.0
    assert terminating_record(_pod(deletionTimestamp="not a time")) is None


def test_opt_in_rules() -> None:
    assert opt_in("true", {}).opted_in
    assert opt_in(None, {"unstick.dev/remediate": "true"}).policy_name == "default"
    assert opt_in("strict", {}).policy_name == "strict"
    assert not opt_in("false", {"unstick.dev/remediate": "true"}).opted_in
    assert not opt_in(None, {}).opted_in
    # Exact values only, as `unstick diagnose` reads them: "TRUE" names a (missing) policy.
    assert opt_in("TRUE", {}).policy_name == "TRUE"
    assert not opt_in(None, {"unstick.dev/remediate": "True"}).opted_in


def test_remediation_names_are_valid_object_names() -> None:
    name = remediation_name("a" * 52 + ".b" + "c" * 10, "0123456789abcdef")
    assert name == "a" * 52 + "-01234567"
    assert remediation_name("web-0", "0123456789") == "web-0-01234567"


def test_invalid_policy_is_kept_as_error_naming_the_field() -> None:
    book = PolicyBook()
    error = book.update("bad", {"spec": {"actions": ["explode"]}})
    assert error is not None and "spec.actions" in error
    policy, why = book.lookup("bad")
    assert policy is None and why is not None and "invalid" in why
    assert book.update("good", {"spec": {"slackSeconds": 5, "dryRun": False}}) is None
    good, _ = book.lookup("good")
    assert good is not None and good.slack_s == 5 and not good.dry_run
    assert book.lookup("missing")[1] == "RemediationPolicy 'missing' does not exist"


# -- log levels: a retried 429/5xx answer is a WARNING ----------------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers GETs in turn from the server's `answers` list (status codes)."""

    def do_GET(self) -> None:
        code = self.server.answers.pop(0)  # type: ignore[attr-defined]
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure" if code >= 400 else "Success",
            "message": "storage is (re)initializing" if code == 429 else "",
            "code": code,
        }
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _kopf_request_levels(answers: list[int], backoffs: list[float]) -> list[tuple[int, str]]:
    """Run Kopf's own API request against a local server that gives `answers`; the
    (level, message) of every record Kopf logs, as the controller's handler emits them."""
    import kopf
    from kopf._cogs.clients import api, auth

    from unstick.controller import logfilter

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.answers = list(answers)  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen: list[tuple[int, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.levelno, record.getMessage()))

    root = logging.Logger("root-under-test")
    handler = Keep()
    root.addHandler(handler)
    logfilter.install(root)
    logger = logging.getLogger("kopf._cogs.clients.api.test")
    logger.addHandler(handler)
    logger.propagate = False
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = backoffs

    async def go() -> None:
        info = kopf.ConnectionInfo(server=f"http://127.0.0.1:{server.server_port}")
        context = auth.APIContext(info)
        try:
            await api.request("GET", "/api", settings=settings, logger=logger, context=context)
        except Exception:
            pass
        finally:
            await context.session.close()

    try:
        asyncio.run(go())
    finally:
        logger.removeHandler(handler)
        server.shutdown()
        server.server_close()
        thread.join()
    return seen


def test_kopf_retried_429_is_a_warning_and_giving_up_is_an_error() -> None:
    seen = _kopf_request_levels([429, 200], [0.01])
    assert len(seen) == 1 and "storage is (re)initializing" in seen[0][1]
    assert seen[0][0] == logging.WARNING
    seen = _kopf_request_levels([503, 429], [0.01])  # the last attempt: Kopf gives up
    assert [level for level, _ in seen] == [logging.WARNING, logging.ERROR]
    assert "escalating" in seen[1][1]
    seen = _kopf_request_levels([403, 200], [0.01])  # RBAC: says something is wrong
    assert [level for level, _ in seen] == [logging.ERROR]


def test_a_failed_pass_on_a_transient_answer_is_a_warning() -> None:
    from kubernetes.client.exceptions import ApiException

    from unstick.controller.logfilter import log_retried_failure

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    log = logging.Logger("unstick.test")
    log.addHandler(Keep())
    busy = ApiException(status=429, reason="Too Many Requests")
    log_retried_failure(log, busy, "pod=%s reconcile failed; retrying in 10s", "ns/p")
    log_retried_failure(log, ApiException(status=500), "pod=%s failed", "ns/p")
    log_retried_failure(log, ApiException(status=422), "pod=%s failed", "ns/p")
    assert [r.levelno for r in seen] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert seen[0].getMessage().startswith("pod=ns/p reconcile failed; retrying in 10s: (429)")
    assert seen[0].exc_info is None and seen[2].exc_info is not None


# -- the budget rebuilt from Remediations -----------------------------------------------


def test_recent_grants_are_the_actions_of_the_last_minute_that_changed_something() -> None:
    from unstick.controller.acting.budget_rebuild import recent_grants

    now = 1795168800.0  # 2026-11-20T10:00:00Z

    def rem(node: str, actions: list[dict[str, str]], steps_at: str | None = None) -> Any:
        spec = {"podName": "p", "podUID": "u", "nodeName": node}
        if steps_at:
            spec["nodeStepsRequestedAt"] = steps_at
        return {"spec": spec, "status": {"policy": "fast", "actions": actions}}

    def act(action: str, result: str, time: str, by: str = "controller") -> dict[str, str]:
        return {"action": action, "target": "", "result": result, "time": time, "by": by}

    items = [
        rem(
            "n1",
            [
                act("force-delete", "succeeded", "2026-11-20T09:59:30.000000Z"),
                act("remove-finalizer", "failed", "2026-11-20T09:59:50Z"),
                act("force-delete", "refused", "2026-11-20T09:59:50Z"),  # changed nothing
                act("observe", "succeeded", "2026-11-20T09:59:50Z"),
                act("force-delete", "succeeded", "2026-11-20T09:58:54Z"),  # > 65 s ago
                act("force-delete", "succeeded", "2026-11-20T09:58:57Z"),  # < 60 s + 5 s
                act("unmount", "succeeded", "2026-11-20T09:59:55Z", by="agent"),  # in batch
                act("force-delete", "succeeded", "not a time"),
            ],
            steps_at="2026-11-20T09:59:40Z",
        ),
        rem("n2", [], steps_at="2026-11-20T09:58:00Z"),  # handed over too long ago
        {"spec": None, "status": {"actions": "garbage"}},
    ]
    got = sorted((g.node, now - g.at, g.policy) for g in recent_grants(items, now))
    # each counted as made ACT_WITHIN_S (5 s) after its recorded time: the act follows
    # its grant within that long (a DELETE whose intent took longer is not sent)
    assert got == [
        ("n1", 5.0, "fast"),
        ("n1", 15.0, "fast"),
        ("n1", 25.0, "fast"),
        ("n1", 58.0, "fast"),
    ]


def test_recent_grants_count_incident_intents_and_their_settled_results() -> None:
    from unstick.controller.acting.budget_rebuild import recent_grants

    now = 1795168800.0  # 2026-11-20T10:00:00Z

    def pod(result: str) -> dict[str, str]:
        return {
            "name": "p",
            "uid": "u",
            "action": "force-delete",
            "result": result,
            "time": "2026-11-20T09:59:50Z",
        }

    incident = {
        "spec": {"nodeName": "n1", "incident": "NodeGone"},
        "status": {
            "policy": "default",
            "pods": [
                pod("deleting"),
                pod("gone"),
                pod("succeeded"),
                pod("failed"),
                pod("refused"),
                {"name": "q", "uid": "v"},  # joined, nothing decided yet
            ],
        },
    }
    got = [(g.node, now - g.at) for g in recent_grants([incident], now)]
    assert got == [("n1", 5.0)] * 4
