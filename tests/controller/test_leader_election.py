"""Leader election (controller/leader.py): two real controller processes against one API
server, one Lease. The leader is SIGKILLed, SIGSTOPped past its lease, or cut off the API
server by a TCP proxy the test closes; each time the other replica takes over and
force-deletes a NodeGone pod, the old leader writes nothing after it lost the lease (the
API server's audit log, by each replica's User-Agent), no pod is deleted twice and no
record is left Remediating. Each again with one replica's wall clock 20 s ahead of the
others' or 20 s behind (libfaketime: tests/support/clock_skew.py): the election never
compares one replica's wall clock with another's, so none of it changes; the budget
carries over a takeover from a leader whose clock is ahead or behind; and a controller
whose clock is ahead waits out a pod's slack by the API server's clock. And in-process: a
wall clock 20 s ahead changes nothing.

The times printed (kill -> the standby's first write) are a report, not an assertion."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import WRITES, received_at, requests
from tests.support.clock_skew import clocks_seen_by_child, skewed_clock_env
from tests.support.controller import Controller, Objects, policies_in_place, policy_spec
from tests.support.tcp_proxy import TcpProxy
from unstick import __version__
from unstick.controller.leader import Elector, LeaseSettings, NotLeading
from unstick.kube.client import ClientSettings, Kube

# Each test waits out leases and budget windows (minutes): dealt one by one to make test's
# envtest shares (tests/conftest.py), the module whole would be one share's time on its own.
pytestmark = [pytest.mark.envtest, pytest.mark.shard_by_test]

LEASE_NS = "default"
A, B = "replica-a", "replica-b"
SKEW_S = 20.0
#: A replica's wall clock, seconds off this machine's (libfaketime); absent: not off.
Clocks = dict[str, float]


def user_agent(identity: str) -> str:
    return f"unstick-controller/{__version__} ({identity})"


SLOW = "t-ha-slow"  # 2 actions per node per minute, for namespaces labelled SLOW_LABEL
SLOW_LABEL = {"unstick-test/ha": "slow"}
SLACK = "t-ha-slack"  # SLACK_S of slack, for namespaces labelled SLACK_LABEL
SLACK_LABEL = {"unstick-test/ha": "slack"}
SLACK_S = 30


@pytest.fixture(scope="module")
def objects(control_plane: ControlPlane) -> Iterator[Objects]:
    slow = policy_spec(
        rateLimits={"clusterPerMinute": 1000, "nodePerMinute": 2},
        namespaceSelector={"matchLabels": SLOW_LABEL},
    )
    slack = policy_spec(slackSeconds=SLACK_S, namespaceSelector={"matchLabels": SLACK_LABEL})
    policies = {"default": policy_spec(), SLOW: slow, SLACK: slack}
    with policies_in_place(control_plane, policies) as objs:
        yield objs


def read_lease(objects: Objects, lease: str) -> Any:
    """The Lease (a V1Lease), None when absent."""
    try:
        return client.CoordinationV1Api(objects.api_client).read_namespaced_lease(lease, LEASE_NS)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def holder(objects: Objects, lease: str) -> tuple[str, float] | None:
    """(holderIdentity, acquireTime as epoch seconds) of the Lease, None when absent."""
    obj = read_lease(objects, lease)
    if obj is None:
        return None
    spec = obj.spec
    acquired = spec.acquire_time.timestamp() if spec.acquire_time else 0.0
    return (spec.holder_identity or "", acquired)


def held_by(objects: Objects, lease: str, identity: str) -> float | None:
    found = holder(objects, lease)
    return found[1] if found and found[0] == identity else None


def holder_clock(objects: Objects, lease: str) -> tuple[str, float]:
    """(holder, how far its wall clock is ahead of the API server's): the `renewTime` it
    wrote minus when the API server stored that write (the Lease's managedFields time,
    whole seconds: to within a second or so)."""
    obj = read_lease(objects, lease)
    stored = max(f.time.timestamp() for f in obj.metadata.managed_fields or [] if f.time)
    return obj.spec.holder_identity or "", obj.spec.renew_time.timestamp() - stored


def assert_holder_clock(objects: Objects, lease: str, clocks: Clocks) -> None:
    """The holder's Lease says its wall clock is as far off as the test set it."""
    who, ahead = holder_clock(objects, lease)
    assert abs(ahead - clocks.get(who, 0.0)) < 3.0, (who, ahead, clocks)


@contextmanager
def replica(
    cp: ControlPlane,
    objects: Objects,
    log_dir: Path,
    lease: str,
    identity: str,
    *args: str,
    clock_s: float | None = None,
) -> Iterator[Controller]:
    """A controller process named `identity`, its wall clock `clock_s` off when given."""
    env = {"POD_NAME": identity, **(skewed_clock_env(clock_s) if clock_s is not None else {})}
    ctl = Controller(cp, log_dir / f"{identity}.log", lease=lease, env=env, extra_args=args)
    try:
        ctl.start()
        yield ctl
    finally:
        if ctl.proc is not None and ctl.proc.poll() is None:
            ctl.proc.send_signal(signal.SIGCONT)  # a stopped process cannot end on SIGTERM
        ctl.stop()
        print(f"--- {identity}\n{ctl.log()[-3000:]}")


@contextmanager
def leader_and_standby(
    cp: ControlPlane,
    objects: Objects,
    log_dir: Path,
    lease: str,
    leader_args: tuple[str, ...] = (),
    *,
    clocks: Clocks | None = None,
    both_args: tuple[str, ...] = (),
) -> Iterator[tuple[Controller, Controller]]:
    """A started and holding the Lease, then B started (the standby), with the wall clocks
    of `clocks`; B seen standing by while A renews; the Lease deleted at the end."""
    clocks = clocks or {}
    with ExitStack() as stack:
        stack.callback(_delete_lease, objects, lease)
        a = stack.enter_context(
            replica(cp, objects, log_dir, lease, A, *both_args, *leader_args, clock_s=clocks.get(A))
        )
        wait_until(lambda: held_by(objects, lease, A), timeout=60, what="A to take the Lease")
        assert_holder_clock(objects, lease, clocks)
        b = stack.enter_context(
            replica(cp, objects, log_dir, lease, B, *both_args, clock_s=clocks.get(B))
        )
        wait_until(lambda: objects.policy_valid("default") == "True", timeout=30, what="valid")
        wait_until(lambda: a.sample("unstick_controller_leader") == 1.0, timeout=30, what="A leads")
        assert b.sample("unstick_controller_leader") == 0.0
        assert b.sample("unstick_build_info", version=__version__) == 1.0
        a_renews_while_b_stands_by(objects, lease, b)
        yield a, b


def a_renews_while_b_stands_by(objects: Objects, lease: str, b: Controller) -> None:
    """A renews the Lease 4 times (~8 s: B reads it at least 3 times meanwhile) and is its
    holder at every read; B leads at no time. A B that compared A's renewTime with its
    own clock, 20 s ahead of A's, would find the 15 s lease expired at its first read and
    take it: two actives."""
    renewals: set[str] = set()

    def renewed() -> bool:
        obj = read_lease(objects, lease)
        assert obj.spec.holder_identity == A, obj.spec
        renewals.add(obj.metadata.resource_version)
        return len(renewals) > 4

    wait_until(renewed, timeout=60, what="A to renew the Lease 4 times")
    assert b.sample("unstick_controller_leader") == 0.0
    assert f"this replica ({B}) holds" not in b.log()


def _delete_lease(objects: Objects, lease: str) -> None:
    try:
        client.CoordinationV1Api(objects.api_client).delete_namespaced_lease(lease, LEASE_NS)
    except ApiException as exc:
        if exc.status != 404:
            raise


def node_gone_pod(objects: Objects, namespace: str, node: str) -> dict[str, Any]:
    """An opted-in pod whose Node is deleted, then the pod: NodeGone once past its slack."""
    pod = objects.pod(namespace, node, remediate="true")
    objects.core.delete_node(node)
    objects.core.delete_namespaced_pod(pod["name"], namespace)
    return pod


def deleted_once(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> tuple[str, float]:
    """The pod's one successful DELETE by any controller (asserted): (user agent, when)."""
    deletes = [
        e
        for e in requests(
            cp,
            by="unstick-controller/",
            verbs={"delete"},
            resource="pods",
            namespace=namespace,
            name=pod["name"],
        )
        if 200 <= int((e.get("responseStatus") or {}).get("code") or 0) < 300
    ]
    assert len(deletes) == 1, [(e["userAgent"], e["requestReceivedTimestamp"]) for e in deletes]
    return str(deletes[0]["userAgent"]), received_at(deletes[0])


def deleted_once_by(cp: ControlPlane, namespace: str, pod: dict[str, Any], identity: str) -> float:
    """The pod's one DELETE by any controller (asserted), sent by `identity`; when."""
    agent, at = deleted_once(cp, namespace, pod)
    assert agent == user_agent(identity)
    return at


def first_write_after(cp: ControlPlane, identity: str, after: float) -> float | None:
    times = [received_at(e) for e in requests(cp, by_exactly=user_agent(identity), verbs=WRITES)]
    later = [t for t in times if t >= after]
    return min(later) if later else None


def writes_after(cp: ControlPlane, identity: str, after: float) -> list[str]:
    """The writes `identity` sent that the API server received at or after `after`."""
    return [
        f"{e['verb']} {e['objectRef'].get('resource')}/{e['objectRef'].get('subresource', '')}"
        f" {e['objectRef'].get('name')} at +{received_at(e) - after:.3f} s"
        for e in requests(cp, by_exactly=user_agent(identity), verbs=WRITES)
        if received_at(e) >= after
    ]


def none_remediating(objects: Objects, namespace: str) -> bool:
    items = objects.custom.list_namespaced_custom_object(
        "unstick.dev", "v1alpha1", namespace, "remediations"
    )["items"]
    return bool(items) and all((r.get("status") or {}).get("phase") != "Remediating" for r in items)


def report(what: str, **times: float | None) -> None:
    parts = ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} -" for k, v in times.items())
    print(f"FAILOVER {what}: {parts}")


SAME_CLOCKS: Clocks = {}


@pytest.mark.parametrize("offset_s", [SKEW_S, -SKEW_S])
def test_a_skewed_process_reads_its_wall_clock_off(offset_s: float) -> None:
    """The setup the tests below rely on: a Python process started with the skew's
    environment reads time.time() and datetime.now() `offset_s` off this process's, and
    its monotonic clocks (the election's) as they are."""
    seen = clocks_seen_by_child(skewed_clock_env(offset_s))
    for clock in ("time", "datetime"):
        low, high = seen[clock]
        assert low <= offset_s <= high, (clock, seen)
    for clock in ("monotonic", "boottime"):
        low, high = seen[clock]
        assert low <= 0.0 <= high, (clock, seen)


@pytest.mark.parametrize(
    "clocks",
    [SAME_CLOCKS, {B: SKEW_S}, {B: -SKEW_S}],
    ids=["same-clocks", "standby-20s-ahead", "standby-20s-behind"],
)
def test_sigkill_of_the_leader(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
    clocks: Clocks,
) -> None:
    lease = "t-lease-kill"
    with leader_and_standby(control_plane, objects, tmp_path, lease, clocks=clocks) as (a, b):
        node = make_node(kubelet=False)
        assert a.proc is not None
        a.proc.kill()
        a.proc.wait(timeout=10)
        a.proc = None
        killed = time.time()
        pod = node_gone_pod(objects, namespace, node)
        objects_gone = lambda: objects.read_pod(namespace, pod["name"]) is None  # noqa: E731
        wait_until(objects_gone, timeout=120, what="the standby to force-delete the pod")
        deleted = deleted_once_by(control_plane, namespace, pod, B)
        acquired = held_by(objects, lease, B)
        assert acquired is not None
        assert_holder_clock(objects, lease, clocks)  # B's clock is off as set
        if B in clocks:  # acquireTime is on B's clock
            acquired -= clocks[B]
        first = first_write_after(control_plane, B, killed)
        wait_until(lambda: none_remediating(objects, namespace), timeout=90, what="no Remediating")
        assert b.sample("unstick_controller_leader") == 1.0
        report(
            "SIGKILL",
            lease_taken=acquired - killed,
            first_write=None if first is None else first - killed,
            pod_deleted=deleted - killed,
        )


@pytest.mark.parametrize(
    "clocks",
    [SAME_CLOCKS, {A: SKEW_S}, {A: -SKEW_S}],
    ids=["same-clocks", "leader-20s-ahead", "leader-20s-behind"],
)
def test_sigstop_past_the_lease_then_sigcont(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
    clocks: Clocks,
) -> None:
    lease = "t-lease-stop"
    with leader_and_standby(control_plane, objects, tmp_path, lease, clocks=clocks) as (a, _b):
        assert a.proc is not None
        node = make_node(kubelet=False)
        # A is stopped the moment it has diagnosed the pod: in the middle of its pass (its
        # intent, DELETE or status write may or may not have gone out). Whatever it did
        # before the stop stands; after it, only B may act.
        pod = node_gone_pod(objects, namespace, node)
        wait_until(
            lambda: f"pod={namespace}/{pod['name']} " in a.log(), timeout=60, what="A's pass"
        )
        os.kill(a.proc.pid, signal.SIGSTOP)
        stopped = time.time()
        acquired = wait_until(
            lambda: held_by(objects, lease, B), timeout=60, what="B to take the Lease"
        )
        wait_until(
            lambda: objects.read_pod(namespace, pod["name"]) is None,
            timeout=60,
            what="B to force-delete the pod",
        )
        os.kill(a.proc.pid, signal.SIGCONT)
        wait_until(lambda: "leader election lost" in a.log(), timeout=30, what="A to see it lost")
        wait_until(lambda: not a.alive(), timeout=60, what="A to exit")
        assert a.proc.returncode == 1, a.log()[-2000:]
        # A second stuck pod after A came back: only B.
        pod2 = node_gone_pod(objects, namespace, make_node(kubelet=False))
        wait_until(
            lambda: objects.read_pod(namespace, pod2["name"]) is None,
            timeout=60,
            what="B to force-delete the second pod",
        )
        assert writes_after(control_plane, A, acquired) == []
        # The first pod: by A before it was stopped, or by B; once either way.
        agent, at = deleted_once(control_plane, namespace, pod)
        assert agent == user_agent(B) or at < acquired
        deleted_once_by(control_plane, namespace, pod2, B)
        wait_until(lambda: none_remediating(objects, namespace), timeout=90, what="no Remediating")
        report("SIGSTOP", lease_taken=acquired - stopped)


def test_leader_cut_off_the_api_server(
    control_plane: ControlPlane, objects: Objects, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    lease = "t-lease-cut"
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    proxy = TcpProxy(server.hostname or "127.0.0.1", server.port or 443).start()
    try:
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        proxied = tmp_path / "through-proxy.kubeconfig"
        proxied.write_text(yaml.safe_dump(config))
        with leader_and_standby(
            control_plane, objects, tmp_path, lease, ("--kubeconfig", str(proxied))
        ) as (a, _b):
            proxy.close()
            cut = time.time()
            wait_until(lambda: "leader election lost" in a.log(), timeout=60, what="A gives up")
            gave_up = time.time()
            acquired = wait_until(
                lambda: held_by(objects, lease, B), timeout=60, what="B to take the Lease"
            )
            pod = node_gone_pod(objects, namespace, make_node(kubelet=False))
            wait_until(
                lambda: objects.read_pod(namespace, pod["name"]) is None,
                timeout=60,
                what="B to force-delete the pod",
            )
            deleted_once_by(control_plane, namespace, pod, B)
            assert writes_after(control_plane, A, acquired) == []
            wait_until(lambda: not a.alive(), timeout=60, what="A to exit")
            wait_until(lambda: none_remediating(objects, namespace), timeout=90, what="resolved")
            report("cut off", gave_up=gave_up - cut, lease_taken=acquired - cut)
    finally:
        proxy.close()


#: A takeover within ~8 s of the kill: the grants a leader 20 s ahead recorded just before
#: it are still in the future of the standby's clock when it rebuilds the budget.
SHORT_LEASE = (
    "--leader-elect-lease-duration=6s",
    "--leader-elect-renew-deadline=4s",
    "--leader-elect-retry-period=1s",
)


@pytest.mark.parametrize(
    ("clocks", "args"),
    [
        (SAME_CLOCKS, ()),
        ({A: SKEW_S}, SHORT_LEASE),
        ({A: -SKEW_S}, SHORT_LEASE),
    ],
    ids=["same-clocks", "leader-20s-ahead", "leader-20s-behind"],
)
def test_the_budget_and_the_incident_carry_over_a_takeover(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
    clocks: Clocks,
    args: tuple[str, ...],
) -> None:
    """5 pods of a lost node under 2 actions per node per minute: the leader deletes 2 and
    is SIGKILLed; the standby takes over, rebuilds the budget from the records (the 2
    count), adopts the leader's node incident (no second record) and deletes the other 3
    in later windows. No 60 s window on the API server's clock holds more than 2 DELETEs.
    With the leader's clock 20 s ahead its grants are on record 20 s in the future: the
    standby counts them as made when it rebuilds (later than they were: the stricter
    guess) and logs the skew. With it 20 s behind they are on record 20 s in the past:
    the standby counts them from when the API server stored their record, on its own
    clock (acting/budget_rebuild.py; before, it freed their slots 20 s early: 4 DELETEs
    in 60 s)."""
    lease = "t-lease-budget"
    objects.core.patch_namespace(namespace, {"metadata": {"labels": SLOW_LABEL}})
    with leader_and_standby(
        control_plane, objects, tmp_path, lease, clocks=clocks, both_args=args
    ) as (a, b):
        wait_until(lambda: objects.policy_valid(SLOW) == "True", timeout=30, what="valid")
        node = make_node(kubelet=False)
        pods = [objects.pod(namespace, node, remediate=SLOW) for _ in range(5)]
        objects.core.delete_node(node)
        for pod in pods:
            objects.core.delete_namespaced_pod(pod["name"], namespace)

        def deletes() -> list[dict[str, Any]]:
            return [
                e
                for e in requests(
                    control_plane,
                    by="unstick-controller/",
                    verbs={"delete"},
                    resource="pods",
                    namespace=namespace,
                    oldest_first=True,
                )
                if 200 <= int((e.get("responseStatus") or {}).get("code") or 0) < 300
            ]

        wait_until(lambda: len(deletes()) >= 2, timeout=60, what="the leader's first 2 deletes")
        assert a.proc is not None
        a.proc.kill()
        a.proc.wait(timeout=10)
        a.proc = None
        gone = lambda: all(objects.read_pod(namespace, p["name"]) is None for p in pods)  # noqa: E731
        wait_until(gone, timeout=240, what="the standby to delete the other 3")
        done = deletes()
        assert sorted(e["objectRef"]["name"] for e in done) == sorted(p["name"] for p in pods)
        by = [e["userAgent"] for e in done]
        assert by[:2] == [user_agent(A)] * 2 and by[2:] == [user_agent(B)] * 3, by
        times = [received_at(e) for e in done]
        for i, start in enumerate(times):
            assert len([t for t in times[i:] if t < start + 60.0]) <= 2, times
        assert "adopted 1 unresolved node incidents" in b.log()
        if clocks.get(A, 0.0) > 0:
            assert "grants on record are up to" in b.log()
        if clocks.get(A, 0.0) < 0:
            assert "grants count from when the API server stored their record" in b.log()
        wait_until(lambda: none_remediating(objects, namespace), timeout=90, what="no Remediating")
        records = objects.custom.list_namespaced_custom_object(
            "unstick.dev", "v1alpha1", namespace, "remediations"
        )["items"]
        assert len(records) == 1, [r["metadata"]["name"] for r in records]  # the one incident
        report("budget", deletes_after_kill=times[2] - times[1])


def test_a_controller_ahead_waits_out_the_slack_by_the_servers_clock(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    """Issue #31: the slack of a NodeGone pod counts from its deletionTimestamp, on the API
    server's clock; a controller whose wall clock is 20 s ahead measures its offset from
    the API server (the Date of its answers, kube/server_clock.py) and force-deletes the
    pod no earlier than SLACK_S after the deletionTimestamp by the API server's clock
    (the audit log's time of the DELETE: the same clock). Before, by its own clock, it
    deleted 20 s early."""
    lease = "t-lease-slack"
    objects.core.patch_namespace(namespace, {"metadata": {"labels": SLACK_LABEL}})
    with ExitStack() as stack:
        stack.callback(_delete_lease, objects, lease)
        a = stack.enter_context(replica(control_plane, objects, tmp_path, lease, A, clock_s=SKEW_S))
        wait_until(lambda: objects.policy_valid(SLACK) == "True", timeout=30, what="valid")
        wait_until(lambda: a.sample("unstick_controller_leader") == 1.0, timeout=60, what="leads")
        assert_holder_clock(objects, lease, {A: SKEW_S})  # its clock is 20 s ahead
        node = make_node(kubelet=False)
        pod = objects.pod(namespace, node, remediate=SLACK)
        objects.core.delete_node(node)
        objects.core.delete_namespaced_pod(pod["name"], namespace)
        read = objects.read_pod(namespace, pod["name"])
        assert read is not None and read.metadata.deletion_timestamp is not None
        deleted = read.metadata.deletion_timestamp.timestamp()  # the API server's clock
        wait_until(
            lambda: objects.read_pod(namespace, pod["name"]) is None,
            timeout=120,
            what="the controller to force-delete the pod",
        )
        at = deleted_once_by(control_plane, namespace, pod, A)
        assert at >= deleted + SLACK_S, (at - deleted, SLACK_S)
        report("slack, controller 20 s ahead", deleted_after_deletion_timestamp=at - deleted)


# -- in-process: two electors, one with a wall clock 20 s ahead ---------------------------


def _elector(cp: ControlPlane, name: str, identity: str, skew_s: float = 0.0) -> Elector:
    settings = LeaseSettings(
        identity=identity,
        name=name,
        namespace=LEASE_NS,
        lease_duration_s=3.0,
        renew_deadline_s=2.0,
        retry_period_s=0.5,
    )
    kube = Kube(ClientSettings(kubeconfig=str(cp.kubeconfig), timeout_s=2.0, retry_attempts=1))
    return Elector(kube, settings, wall=lambda: time.time() + skew_s)


@pytest.mark.parametrize("skewed", ["leader", "standby"])
def test_a_skewed_wall_clock_changes_nothing(
    control_plane: ControlPlane, objects: Objects, skewed: str
) -> None:
    lease = f"t-lease-skew-{skewed}"
    first = _elector(control_plane, lease, "first", 20.0 if skewed == "leader" else 0.0)
    second = _elector(control_plane, lease, "second", 20.0 if skewed == "standby" else 0.0)
    threads = [threading.Thread(target=e.run, daemon=True) for e in (first, second)]
    try:
        threads[0].start()
        wait_until(first.leading, timeout=10, what="the first elector to lead")
        threads[1].start()
        # Four lease durations of renewals: the second never takes the lease, whatever
        # renewTime says against its clock.
        until = time.monotonic() + 12.0
        while time.monotonic() < until:
            assert not second.leading()
            assert held_by(objects, lease, "first") is not None
            time.sleep(0.25)
        # The first stops renewing (as if it were killed): it stops writing within its
        # renew deadline, and the second takes over only after that.
        first.stop.set()
        threads[0].join(timeout=10)
        stopped = time.monotonic()
        wait_until(lambda: not first.leading(), timeout=5, what="the first to stop leading")
        with pytest.raises(NotLeading):
            first.check("DELETE", "/api/v1/namespaces/x/pods/y")
        wait_until(second.leading, timeout=15, what="the second to take over")
        assert not first.leading()
        print(f"skewed {skewed}: taken over {time.monotonic() - stopped:.2f} s after the stop")
    finally:
        for e in (first, second):
            e.stop.set()
        for t in threads:
            t.join(timeout=10)
        second.release()
        _delete_lease(objects, lease)


def test_two_electors_starting_together_one_leads(
    control_plane: ControlPlane, objects: Objects
) -> None:
    """No Lease yet, two replicas create it at once: one wins (the other's POST or PUT is
    answered 409), and at no sampled moment do both lead."""
    lease = "t-lease-race"
    electors = [_elector(control_plane, lease, name) for name in ("one", "two")]
    threads = [threading.Thread(target=e.run, daemon=True) for e in electors]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: any(e.leading() for e in electors), timeout=15, what="a leader")
        until = time.monotonic() + 6.0  # two lease durations
        while time.monotonic() < until:
            assert [e.leading() for e in electors].count(True) <= 1
            time.sleep(0.1)
        found = holder(objects, lease)
        assert found is not None
        (winner,) = [e for e in electors if e.leading()]
        assert found[0] == winner.settings.identity
    finally:
        for e in electors:
            e.stop.set()
        for t in threads:
            t.join(timeout=10)
        for e in electors:
            e.release()
        _delete_lease(objects, lease)


def test_the_guard_is_checked_again_on_the_connection(
    control_plane: ControlPlane, objects: Objects
) -> None:
    """The guard runs in `Kube._call` and once more inside the connection, right before the
    request line and headers are written (after the pool, the connect, the TLS handshake and
    urllib3's framing): a lease lost in between (a process stopped there) sends nothing.
    GETs are not guarded."""
    agent = "unstick-guard-test/1"
    kube = Kube(
        ClientSettings(kubeconfig=str(control_plane.kubeconfig), user_agent=agent, retry_attempts=1)
    )
    checked: list[str] = []

    def guard(method: str, path: str) -> None:
        checked.append(f"{method} {path}")
        if len(checked) > 1:  # the lease was lost after the first check
            raise NotLeading("lost meanwhile")

    kube.write_guard = guard
    body = {"metadata": {"name": f"t-guard-{os.getpid()}"}, "data": {"a": "b"}}
    try:
        with pytest.raises(NotLeading):
            kube.request("POST", "/api/v1/namespaces/default/configmaps", body=body)
        assert len(checked) == 2, checked
        assert kube.get("/api/v1/namespaces/default") is not None
        assert len(checked) == 2  # a GET: no check
        assert requests(control_plane, by_exactly=agent, verbs=WRITES) == []
        assert [e["verb"] for e in requests(control_plane, by_exactly=agent)] == ["get"]
    finally:
        kube.close()
