"""Issue #25: the FailedKillPod message exactly as a real kubelet (v1.36) over containerd
1.6.20 and libcni wrote it in the kind suite (tests/kind/test_cni.py, its test plugin
`unstick-cnifail` failing DEL) → the plugin, the sandbox and the plugin's error (libcni's
`msg; details`), in plain words."""

from __future__ import annotations

from typing import Any

from tests.support.bundles import UID, bundle, pod
from tests.support.cni_events import kill_pod_event
from unstick.core.model.snapshot import parse_bundle
from unstick.core.rules.cni import failure_words, teardown_failure
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Cause

SANDBOX = "872d949da5f4d7d90596d4769745901087ca29f23f536d60bfbdeeed511b9521"
ERROR = (
    "unstick-cnifail refuses DEL of pod cnifail-p while /run/unstick-cnifail/fail exists; "
    "a test plugin: remove the file to heal it"
)
# copied from `kubectl get events -o json` of the kind run (only the pod UID replaced)
REAL = (
    'error killing pod: failed to "KillPodSandbox" for "' + UID + '" with KillPodSandboxError: '
    '"rpc error: code = Unknown desc = failed to destroy network for sandbox \\"' + SANDBOX
    + '\\": plugin type=\\"unstick-cnifail\\" failed (delete): ' + ERROR + '"'
)  # fmt: skip


def _failure(message: str, times: int = 3) -> Any:
    """The teardown failure read from a FailedKillPod Event (seen `times` times) with this
    message, of a pod diagnosed CNITeardownFailed."""
    b = bundle(the_pod=pod(statuses=[("c", "terminated")]))
    b["events"] = [kill_pod_event(UID, "2026-11-20T09:50:00Z", times) | {"message": message}]
    facts = parse_bundle(b)
    assert diagnose(facts).cause is Cause.CNITeardownFailed
    return teardown_failure(facts.pod, facts.events)


def _read(failure: Any) -> tuple[str, str, str, str, str]:
    """What a failure names: (plugin, network, sandbox, error, its words)."""
    assert failure is not None
    words = failure_words(failure)
    return (failure.plugin, failure.network, failure.sandbox, failure.error, words)


def test_the_real_kubelets_words_name_the_plugin_sandbox_and_error() -> None:
    assert _read(_failure(REAL, times=2)) == (
        "unstick-cnifail",
        "",
        SANDBOX,
        ERROR,
        f"the kubelet cannot remove the pod's sandbox {SANDBOX}: CNI plugin unstick-cnifail "
        f"fails to delete its network (2 times): {ERROR}",
    )


# CRI-O's words (server/sandbox_network.go: `failed to destroy network for pod sandbox
# %s(%s): %w` with the sandbox's name and id; ocicni: `error removing pod %s_%s from CNI
# network %q: %v`; libcni's `plugin type=%q failed (delete): %w` only when the plugin ran),
# as the kubelet quotes them in FailedKillPod (issue 33 finding 10)
CRIO_SANDBOX = "1e4af534df58a2b0353cd13e220f36e32b99a85c7d0dc9ae0a826f4fa4cd91ac"
CILIUM_ERROR = (
    "unable to connect to Cilium daemon: failed to create cilium agent client after "
    "30.000000 seconds timeout: Get http:///var/run/cilium/cilium.sock/v1/config: dial unix "
    "/var/run/cilium/cilium.sock: connect: no such file or directory"
)


def _crio(rest: str) -> str:
    return (
        'error killing pod: failed to "KillPodSandbox" for "' + UID + '" with '
        'KillPodSandboxError: "rpc error: code = Unknown desc = failed to destroy network for '
        "pod sandbox k8s_app-0_default_" + UID + "_0(" + CRIO_SANDBOX + "): error removing pod "
        'default_app-0 from CNI network \\"cilium\\": ' + rest + '"'
    )


def test_crio_names_the_sandbox_id_and_the_cni_network() -> None:
    assert _read(_failure(_crio(CILIUM_ERROR))) == (
        "",
        "cilium",
        CRIO_SANDBOX,
        CILIUM_ERROR,
        f"the kubelet cannot remove the pod's sandbox {CRIO_SANDBOX}: the CNI plugin (network "
        f"cilium) fails to delete its network (3 times): {CILIUM_ERROR}",
    )


def test_crio_with_libcnis_plugin_words_names_plugin_network_and_sandbox() -> None:
    said = 'plugin type=\\"cilium-cni\\" failed (delete): ' + CILIUM_ERROR
    failure = _failure(_crio(said))
    assert failure is not None
    assert (failure.plugin, failure.network, failure.sandbox) == (
        "cilium-cni",
        "cilium",
        CRIO_SANDBOX,
    )
    assert failure.error == CILIUM_ERROR
