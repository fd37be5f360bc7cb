"""Issue #25: the FailedKillPod message exactly as a real kubelet (v1.36) over containerd
1.6.20 and libcni wrote it in the kind suite (tests/kind/test_cni.py, its test plugin
`unstick-cnifail` failing DEL) → the plugin, the sandbox and the plugin's error (libcni's
`msg; details`), in plain words."""

from __future__ import annotations

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


def test_the_real_kubelets_words_name_the_plugin_sandbox_and_error() -> None:
    b = bundle(the_pod=pod(statuses=[("c", "terminated")]))
    b["events"] = [kill_pod_event(UID, "2026-11-20T09:50:00Z", 2) | {"message": REAL}]
    facts = parse_bundle(b)
    failure = teardown_failure(facts.pod, facts.events)
    assert failure is not None
    assert (failure.plugin, failure.network, failure.sandbox) == ("unstick-cnifail", "", SANDBOX)
    assert failure.error == ERROR
    assert failure_words(failure) == (
        f"the kubelet cannot remove the pod's sandbox {SANDBOX}: CNI plugin unstick-cnifail "
        f"fails to delete its network (2 times): {ERROR}"
    )
    assert diagnose(facts).cause is Cause.CNITeardownFailed
