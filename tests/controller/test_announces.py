"""When a pass posts the pod's Event (controller/deciding/decision.py `announces`): once per
diagnosis, never while the diagnosis waits for the node (its probe, or the kubelet's own
finish after node steps), and when that wait ends."""

from __future__ import annotations

from unstick.controller.deciding.decision import KUBELET_FINISHING, announces
from unstick.core.remediation import Phase

WAITING, OBSERVING = Phase.WaitingForAgent, Phase.Observing

OBSERVED = [{"action": "observe", "result": "succeeded"}]


def test_a_new_cause_is_announced_once() -> None:
    assert announces({}, {"cause": "OrphanedMount"}, "OrphanedMount", waiting=False)
    same = {"cause": "OrphanedMount", "phase": "Remediating"}
    assert not announces(same, same, "OrphanedMount", waiting=False)


def test_nothing_while_the_probe_is_awaited_then_its_cause() -> None:
    waiting = {"cause": "Unknown", "phase": WAITING}
    assert not announces({}, waiting, "Unknown", waiting=True)
    assert not announces(waiting, waiting, "Unknown", waiting=True)
    # the probe answered with the cause the pass had already (ContainersStillRunning)
    after = {"cause": "ContainersStillRunning", "phase": "Observing"}
    before = {"cause": "ContainersStillRunning", "phase": WAITING}
    assert announces(before, after, "ContainersStillRunning", waiting=False)


def test_unknown_once_when_the_first_wait_ends_without_a_probe() -> None:
    waiting = {"cause": "Unknown", "phase": WAITING}
    observing = {"cause": "Unknown", "phase": OBSERVING, "actions": OBSERVED}
    assert announces(waiting, observing, "Unknown", waiting=True)
    # asked again 10 minutes later, and again no probe: not a new Event
    again = {"cause": "Unknown", "phase": WAITING, "actions": OBSERVED}
    assert not announces(again, observing, "Unknown", waiting=True)


def test_kubelet_not_progressing_only_once_the_kubelets_window_is_over() -> None:
    # in the window the record keeps the cause the steps were for (steps_diagnosis)
    steps = {"cause": "OrphanedMount", "phase": "Remediating"}
    window = {"cause": "OrphanedMount", "waitingFor": KUBELET_FINISHING}
    assert not announces(steps, window, "KubeletNotProgressing", waiting=False)
    assert not announces(window, window, "KubeletNotProgressing", waiting=False)
    acting = {"cause": "KubeletNotProgressing", "waitingFor": None}
    assert announces(window, acting, "KubeletNotProgressing", waiting=False)


def test_a_mandates_cause_first_seen_in_the_kubelets_window() -> None:
    """The round trip: no pass saw the agent's plan before its results (the record said
    only WaitingForAgent); the window's record names the agent's cause: announced once."""
    asked = {"cause": "Unknown", "phase": WAITING}
    window = {"cause": "StaleVolumeDirs", "phase": "Remediating", "waitingFor": KUBELET_FINISHING}
    assert announces(asked, window, "KubeletNotProgressing", waiting=False)
    assert not announces(window, window, "KubeletNotProgressing", waiting=False)
