"""`unstick snapshot`: capture a snapshot bundle of NAMESPACE/POD from a live cluster."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from unstick.commands import options
from unstick.core.remediation import PROBE, PROBED_AT, REMEDIATE, UID_LABEL

if TYPE_CHECKING:
    from unstick.kube.client import JSON, Kube

EXIT_FAILED = 1

DESCRIPTION = """\
Capture everything unstick looks at for one pod into a snapshot bundle (JSON on
standard output): the Pod, its Node (null if it does not exist), the node's CSINode,
the pod's PersistentVolumeClaims and their PersistentVolumes, the VolumeAttachments of
those volumes on the pod's node, the pod's recent Events, the latest probe the
unstick agent wrote to the pod's Remediation (null if there is none), and the
RemediationPolicy in force for the pod (null if none applies), and the fencing records
of the node that policy trusts (medik8s FenceAgentsRemediations and
SelfNodeRemediations: metadata and status only). Other objects are kept exactly as the
API server returns them.

Diagnose it offline with `unstick diagnose --snapshot FILE` (under the recorded policy),
or attach it to a bug report. Example:  unstick snapshot shop/web-0 > web-0.json
(or: unstick snapshot -n shop web-0 -o yaml). A bundle is data, so -o is json or yaml.

Exit status: 0 with a bundle, 1 when the cluster could not be read, 2 on bad arguments
or an unusable kubeconfig."""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "snapshot",
        help="capture a snapshot bundle of NAMESPACE/POD from a live cluster",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_pod_args(p, "shop/web-0")
    options.add_cluster_flags(p)
    options.add_output_flag(p, ("json", "yaml"), "json", "bundle format: json (default) or yaml")
    p.set_defaults(command="snapshot")


class SnapshotError(Exception):
    """A failure to report in one line (pod not found, API error)."""


def _latest_probe(api: Kube, namespace: str, uid: str) -> JSON | None:
    """`status.probe` of the pod's Remediation (the newest, if several); None if none."""
    from kubernetes.client.exceptions import ApiException

    from unstick.kube.client import remediation_path

    try:
        rems = api.list_all(remediation_path(namespace), {"labelSelector": f"{UID_LABEL}={uid}"})
    except ApiException as err:
        if err.status == 404:  # the Remediation CRD is not installed
            return None
        raise
    probes = [r["status"][PROBE] for r in rems if (r.get("status") or {}).get(PROBE)]
    probes.sort(key=lambda p: str(p.get(PROBED_AT, "")))
    return probes[-1] if probes else None


def _namespace_labels(api: Kube, namespace: str) -> dict[str, str]:
    """The namespace's labels (opt-in by label, the policy's namespaceSelector); {} when
    they cannot be read."""
    from kubernetes.client.exceptions import ApiException

    try:
        ns = api.get(f"/api/v1/namespaces/{quote(namespace, safe='')}") or {}
    except ApiException:
        return {}
    return dict((ns.get("metadata") or {}).get("labels") or {})


def policy_in_force(api: Kube, pod: JSON) -> JSON | None:
    """The RemediationPolicy the controller applies to `pod`, exactly as the API returns it:
    the one the pod's annotation (or its namespace's label) names, `default` otherwise;
    None when it does not exist, is invalid, or does not serve the pod's namespace (the
    controller then uses its built-in observe-only settings)."""
    from kubernetes.client.exceptions import ApiException

    from unstick.controller.deciding.policies import load_policy, opt_in
    from unstick.core.policy.remediation_policy import PolicyError
    from unstick.kube.client import policy_path

    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    labels = _namespace_labels(api, namespace)
    choice = opt_in((meta.get("annotations") or {}).get(REMEDIATE), labels)
    try:
        obj = api.get(policy_path(choice.policy_name))
    except ApiException as err:
        if err.status in (403, 404):  # no RBAC to read it, or the CRD is not installed
            return None
        raise
    if obj is None:
        return None
    try:
        if not load_policy(choice.policy_name, obj).serves(namespace, labels):
            return None
    except PolicyError:
        return None
    return obj


def capture(api: Kube, namespace: str, name: str, now: datetime) -> JSON:
    """The bundle of docs/design.md §6 for one pod: the controller's bundle (one code path
    for both) plus the pod's Events."""
    from unstick.controller.deciding.inputs import build_bundle, fetch_pod

    pod = fetch_pod(api, namespace, name)
    if pod is None:
        raise SnapshotError(f"pod {namespace}/{name} not found")
    uid = pod["metadata"]["uid"]
    bundle: JSON = build_bundle(api, pod, _latest_probe(api, namespace, uid), now.timestamp())
    bundle["events"] = api.list_all(
        f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
        {"fieldSelector": f"involvedObject.uid={uid}"},
    )
    bundle["policy"] = policy_in_force(api, pod)
    bundle.update(_owners(api, pod, bundle["policy"]))
    bundle.update(_fencing_records(api, pod, bundle["policy"]))
    _add_aftermath(api, bundle, pod)
    return bundle


