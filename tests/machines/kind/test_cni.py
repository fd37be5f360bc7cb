"""CNI teardown failing (issue #25) on a real kubelet: the kind suite's test CNI plugin
(tests/kind/cnifail/, chained last in one worker's network by tests/kind/cni_plugin.py)
fails DEL for a marker pod; the pod is deleted; the worker's kubelet cannot stop its
sandbox (containerd's own error) and says so in a `FailedKillPod` Event; unstick records
`CNITeardownFailed` naming the plugin and its error, observes and does nothing to the pod;
the plugin healed, the kubelet's retry removes the sandbox and the pod goes, and its
Remediation is `Resolved` with nothing done but observe. See docs/kind.md.

This module's tests run first in tests/kind (file order): the worker is back as it was
before the partition and node-deletion tests of test_kind.py start.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from devcluster.process import wait_until

from . import cni_plugin
from .support import Kind, podman
from .test_kind import busybox_pod

pytestmark = [pytest.mark.kind, pytest.mark.timeout(900)]


def plugin(command: str, stdin: dict[str, Any], args: str = "") -> tuple[int, Any]:
    """The built plugin run as the runtime runs it: its exit status and its JSON output."""
    env = {"CNI_COMMAND": command, "CNI_ARGS": args, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}
    proc = subprocess.run(
        [str(cni_plugin.build())], input=json.dumps(stdin), env=env, capture_output=True, text=True
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None


def test_the_test_plugin_speaks_cni(tmp_path: Any) -> None:
    """ADD passes prevResult through in the given version; DEL fails only for a marker
    pod while the flag exists; CHECK and VERSION as the spec says. No cluster needed."""
    prev = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.244.1.5/24"}]}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": cni_plugin.TYPE, "prevResult": prev}
    assert plugin("ADD", conf) == (0, {**prev, "cniVersion": "1.0.0"})
    flag = tmp_path / "fail"
    del_conf = {"cniVersion": "0.4.0", "name": "n", "type": cni_plugin.TYPE, "failFlag": str(flag)}
    marker = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME={cni_plugin.MARKER}a"
    other = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0"
    assert plugin("DEL", del_conf, marker) == (0, None)  # no flag: succeeds
    flag.touch()
    code, err = plugin("DEL", del_conf, marker)
    assert code == 1 and err["code"] == 999 and err["cniVersion"] == "0.4.0", err
    assert f"refuses DEL of pod {cni_plugin.MARKER}a while {flag} exists" in err["msg"], err
    assert plugin("DEL", del_conf, other) == (0, None)
    assert plugin("CHECK", conf) == (0, None)
    code, version = plugin("VERSION", {"cniVersion": "1.0.0"})
    assert code == 0 and "0.4.0" in version["supportedVersions"], version
    code, err = plugin("DEL", {**del_conf, "failFlag": 3}, marker)
    assert code == 1 and err["code"] == 7 and "failFlag" in err["msg"], err


def test_cni_teardown_failing_on_a_worker(
    kind: Kind, quick_policy: None, namespaces: list[str]
) -> None:
    """A marker pod on a worker whose network ends in the failing plugin is deleted: the
    kubelet's FailedKillPod in containerd's words -> CNITeardownFailed, observe only; the
    plugin healed -> the kubelet's retry tears the network down, the pod goes, Resolved."""
    node = kind.workers()[0]
    ns = "kind-cni"
    namespaces.append(ns)
    opt_in = {"unstick.dev/remediate": "true"}
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": opt_in}}
    )
    name = f"{cni_plugin.MARKER}p"
    with cni_plugin.installed(node) as network:
        kind.apply(busybox_pod(kind, name, ns, node))
        kind.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", ns, "--timeout=120s")
        the_pod = kind.get("pod", name, "-n", ns)
        uid, ip = the_pod["metadata"]["uid"], the_pod["status"]["podIP"]
        reserved = f"/var/lib/cni/networks/{network['name']}"  # host-local IPAM's leases
        assert ip in podman("exec", node, "ls", reserved).split()
        # the runtime's ADD went through the chain (containerd loaded the configuration)
        assert f"ADD pod={name} exit=0" in cni_plugin.calls(node), cni_plugin.calls(node)
        kind.kubectl("delete", "pod", name, "-n", ns, "--wait=false")

        def kubelet_event() -> dict[str, Any] | None:
            found = [
                e
                for e in kind.events(ns)
                if e["reason"] == "FailedKillPod" and e["involvedObject"].get("uid") == uid
            ]
            return found[0] if found else None

        event = wait_until(kubelet_event, timeout=180, what="the kubelet's FailedKillPod Event")
        message = event["message"]
        assert "failed to destroy network for sandbox" in message, message
        assert f'plugin type=\\"{cni_plugin.TYPE}\\"' in message, message

        def diagnosed() -> dict[str, Any] | None:
            rems = kind.remediations(ns)
            rem = rems[0] if rems else {}
            return rem if rem.get("status", {}).get("cause") == "CNITeardownFailed" else None

        try:
            status = wait_until(diagnosed, timeout=180, what="cause CNITeardownFailed")["status"]
        except TimeoutError:
            records = json.dumps(kind.remediations(ns), indent=1)
            pytest.fail(f"no CNITeardownFailed; the kubelet said {message!r}; records: {records}")
        words = " ".join(e["message"] for e in status["evidence"])
        assert f"CNI plugin {cni_plugin.TYPE} fails to delete its network" in words, words
        assert f"refuses DEL of pod {name} while {cni_plugin.FLAG} exists" in words, words
        assert [p["action"] for p in status["plan"]] == ["observe"]
        assert [a["action"] for a in status.get("actions", [])] == ["observe"]
        assert "force-delete" in {r["action"] for r in status.get("refused", [])}
        assert [p["metadata"]["uid"] for p in kind.pods(ns)] == [uid]

        # Healed: the kubelet's next KillPodSandbox removes the sandbox and the pod goes.
        cni_plugin.heal(node)
        wait_until(lambda: not kind.pods(ns), timeout=180, what="the pod gone once healed")
        # the whole chain's DEL ran at last: the bridge plugin gave the pod's IP back
        assert ip not in podman("exec", node, "ls", reserved).split()
        assert f"DEL pod={name} exit=0" in cni_plugin.calls(node), cni_plugin.calls(node)

    def resolved() -> dict[str, Any] | None:
        rems = kind.remediations(ns)
        return rems[0] if rems and rems[0]["status"].get("phase") == "Resolved" else None

    rem = wait_until(resolved, timeout=60, what="the pod's Remediation Resolved")
    assert rem["spec"]["podUID"] == uid
    assert [a["action"] for a in rem["status"].get("actions", [])] == ["observe"], rem["status"]
    announced = [e for e in kind.events(ns) if e["reason"] == "StuckCNITeardownFailed"]
    assert announced and cni_plugin.TYPE in announced[0]["message"], announced
    # the worker's network as it was: no plugin left, the node's own conflist first again
    assert cni_plugin.node_conflist(node)[0] != cni_plugin.CONFLIST_NAME
    assert not podman("exec", node, "ls", cni_plugin.BINARY, check=False).strip()
