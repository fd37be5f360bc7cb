"""`unstick snapshot`: capture a snapshot bundle of NAMESPACE/POD from a live cluster."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from unstick.kube.client import Kube

EXIT_FAILED = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Capture everything unstick looks at for one pod into a snapshot bundle (JSON on
standard output): the Pod, its Node (null if it does not exist), the node's CSINode,
the pod's PersistentVolumeClaims and their PersistentVolumes, the VolumeAttachments of
those volumes on the pod's node, the pod's recent Events, and the latest probe the
unstick agent wrote to the pod's Remediation (null if there is none). Objects are kept
exactly as the API server returns them.

Diagnose it offline with `unstick diagnose --snapshot FILE`, or attach it to a bug
report. Example:  unstick snapshot shop/web-0 > web-0.json"""

JSON = dict[str, Any]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "snapshot",
        help="capture a snapshot bundle of NAMESPACE/POD from a live cluster",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="NAMESPACE/POD", help="the pod to capture, e.g. shop/web-0")
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    p.set_defaults(command="snapshot")


class SnapshotError(Exception):
    """A failure to report in one line (pod not found, no kubeconfig, API error)."""


def _connect(kubeconfig: str | None) -> Kube:
    """The project's raw-JSON client (unstick.kube.client.Kube); one-line errors."""
    import kubernetes.config

    from unstick import __version__
    from unstick.kube.client import ClientSettings, Kube

    try:
        return Kube(
            ClientSettings(
                kubeconfig=kubeconfig,
                user_agent=f"unstick-snapshot/{__version__}",
                retry_attempts=3,
                retry_max_wait_s=5.0,
            )
        )
    except (kubernetes.config.ConfigException, OSError) as err:
        where = kubeconfig or "$KUBECONFIG / ~/.kube/config / in-cluster"
        raise SnapshotError(
            f"no usable kubeconfig ({where}): {err}; pass --kubeconfig PATH"
        ) from None


def _claim_names(pod: JSON) -> list[str]:
    names = []
    for vol in pod.get("spec", {}).get("volumes") or []:
        if vol.get("persistentVolumeClaim"):
            names.append(vol["persistentVolumeClaim"].get("claimName", ""))
        elif vol.get("ephemeral"):  # generic ephemeral volume: PVC <pod>-<volume>
            names.append(f"{pod['metadata']['name']}-{vol['name']}")
    return [n for n in names if n]


def _latest_probe(api: Kube, namespace: str, uid: str) -> JSON | None:
    """`status.probe` of the pod's Remediation (the newest, if several); None if none."""
    from kubernetes.client.exceptions import ApiException

    try:
        rems = api.list_all(
            f"/apis/unstick.dev/v1alpha1/namespaces/{quote(namespace)}/remediations",
            {"labelSelector": f"unstick.dev/pod-uid={uid}"},
        )
    except ApiException as err:
        if err.status == 404:  # the Remediation CRD is not installed
            return None
        raise
    probes = [r["status"]["probe"] for r in rems if (r.get("status") or {}).get("probe")]
    probes.sort(key=lambda p: str(p.get("probedAt", "")))
    return probes[-1] if probes else None


def capture(api: Kube, namespace: str, name: str, now: datetime) -> JSON:
    """The bundle of DESIGN §6 for one pod."""
    ns = quote(namespace)
    pod = api.get(f"/api/v1/namespaces/{ns}/pods/{quote(name)}")
    if pod is None:
        raise SnapshotError(f"pod {namespace}/{name} not found")
    uid = pod["metadata"]["uid"]
    node_name = pod.get("spec", {}).get("nodeName")
    node = api.get(f"/api/v1/nodes/{quote(node_name)}") if node_name else None
    csi_node = (
        api.get(f"/apis/storage.k8s.io/v1/csinodes/{quote(node_name)}") if node_name else None
    )
    claims = [
        c
        for c in (
            api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{quote(n)}")
            for n in _claim_names(pod)
        )
        if c is not None
    ]
    volumes = [
        v
        for v in (
            api.get(f"/api/v1/persistentvolumes/{quote(c['spec']['volumeName'])}")
            for c in claims
            if (c.get("spec") or {}).get("volumeName")
        )
        if v is not None
    ]
    pv_names = {v["metadata"]["name"] for v in volumes}
    attachments = [
        a
        for a in api.list_all("/apis/storage.k8s.io/v1/volumeattachments")
        if a.get("spec", {}).get("nodeName") == node_name
        and a.get("spec", {}).get("source", {}).get("persistentVolumeName") in pv_names
    ]
    events = api.list_all(
        f"/api/v1/namespaces/{ns}/events", {"fieldSelector": f"involvedObject.uid={uid}"}
    )
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Snapshot",
        "capturedAt": now.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "pod": pod,
        "node": node,
        "csiNode": csi_node,
        "persistentVolumeClaims": claims,
        "persistentVolumes": volumes,
        "volumeAttachments": attachments,
        "events": events,
        "probe": _latest_probe(api, namespace, uid),
    }


def run(args: argparse.Namespace) -> int:
    namespace, sep, name = str(args.pod).partition("/")
    if not sep or not namespace or not name or "/" in name:
        print(
            f"unstick snapshot: {args.pod!r} is not NAMESPACE/POD (e.g. shop/web-0)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        api = _connect(args.kubeconfig)
        try:
            bundle = capture(api, namespace, name, datetime.now(UTC))
        finally:
            api.close()
    except SnapshotError as err:
        print(f"unstick snapshot: {err}", file=sys.stderr)
        return EXIT_FAILED
    except ApiException as err:
        print(f"unstick snapshot: API error {err.status} {err.reason}", file=sys.stderr)
        return EXIT_FAILED
    except (urllib3.exceptions.HTTPError, OSError) as err:  # refused, TLS, timeouts
        print(f"unstick snapshot: cannot reach the API server: {err}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(bundle, indent=2))
    return 0
