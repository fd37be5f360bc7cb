"""What keeps a pod's processes from dying, as the probe reports it: its tasks in
uninterruptible sleep (`dTasks`) and its frozen cgroups (`frozenCgroups`, both read by
`unstick.core.model.probe`; an older probe has neither: nothing reported) — the evidence
sentences a person can check on the node, which cgroups are the pod's, and the safety
predicate of the `thaw` step.
"""

from __future__ import annotations

import re

from unstick.core.model.probe import DTask, FrozenCgroup
from unstick.core.verdict import SAFE, Verdict, refuse

MAX_NAMED = 3


def _container(cid: str) -> str:
    return f"container {cid}" if cid else "the pod's own cgroup"


def d_task_words(tasks: tuple[DTask, ...]) -> str:
    """`container abc cannot be killed: pid 123 (dd) in uninterruptible sleep on
    `nfs_wait_bit_killable`` — at most MAX_NAMED tasks, then how many more."""
    words = []
    for t in tasks[:MAX_NAMED]:
        on = f" on `{t.wchan}`" if t.wchan else ""
        words.append(
            f"{_container(t.container)} cannot be killed: pid {t.pid} ({t.comm}) "
            f"in uninterruptible sleep{on}"
        )
    if len(tasks) > MAX_NAMED:
        words.append(f"and {len(tasks) - MAX_NAMED} more in state D")
    return "; ".join(words)


def stack_words(t: DTask) -> str:
    return f"pid {t.pid} ({t.comm}) kernel stack: " + " ← ".join(t.stack)


def frozen_words(c: FrozenCgroup) -> str:
    how = "cgroup v1 freezer" if c.version == "v1" else "cgroup v2 cgroup.freeze"
    own = {True: "frozen itself", False: "frozen through a frozen parent", None: ""}[c.self_frozen]
    detail = ", ".join(w for w in (how, own) if w)
    return (
        f"cgroup {c.path} ({_container(c.container)}) is {c.state} ({detail}): its processes "
        "cannot run, so the runtime cannot stop them until it is thawed"
    )


def pod_cgroup_component(uid: str) -> re.Pattern[str]:
    """The cgroup path component naming pod `uid`: `pod<uid>` (cgroupfs driver) or
    `kubepods[-<qos>]-pod<uid with _>.slice` (systemd driver)."""
    dashed, underscored = re.escape(uid), re.escape(uid.replace("-", "_"))
    return re.compile(rf"^(pod{dashed}|kubepods(-[a-z]+)?-pod{underscored}\.slice)$")


#: a component naming some pod (any UID): the first such component of a path is its pod's
_ANY_POD = re.compile(
    r"^(pod[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"|kubepods(-[a-z]+)?-pod[0-9a-fA-F]{8}(_[0-9a-fA-F]{4}){3}_[0-9a-fA-F]{12}\.slice)$"
)


def is_pod_cgroup(path: str, uid: str) -> bool:
    """`path` is an absolute, normal cgroup path at or below a component naming the pod,
    and no component above that one names another pod (a cgroup named `pod<uid>` made
    inside another pod's cgroup — by a privileged container with its cgroups writable —
    is that other pod's, never this one's)."""
    parts = path.split("/")
    if not uid or parts[0] != "" or any(p in ("", ".", "..") for p in parts[1:]):
        return False
    pattern = pod_cgroup_component(uid)
    for p in parts[1:]:
        if pattern.match(p):
            return True
        if _ANY_POD.match(p):
            return False  # another pod's cgroup comes first
    return False


def thaw_safe(path: str, uid: str, frozen: tuple[FrozenCgroup, ...]) -> Verdict:
    """`thaw`: only a cgroup of this pod that the fresh probe reports frozen itself (one
    frozen only through its parent thaws with the parent)."""
    if not is_pod_cgroup(path, uid):
        return refuse(f"{path} is not a cgroup of pod {uid}")
    found = next((c for c in frozen if c.path == path), None)
    if found is None:
        return refuse(f"{path} is not among the pod's frozen cgroups")
    if found.self_frozen is False:
        return refuse(f"{path} is frozen only through its parent")
    return SAFE
