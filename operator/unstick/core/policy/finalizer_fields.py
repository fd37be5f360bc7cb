"""The RemediationPolicy's finalizer-owner fields (docs/contracts.md):

    spec:
      finalizerOwners:                    # finalizer prefix → the owner that serves it
        - prefix: example.com/
          deployment: {namespace: ops, name: example-operator}
        - prefix: db.example.org/
          lease: {namespace: ops, name: db-operator-leader}
      finalizerOwnerGoneSeconds: 3600     # optional; absent: the allowlist alone decides

Each entry names exactly one of `lease` or `deployment`; prefixes are unique. Errors name
the field, e.g. `spec.finalizerOwners[1].deployment.name: missing`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from unstick.core import fields as f
from unstick.core.model.facts import DEPLOYMENT, LEASE
from unstick.core.rules.finalizer_owners import FinalizerOwner, OwnerRef

ENTRY_KEYS = ("prefix", "lease", "deployment")
REF_KEYS = ("namespace", "name")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_PREFIX = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]{0,315}$")


def _unknown_keys(obj: Mapping[str, object], known: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in known:
            raise f.FieldError(f"{where}.{key}", f"unknown field (known: {', '.join(known)})")


def _ref(kind: str, raw: object, where: str) -> OwnerRef:
    obj = f.as_object(raw, where)
    _unknown_keys(obj, REF_KEYS, where)
    namespace = f.string(obj, "namespace", where)
    name = f.string(obj, "name", where)
    if not _NAMESPACE.match(namespace):
        raise f.FieldError(f"{where}.namespace", f"{namespace!r} is not a namespace name")
    if not _NAME.match(name):
        raise f.FieldError(f"{where}.name", f"{name!r} is not a {kind} name")
    return OwnerRef(kind, namespace, name)


def _entry(raw: object, where: str) -> FinalizerOwner:
    obj = f.as_object(raw, where)
    _unknown_keys(obj, ENTRY_KEYS, where)
    prefix = f.string(obj, "prefix", where)
    if not _PREFIX.match(prefix):
        raise f.FieldError(
            f"{where}.prefix",
            f"{prefix!r} is not the start of a finalizer name (e.g. example.com/)",
        )
    kinds = [k for k in ("lease", "deployment") if obj.get(k) is not None]
    if len(kinds) != 1:
        raise f.FieldError(where, "must name exactly one owner: lease or deployment")
    kind = LEASE if kinds[0] == "lease" else DEPLOYMENT
    return FinalizerOwner(prefix, _ref(kind, obj[kinds[0]], f"{where}.{kinds[0]}"))


def finalizer_owners(spec: Mapping[str, object]) -> tuple[FinalizerOwner, ...]:
    out: list[FinalizerOwner] = []
    for i, raw in enumerate(f.opt_list(spec, "finalizerOwners", "spec")):
        entry = _entry(raw, f"spec.finalizerOwners[{i}]")
        if any(e.prefix == entry.prefix for e in out):
            raise f.FieldError(
                f"spec.finalizerOwners[{i}].prefix", f"{entry.prefix!r} is listed twice"
            )
        out.append(entry)
    return tuple(out)


def owner_gone_seconds(spec: Mapping[str, object]) -> float | None:
    value = spec.get("finalizerOwnerGoneSeconds")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise f.FieldError(
            "spec.finalizerOwnerGoneSeconds", "must be a non-negative number of seconds (finite)"
        )
    return float(value)
