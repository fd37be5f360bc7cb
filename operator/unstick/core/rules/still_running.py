"""What of a pod still runs on its node (rule 4 of docs/design.md §2, and the evidence rules
3a/3b share): its running containers from the node's runtime or pod.status, its tasks left
in uninterruptible sleep, and what the runtime says of them. Pure: read from the Facts and
the probe, written as Evidence."""

from __future__ import annotations

from unstick.core.durations import human
from unstick.core.evidence import Evidence
from unstick.core.model.facts import Facts
from unstick.core.model.node_facts import RUNNING
from unstick.core.model.probe import Probe
from unstick.core.rules.pod_tasks import d_task_words, stack_words


def api_running(facts: Facts) -> tuple[str, ...]:
    """The running containers per pod.status: init, regular and ephemeral (`kubectl
    debug`) ones alike — a debug container still running keeps the pod's volumes in use."""
    return tuple(
        ("init container " if c.init else "ephemeral container " if c.ephemeral else "container ")
        + c.name
        for c in facts.pod.container_statuses
        if c.state == RUNNING
    )


def running_containers(
    probe: Probe | None,
    on_node: tuple[tuple[str, str], ...] | None,
    api_running: tuple[str, ...],
    ev: list[Evidence],
) -> tuple[str, ...]:
    """Rule 4: the running containers, from the node where its runtime answered, else from
    the API (plus whatever the node saw running: a running container is a positive fact)."""
    if probe is None or on_node is None:
        running, source = api_running, "pod.status"
    else:
        seen = tuple(f"container {n}" for n, state in on_node if state == RUNNING)
        if probe.runtime_answered or (probe.runtime is None and not api_running):
            running, source = seen, "the node's container runtime"
            if api_running and not running:
                ev.append(
                    Evidence(
                        "container",
                        f"API status says {', '.join(api_running)} running, but the node's "
                        "runtime shows none running (the kubelet has not updated the status)",
                    )
                )
        else:
            names = {n for n, state in on_node if state == RUNNING}
            running = seen + tuple(c for c in api_running if c.rsplit(" ", 1)[-1] not in names)
            source = "the node and pod.status (the probe does not show that its runtime answered)"
    if running:
        ev.append(Evidence("container", f"{', '.join(running)} still running per {source}"))
    return running


def left_tasks(probe: Probe | None, ev: list[Evidence]) -> tuple[str, ...]:
    """Tasks of the pod in D state when the runtime lists no running container: a process
    of the pod is still on the node (its container's stop did not end it), so something of
    the pod is left — never "nothing left" (safety invariant 3), whatever the runtime says."""
    if probe is None or not probe.d_tasks:
        return ()
    left = tuple(
        dict.fromkeys(
            f"container {t.container}" if t.container else "the pod's own cgroup"
            for t in probe.d_tasks
        )
    )
    ev.append(
        Evidence(
            "container",
            f"tasks of {', '.join(left)} still on the node in uninterruptible sleep, "
            "though the runtime lists no running container",
        )
    )
    return left


def stuck_tasks(probe: Probe | None) -> list[Evidence]:
    """The pod's tasks in uninterruptible sleep, as the probe saw them (no signal reaches
    them: the thing they wait on coming back, or a reboot of the node, ends them)."""
    if probe is None or not probe.d_tasks:
        return []
    out = [Evidence("task", d_task_words(probe.d_tasks))]
    out.extend(Evidence("task", stack_words(t)) for t in probe.d_tasks[:3] if t.stack)
    return out


def runtime_evidence(facts: Facts, probe: Probe | None, ev: list[Evidence]) -> None:
    """What the runtime says of each running container and for how long it has outlived the
    deletion deadline (containerd#6080: a container StopContainer cannot kill)."""
    deadline = facts.pod.deletion_timestamp
    past = human((facts.now - deadline).total_seconds()) if deadline else None
    seen = [
        c
        for c in (probe.containers or () if probe is not None else ())
        if c.pod_uid == facts.pod.uid and c.state == RUNNING
    ]
    for c in seen[:5]:
        words = [f"container {c.name}: running"]
        if c.runtime_state:
            words.append(f"by its processes, though the runtime says {c.runtime_state}")
        if c.created_at is not None:
            words.append(f"(created {human((facts.now - c.created_at).total_seconds())} ago)")
        if past:
            words.append(f"— {past} past the deletion deadline: StopContainer has not ended it")
        ev.append(Evidence("runtime", " ".join(words)))
    if not seen and past:
        ev.append(Evidence("runtime", f"still running {past} past the deletion deadline"))