def _owners(api: Kube, pod: JSON, policy: JSON | None) -> JSON:
    """The owners of the pod's finalizers (issue #25, `core/rules/finalizer_owners.py`): the
    leader leases of the controllers that remove built-in ones, and the Leases/Deployments
    its policy's `spec.finalizerOwners` maps the others to; one found gone now is in
    `ownersGoneSince` as of now. Optional keys; none without RBAC to read them."""
    from unstick.controller.deciding.owner_leases import OwnerLeases, bundle_keys
    from unstick.core.policy.remediation_policy import PolicyError, parse_policy

    try:
        mapping = parse_policy(policy).finalizer_owners if policy else ()
    except PolicyError:
        mapping = ()
    return bundle_keys(OwnerLeases(api, lambda: mapping).for_pod(pod))


def _fencing_records(api: Kube, pod: JSON, policy: JSON | None) -> JSON:
    """The node's fencing records (docs/fencing.md) for the sources the policy in force
    trusts: `fenceAgentsRemediations` from the namespaces it names, `selfNodeRemediations`.
    Optional keys; none when the CRD is missing or RBAC does not let us read them. Only
    their metadata and status (a FAR's spec may carry fence agent credentials)."""
    from unstick.controller.deciding.fencing_records import FencingRecords
    from unstick.core.policy.remediation_policy import PolicyError, parse_policy

    try:
        settings = parse_policy(policy).fencing if policy else None
    except PolicyError:
        settings = None
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if settings is None or not node:
        return {}
    return FencingRecords(api, ttl_s=0).read(node, settings)


def _add_aftermath(api: Kube, bundle: JSON, pod: JSON) -> None:
    """The bundle's aftermath (docs/aftermath.md), each part optional for older readers:
    VolumeAttachments of the pod's volumes on OTHER nodes (a Multi-Attach names another node),
    the pod's Namespace, who waits on the pod (its Remediation's `status.waiters`) and the
    orphaned pod dirs of its node (the agent's latest OrphanedPodDirs Event)."""
    from kubernetes.client.exceptions import ApiException

    from unstick.agent.orphans.events import ANNOTATION, EVENT_NAMESPACE, REASON
    from unstick.kube.client import remediation_path

    meta, node = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName") or ""
    pvs = {(pv.get("metadata") or {}).get("name") for pv in bundle["persistentVolumes"]}
    after: JSON = {"waiters": [], "orphanedPodDirs": []}
    try:
        if pvs:  # `volumeAttachments` keeps those on the pod's node, as before
            after["volumeAttachments"] = [
                va
                for va in api.list_all("/apis/storage.k8s.io/v1/volumeattachments")
                if ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName") in pvs
                and (va.get("spec") or {}).get("nodeName") != node
            ]
        bundle["namespace"] = api.get(f"/api/v1/namespaces/{quote(meta['namespace'], safe='')}")
        rems = api.list_all(
            remediation_path(meta["namespace"]), {"labelSelector": f"{UID_LABEL}={meta['uid']}"}
        )
        for rem in rems:
            after["waiters"] += list((rem.get("status") or {}).get("waiters") or [])
        events = (
            api.list_all(
                f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                {"fieldSelector": f"reason={REASON},involvedObject.name={node}"},
            )
            if node
            else []
        )
        if events:
            latest = max(events, key=lambda e: str(e.get("lastTimestamp") or ""))
            report = json.loads(
                ((latest.get("metadata") or {}).get("annotations") or {})[ANNOTATION]
            )
            after["orphanedPodDirs"] = list(report.get("dirs") or [])
    except (ApiException, KeyError, ValueError) as err:  # read-only RBAC may lack some
        after["note"] = f"aftermath incomplete: {err}"[:300]
    bundle["aftermath"] = after


def capture_live(args: argparse.Namespace, namespace: str, name: str) -> dict[str, Any]:
    """The bundle of one pod, captured now from the cluster the flags name."""
    from unstick import __version__

    api = options.connect(args, f"unstick-{args.command}/{__version__}")
    try:
        return capture(api, namespace, name, datetime.now(UTC))
    finally:
        api.close()


def live_failure(err: Exception) -> str | None:
    """What to tell a person when capturing from the cluster failed; None: not such an error."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, SnapshotError):
        return str(err)
    if isinstance(err, ApiException):
        return f"API error {err.status} {err.reason}"
    if isinstance(err, urllib3.exceptions.HTTPError | OSError):  # refused, TLS, timeouts
        return f"cannot reach the API server: {err}"
    return None


def run(args: argparse.Namespace) -> int:
    from unstick.kube.client import KubeconfigError

    try:
        bundle = capture_live(args, *options.pod_of(args))
    except (options.UsageError, KubeconfigError) as err:
        print(f"unstick snapshot: {err}", file=sys.stderr)
        return options.EXIT_USAGE
    except Exception as err:
        why = live_failure(err)
        if why is None:
            raise
        print(f"unstick snapshot: {why}", file=sys.stderr)
        return EXIT_FAILED
    print(options.dump(bundle, args.output))
    return 0
