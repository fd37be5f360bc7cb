"""Invariant 7 (no safety fact from a record someone else can write) and the clock-skew
rule of invariant 1, as unit and property tests of the pure predicates and the
controller's record checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from tests.support.pods import remembered_pod
from tests.support.remediations import remediation
from unstick.controller.agent_channel import trust
from unstick.controller.records import identity
from unstick.core.safety import MAX_CLOCK_SKEW_S, bound_probe, fresh_probe
from unstick.core.vocabulary import Refusal
from unstick.kube.podwatch import TerminatingPod

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
UID = "11111111-2222-3333-4444-555555555555"
OTHER = "99999999-2222-3333-4444-555555555555"


def record(uid: str = UID, node: str = "n1", name: str = "web-0") -> TerminatingPod:
    return remembered_pod("ns", name, uid, node, deleted_at=NOW.timestamp() - 600, running=True)


def probe(uid: str | None = UID, node: str = "n1", at: datetime = NOW) -> dict[str, object]:
    out: dict[str, object] = {
        "nodeName": node,
        "probedAt": at.isoformat().replace("+00:00", "Z"),
        "kubeletRoot": "/var/lib/kubelet",
    }
    if uid is not None:
        out["podUID"] = uid
    return out


# -- item 6: clock skew -----------------------------------------------------------------


def test_a_probe_119s_in_the_future_is_not_fresh() -> None:
    verdict = fresh_probe("n1", NOW + timedelta(seconds=119), "n1", NOW, 120)
    assert not verdict
    assert "in the future" in verdict.reason


def test_small_skew_is_allowed() -> None:
    assert fresh_probe("n1", NOW + timedelta(seconds=MAX_CLOCK_SKEW_S), "n1", NOW, 120)
    assert not fresh_probe("n1", NOW + timedelta(seconds=MAX_CLOCK_SKEW_S + 1), "n1", NOW, 120)


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_fresh_only_within_age_and_skew(offset: float) -> None:
    ok = bool(fresh_probe("n1", NOW + timedelta(seconds=offset), "n1", NOW, 120))
    assert ok == (-120 <= offset <= MAX_CLOCK_SKEW_S)


# -- item 1: a probe is bound to its pod, its node and our request ------------------------


def test_probe_of_another_uid_is_refused() -> None:
    verdict = bound_probe(OTHER, "n1", NOW, pod_uid=UID, node="n1", requested_at=NOW)
    assert not verdict
    assert OTHER in verdict.reason


def test_probe_without_uid_is_refused() -> None:
    assert not bound_probe(None, "n1", NOW, pod_uid=UID, node="n1", requested_at=NOW)


def test_probe_before_our_request_is_refused() -> None:
    verdict = bound_probe(
        UID, "n1", NOW - timedelta(seconds=60), pod_uid=UID, node="n1", requested_at=NOW
    )
    assert not verdict
    assert "before this controller asked" in verdict.reason


def test_probe_when_we_never_asked_is_refused() -> None:
    assert not bound_probe(UID, "n1", NOW, pod_uid=UID, node="n1", requested_at=None)


def test_honest_probe_is_accepted() -> None:
    assert bound_probe(
        UID, "n1", NOW, pod_uid=UID, node="n1", requested_at=NOW - timedelta(seconds=3)
    )


uids = st.sampled_from([UID, OTHER, "", None])
nodes = st.sampled_from(["n1", "n2", "", None])


@given(
    uids,
    nodes,
    st.floats(min_value=-1000, max_value=1000, allow_nan=False),
    st.one_of(st.none(), st.floats(min_value=-1000, max_value=1000, allow_nan=False)),
)
def test_bound_only_for_this_uid_node_and_after_request(
    uid: str | None, node: str | None, probed: float, requested: float | None
) -> None:
    verdict = bound_probe(
        uid,
        node,
        NOW + timedelta(seconds=probed),
        pod_uid=UID,
        node="n1",
        requested_at=None if requested is None else NOW + timedelta(seconds=requested),
    )
    if verdict:
        assert uid == UID and node == "n1" and requested is not None
        assert probed >= requested - MAX_CLOCK_SKEW_S


# -- the controller's use of a Remediation ------------------------------------------------


def test_usable_probe_forged_other_uid() -> None:
    v = trust.usable_probe(probe(uid=OTHER), record(), NOW.timestamp() - 5)
    assert v.probe is None and v.refusal is Refusal.FORGED


def test_usable_probe_stale_when_not_asked() -> None:
    v = trust.usable_probe(probe(), record(), None)
    assert v.probe is None and v.refusal is Refusal.STALE


def test_usable_probe_honest() -> None:
    p = probe()
    assert trust.usable_probe(p, record(), NOW.timestamp() - 5).probe is p


def test_usable_probe_not_an_object() -> None:
    v = trust.usable_probe(["x"], record(), NOW.timestamp())
    assert v.probe is None and v.refusal is Refusal.FORGED


def rem(uid: str = UID, node: str = "n1", name: str = "web-0") -> dict[str, object]:
    return remediation(name, uid, node, name=f"{name}-{uid[:8]}", metadata={"namespace": "ns"})


def test_identity_mismatch() -> None:
    assert identity.identity_mismatch(rem(), record()) is None
    assert "spec.podUID" in (identity.identity_mismatch(rem(uid=OTHER), record()) or "")
    assert "spec.nodeName" in (identity.identity_mismatch(rem(node="n2"), record()) or "")
    assert "spec.podName" in (identity.identity_mismatch(rem(name="db-0"), record()) or "")


def pod(uid: str = UID, node: str = "n1", deleting: bool = True) -> dict[str, object]:
    meta: dict[str, object] = {"name": "web-0", "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T11:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_check_record() -> None:
    assert identity.check_record(rem(), pod()) is None
    assert "no pod" in (identity.check_record(rem(), None) or "")
    assert "UID" in (identity.check_record(rem(), pod(uid=OTHER)) or "")
    assert "node" in (identity.check_record(rem(), pod(node="n2")) or "")
    assert "not being deleted" in (identity.check_record(rem(), pod(deleting=False)) or "")


def test_add_refusal_records_once() -> None:
    first = identity.add_refusal([], "(probe)", Refusal.FORGED, "why", "t")
    assert first is not None and first[0]["reason"] == "forged"
    assert identity.add_refusal(first, "(probe)", Refusal.FORGED, "why", "t2") is None


def test_probe_requests_first_and_last() -> None:
    r = trust.ProbeRequests()
    assert r.first("u") is None
    r.asked("u", 10.0)
    r.asked("u", 20.0)
    assert (r.first("u"), r.last("u")) == (10.0, 20.0)
    r.forget("u")
    assert r.last("u") is None
