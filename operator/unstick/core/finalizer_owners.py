"""Finalizer triage (issue #25): who removes each finalizer of a `FinalizerBlocked` pod, and
does that controller seem to be running?

Built-in finalizers are mapped to the controller that removes them and the leader lease it
renews (`batch.kubernetes.io/job-tracking` → the Job controller of kube-controller-manager,
lease `kube-system/kube-controller-manager`, kubernetes#127917); any other finalizer
belongs to whatever installed it (an operator, uninstalled with its finalizers left
behind, is the usual case) and is named by its domain. A lease in the bundle's optional
`leases` (coordination.k8s.io/v1 Lease objects, as the API returns them) that was renewed
within its duration says the controller is alive (then: wait, or read its log); one not
renewed for longer says it seems gone. Evidence only: removal stays the allowlist's
(design.md §3 invariant 4), never decided here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from unstick.core import fields as f
from unstick.core.durations import human
from unstick.core.evidence import Evidence
from unstick.core.facts import LeaseFacts

KCM_LEASE = ("kube-system", "kube-controller-manager")
KCM = "kube-controller-manager"

#: finalizer → (the controller that removes it, the lease its leader renews)
BUILT_IN: Mapping[str, tuple[str, tuple[str, str]]] = {
    "batch.kubernetes.io/job-tracking": (f"the Job controller of {KCM}", KCM_LEASE),
    "foregroundDeletion": (f"the garbage collector of {KCM}", KCM_LEASE),
    "orphan": (f"the garbage collector of {KCM}", KCM_LEASE),
    "kubernetes.io/pvc-protection": (f"the PVC protection controller of {KCM}", KCM_LEASE),
    "kubernetes.io/pv-protection": (f"the PV protection controller of {KCM}", KCM_LEASE),
}
DEFAULT_LEASE_S = 15.0


def parse_leases(bundle: Mapping[str, object]) -> Mapping[tuple[str, str], LeaseFacts]:
    """The bundle's optional `leases`, by (namespace, name)."""
    out: dict[tuple[str, str], LeaseFacts] = {}
    for i, raw in enumerate(f.opt_list(bundle, "leases", "")):
        where = f"leases[{i}]"
        lease = f.as_object(raw, where)
        meta = f.as_object(lease.get("metadata") or {}, f"{where}.metadata")
        spec = f.as_object(lease.get("spec") or {}, f"{where}.spec")
        key = (
            f.opt_string(meta, "namespace", f"{where}.metadata") or "",
            f.string(meta, "name", f"{where}.metadata"),
        )
        out[key] = LeaseFacts(
            holder=f.opt_string(spec, "holderIdentity", f"{where}.spec") or "",
            renewed=f.opt_time(spec, "renewTime", f"{where}.spec"),
            duration_s=float(
                f.opt_int(spec, "leaseDurationSeconds", f"{where}.spec") or DEFAULT_LEASE_S
            ),
        )
    return out


def _lease_words(owner: str, key: tuple[str, str], lease: LeaseFacts | None, now: datetime) -> str:
    name = f"{key[0]}/{key[1]}"
    if lease is None:
        return (
            f"its leader lease {name} was not read: whether it runs is not known here "
            "(`unstick snapshot` captures it)"
        )
    if lease.renewed is None or not lease.holder:
        return f"its leader lease {name} has no holder: {owner} seems not to be running"
    age = (now - lease.renewed).total_seconds()
    by = f" by {lease.holder}"
    if now - lease.renewed <= timedelta(seconds=lease.duration_s * 2):
        return (
            f"its leader lease {name} was renewed {human(max(age, 0.0))} ago{by}: it is alive — "
            "wait for it, or read its log for why it does not remove the finalizer"
        )
    return (
        f"its leader lease {name} was last renewed {human(age)} ago{by}: {owner} seems gone — "
        "nothing removes the finalizer until it is back"
    )


def finalizer_evidence(
    finalizers: tuple[str, ...],
    leases: Mapping[tuple[str, str], LeaseFacts],
    now: datetime,
) -> list[Evidence]:
    """One line per finalizer: its owner and whether that owner seems present."""
    out = []
    for name in finalizers:
        known = BUILT_IN.get(name)
        if known is not None:
            owner, key = known
            words = f"finalizer {name} is removed by {owner}; " + _lease_words(
                owner, key, leases.get(key), now
            )
        else:
            domain = name.split("/", 1)[0] if "/" in name else name
            words = (
                f"finalizer {name} is not a built-in one: the controller that added it "
                f"({domain}) removes it; if that controller was uninstalled, nothing will"
            )
        out.append(Evidence("finalizer", words))
    return out
