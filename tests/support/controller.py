"""Support for the controller's envtests: the controller as a real subprocess, CRDs,
policies, pods, waiting with deadlines, metrics and the controller's requests in the audit
log (audit_log.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import free_port, wait_until
from tests.support.audit_log import WRITES, requests, status_code
from tests.support.pods import pod_body
from unstick.core.remediation import pod_label, remediation_name

GROUP, VERSION = "unstick.dev", "v1alpha1"
USER_AGENT_PREFIX = "unstick-controller/"
# The actions of docs/contracts.md's example policy, which the chart's default policy
# permits too (thaw and restart-kubelet only where a policy lists them).
ALL_ACTIONS = [
    "observe",
    "replay-unpublish",
    "unmount",
    "rmdir-stale",
    "force-delete",
    "remove-finalizer",
]


class Controller:
    """`unstick controller` as a subprocess; killed by PID on stop."""

    def __init__(
        self,
        cp: ControlPlane,
        log_path: Path,
        lease: str | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.cp = cp
        self.lease = lease  # leader election on this Lease (in `default`), else --standalone
        self.extra_args = extra_args
        self.env = env  # added to the environment (e.g. fail points: controller/failpoints.py)
        self.log_path = log_path
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Controller:
        exe = Path(sys.executable).parent / "unstick"
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "unstick"]
        argv += [
            "controller",
            "--kubeconfig",
            str(self.cp.kubeconfig),
            *(["--leader-elect-lease-name", self.lease] if self.lease else ["--standalone"]),
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            "0",
            "--recheck-seconds",
            "30",
            "--kubelet-finish-seconds",
            "3",
            *self.extra_args,
        ]
        log = self.log_path.open("ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        wait_until(
            lambda: "pod list:" in self.log() or not self.alive(),
            timeout=60,
            what="the pod watcher",
        )
        assert self.alive(), self.log()[-3000:]
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()

    def sample(self, name: str, **labels: str) -> float:
        """Value of one sample in /metrics (0.0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.metrics().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            series, _, value = line.rpartition(" ")
            got = series[len(name) :]
            if got.startswith("{"):
                parts = sorted(got.strip("{}").split(","))
                if ",".join(parts) == want:
                    return float(value)
            elif not want and got == "":
                return float(value)
        return 0.0


@contextmanager
def first_and_next(
    cp: ControlPlane, logs: Path, first_env: dict[str, str] | None = None
) -> Iterator[tuple[Controller, Controller]]:
    """Two controller processes, not started: a first one (with `first_env`) and the next
    one, which takes over after it (logs `first.log` and `second.log` in `logs`); both are
    stopped at the end and the ends of their logs printed (pytest shows them on failure)."""
    first = Controller(cp, logs / "first.log", env=first_env)
    second = Controller(cp, logs / "second.log")
    try:
        yield first, second
    finally:
        second.stop()
        first.stop()
        print(first.log()[-2000:], second.log()[-3000:])


@contextmanager
def crds_installed(cp: ControlPlane) -> Iterator[None]:
    ext = client.ApiextensionsV1Api(cp.api_client())
    names = ["remediations.unstick.dev", "remediationpolicies.unstick.dev"]
    existed = {n for n in names if _exists(lambda n=n: ext.read_custom_resource_definition(n))}
    cp.install_crds()
    try:
        yield
    finally:
        for name in names:
            if name not in existed:
                # Wait until it is really gone: the next module applies it again.
                cp.kubectl("delete", "crd", name, "--wait=true", "--timeout=120s", check=False)


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@contextmanager
def policies_in_place(cp: ControlPlane, policies: dict[str, dict[str, Any]]) -> Iterator[Objects]:
    """The CRDs installed and these RemediationPolicies set (name → spec); at the end each
    policy is put back as it was (deleted if it did not exist) and the client closed."""
    with crds_installed(cp):
        objects = Objects(cp)
        before = {name: objects.replace_policy(name, spec) for name, spec in policies.items()}
        try:
            yield objects
        finally:
            for name, spec in before.items():
                objects.replace_policy(name, spec)
            objects.api_client.close()


@contextmanager
def controller_started(
    cp: ControlPlane,
    objects: Objects,
    log_path: Path,
    *,
    valid: Iterable[str] = (),
    lease: str | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Controller]:
    """`unstick controller` started, and each policy named in `valid` seen Valid (so the
    controller has it); stopped at the end, the tail of its log printed for a failure."""
    ctl = Controller(cp, log_path, lease=lease, extra_args=extra_args, env=env)
    try:
        ctl.start()
        for name in valid:
            wait_until(
                lambda n=name: objects.policy_valid(n) == "True",
                timeout=30,
                what=f"policy {name} valid",
            )
        yield ctl
    finally:
        ctl.stop()
        print(ctl.log()[-4000:])


@contextmanager
def running_controller(
    cp: ControlPlane,
    log_dir: Path,
    policies: dict[str, dict[str, Any]],
    *,
    lease: str | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[tuple[Controller, Objects]]:
    """The shared setup of the controller's envtests: CRDs, these policies (put back at
    the end), the controller running with them Valid; yields (controller, objects). A
    test module's fixture states only its policies (and flags):

        with running_controller(control_plane, tmp_path_factory.mktemp("x"), {P: spec()}) as r:
            yield r
    """
    with (
        policies_in_place(cp, policies) as objects,
        controller_started(
            cp,
            objects,
            log_dir / "controller.log",
            valid=policies,
            lease=lease,
            extra_args=extra_args,
            env=env,
        ) as ctl,
    ):
        yield ctl, objects


def policy_spec(**overrides: Any) -> dict[str, Any]:
    spec = {
        "dryRun": False,
        "actions": list(ALL_ACTIONS),
        "slackSeconds": 1,
        "nodeLostAfterSeconds": 2,
        "probeMaxAgeSeconds": 5,
        "finalizerAllowlist": [],
        "rateLimits": {"clusterPerMinute": 1000, "nodePerMinute": 1000},
        "namespaceSelector": {},  # a policy other than `default` serves no namespace without
    }
    spec.update(overrides)
    return spec


class Objects:
    """Small typed-enough helpers over the API for the tests."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.api_client = cp.api_client()
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def create_policy(self, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RemediationPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_cluster_custom_object(GROUP, VERSION, "remediationpolicies", body)

    def replace_policy(self, name: str, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        """Set a policy's spec (None: delete it); returns the spec it had (None: absent)."""
        try:
            old = self.custom.get_cluster_custom_object(GROUP, VERSION, "remediationpolicies", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            old = None
        if old is not None and spec is not None:
            patch = {"spec": spec}
            self.custom.patch_cluster_custom_object(
                GROUP, VERSION, "remediationpolicies", name, patch
            )
        elif spec is not None:
            self.create_policy(name, spec)
        elif old is not None:
            self.delete_policy(name)
        return None if old is None else dict(old.get("spec") or {})

    def delete_policy(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "remediationpolicies", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def policy_valid(self, name: str) -> str | None:
        obj = self.custom.get_cluster_custom_object(GROUP, VERSION, "remediationpolicies", name)
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Valid":
                return str(cond.get("status"))
        return None

    def pod(
        self,
        namespace: str,
        node: str | None,
        *,
        remediate: str | None = None,
        finalizers: list[str] | None = None,
        name: str | None = None,
        grace: int = 1,
        claim: str | None = None,
    ) -> dict[str, Any]:
        """A pod created (tests/support/pods.py): its name and UID."""
        name = name or f"p-{uuid.uuid4().hex[:8]}"
        body = pod_body(
            name, node, remediate=remediate, finalizers=finalizers, grace=grace, claim=claim
        )
        created = self.core.create_namespaced_pod(namespace, body)
        return {"name": name, "uid": created.metadata.uid}

    def read_pod(self, namespace: str, name: str) -> Any | None:
        try:
            return self.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def remediation(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any] | None:
        name = remediation_name(pod["name"], pod["uid"])
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "remediations", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def record(self, namespace: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Create the Remediation `body` (tests/support/remediations.remediation) and write
        its status, as no controller would: a record that was forged or left behind."""
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "remediations", body)
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "remediations", body["metadata"]["name"], {"status": status}
        )

    def status(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        rem = self.remediation(namespace, pod) or {}
        return dict(rem.get("status") or {})

    def records_of(self, namespace: str, pod_name: str) -> list[dict[str, Any]]:
        """The Remediations that tell this pod's story, found by its label
        (`kubectl get remediations -l pod.unstick.dev/<pod>`)."""
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "remediations", label_selector=pod_label(pod_name)
        )
        return list(found.get("items") or [])

    def incident(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The node incident that lists this pod, if any."""
        for rem in self.records_of(namespace, pod["name"]):
            if (rem.get("spec") or {}).get("incident"):
                return rem
        return None

    def remediation_when(
        self,
        namespace: str,
        pod: dict[str, Any],
        check: Callable[[dict[str, Any]], Any] = bool,
        *,
        timeout: float,
        what: str,
        incident: bool = False,
        spec_has: str = "",
        **status: Any,
    ) -> dict[str, Any]:
        """Wait until the pod's Remediation (with `incident`, the node incident that lists
        the pod) exists, its status has these values (`phase="WaitingForAgent"`), its spec
        this field set (`spec_has="nodeSteps"`) and `check(it)` holds; that Remediation."""
        read = self.incident if incident else self.remediation

        def ready() -> dict[str, Any] | None:
            record = read(namespace, pod)
            if record is None or (spec_has and not (record.get("spec") or {}).get(spec_has)):
                return None
            have = record.get("status") or {}
            if any(have.get(key) != value for key, value in status.items()):
                return None
            return record if check(record) else None

        found: dict[str, Any] = wait_until(ready, timeout=timeout, what=what)
        return found

    def stuck_pod(
        self, namespace: str, node: str | None, *, node_gone: bool = False, **pod: Any
    ) -> dict[str, Any]:
        """`pod(...)`, deleted at once: on a node with no kubelet (or none) it stays
        Terminating. With `node_gone`, its Node is deleted first (NodeGone)."""
        made = self.pod(namespace, node, **pod)
        if node_gone and node:
            self.core.delete_node(node)
        self.core.delete_namespaced_pod(made["name"], namespace)
        return made

    def pod_gone(self, namespace: str, pod: dict[str, Any], *, timeout: float, what: str) -> None:
        """Wait until the pod is gone from the API server."""
        wait_until(
            lambda: self.read_pod(namespace, pod["name"]) is None, timeout=timeout, what=what
        )

    def ready_node(self, make_node: Callable[..., str]) -> str:
        """A node with no kubelet that the API server says is Ready (`node_ready`)."""
        node = make_node(kubelet=False)
        node_ready(self, node)
        return node

    def incident_entry(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod's line in its node incident's status.pods ({} when none)."""
        rem = self.incident(namespace, pod) or {}
        for entry in (rem.get("status") or {}).get("pods") or []:
            if entry.get("uid") == pod["uid"]:
                return dict(entry)
        return {}


# --- playing the node agent (tests/envtest/test_controller_agent_channel.py) ---------------


def utc_now() -> str:
    """Now, as the agent writes its times."""
    return datetime.now(UTC).isoformat()


def agent_probe(node: str, volume_dirs: list[dict[str, Any]], uid: str = "") -> dict[str, Any]:
    """A probe as the agent writes it: of pod `uid`, and able to see everything (the
    kubelet root holds pod dirs, the runtime answered, the holder scan was complete)."""
    return {
        "podUID": uid,
        "nodeName": node,
        "probedAt": utc_now(),
        "kubeletRoot": "/var/lib/kubelet",
        "kubeletHealthy": True,
        "registeredPlugins": [],
        "mountinfo": "",
        "volumeDirs": volume_dirs,
        "holders": [],
        "containers": [],
        "podDirExists": True,
        "podDirsSeen": 3,
        "runtime": "cri+cgroup",
        "holderScan": "complete",
    }


def write_as_agent(objects: Objects, namespace: str, rem: dict[str, Any], status: Any) -> None:
    """A JSON merge patch of the Remediation's status, as the agent writes its keys."""
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "remediations", rem["metadata"]["name"], {"status": status}
    )


def node_ready(objects: Objects, node: str) -> None:
    """The Node's Ready condition True, as a kubelet reports it."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    objects.core.patch_node_status(node, {"status": {"conditions": [condition]}})


def node_unknown(core: Any, node: str, since: str, **condition: str) -> None:
    """The Node's Ready condition Unknown since `since` (RFC 3339), as the node lifecycle
    controller writes it once the kubelet stopped posting status; `condition` adds to it.
    `core`: a CoreV1Api."""
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "lastHeartbeatTime": since,
        "lastTransitionTime": since,
        **condition,
    }
    core.patch_node_status(node, {"status": {"conditions": [unknown]}})


def controller_pod_writes(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """Audited requests by the controller that change pods in `namespace`."""
    return requests(cp, by=USER_AGENT_PREFIX, verbs=WRITES, resource="pods", namespace=namespace)


def controller_delete_codes(cp: ControlPlane, namespace: str, pod: str) -> list[int]:
    """Answer codes of the controller's audited DELETEs of this pod, in the log's order."""
    deletes = requests(
        cp, by=USER_AGENT_PREFIX, verbs={"delete"}, resource="pods", namespace=namespace, name=pod
    )
    return [status_code(e) for e in deletes]


def refuse_pod_requests(
    admission: Any, name: str, namespace: str, operation: str, validation: dict[str, str]
) -> None:
    """A ValidatingAdmissionPolicy `name` and its binding: pod requests of `operation` in
    `namespace` are denied unless `validation` (CEL expression, message, ...) holds. The
    caller deletes both (`delete_validating_admission_policy{,_binding}(name)`)."""
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": [operation]}
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{**rule, "resources": ["pods"]}]},
                "validations": [validation],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
