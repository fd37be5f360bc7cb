"""The node actions of design.md §3: `Executor.run_step` runs one by its name. Each action
is a module of its own beside this one, with a `run(checks, uid, target, dry_run)` that
re-checks its own preconditions right before it acts; the checks they share, and the
state those read (the mount table, the holder scans, the CSI volume locks), are one
`Checks` (agent/steps/checks.py) that the executor holds and hands to each.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from unstick.agent.probe.mount_table import MountWatch
from unstick.agent.probe.plugins import Plugin
from unstick.agent.settings import AgentSettings
from unstick.agent.steps import (
    lazy_unmount,
    replay_unpublish,
    restart_kubelet,
    rmdir_stale,
    thaw,
    unmount,
)
from unstick.agent.steps.checks import Checks, Refused
from unstick.core.model.kubelet_paths import pod_dir
from unstick.core.remediation import rfc3339
from unstick.core.vocabulary import Action

log = logging.getLogger(__name__)

SUCCEEDED, FAILED, REFUSED, DRY_RUN = "succeeded", "failed", "refused", "dry_run"


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one node step did: the `status.nodeActions` entry."""

    action: str
    target: str
    result: str
    message: str
    time: str

    def to_json(self) -> dict[str, str]:
        return {
            "action": self.action,
            "target": self.target,
            "result": self.result,
            "message": self.message,
            "time": self.time,
        }


class Step(Protocol):
    """A node action: what it did, in words; raises Refused when a precondition does not
    hold (nothing changed), anything else when the act failed."""

    def __call__(self, checks: Checks, uid: str, target: str, dry_run: bool, /) -> str: ...


#: a node action's name (core/vocabulary.py) -> its step (a module each)
STEPS: dict[str, Step] = {
    Action.REPLAY_UNPUBLISH: replay_unpublish.run,
    Action.UNMOUNT: unmount.run,
    Action.RMDIR_STALE: rmdir_stale.run,
    Action.RESTART_KUBELET: restart_kubelet.run,
    Action.THAW: thaw.run,
    Action.LAZY_UNMOUNT: lazy_unmount.run,
}


class Executor:
    """Runs node steps for pods of this node: dispatches an action name to its step, with
    the checks it holds."""

    def __init__(
        self,
        settings: AgentSettings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        plugins: Callable[[], dict[str, Plugin]] | None = None,
        mounts: MountWatch | None = None,
    ) -> None:
        self.checks = Checks(settings, clock, plugins, mounts)

    def run_step(
        self, uid: str, action: str, target: str = "", *, dry_run: bool, lazy_unmount: bool
    ) -> StepResult:
        """Run one node step; never raises for a bad step or a failed precondition.
        `lazy_unmount`: the `unmount` step may fall back to MNT_DETACH (its module says
        when)."""
        step = STEPS.get(action)
        if step is None:
            return self._result(action, target, REFUSED, f"{action!r} is not a node action")
        if action == Action.UNMOUNT:
            step = functools.partial(unmount.run, lazy=lazy_unmount)
        checks = self.checks
        try:
            pod_dir(checks.root, uid)
        except ValueError as exc:
            return self._result(action, target, REFUSED, str(exc))
        checks.start_step()
        try:
            message = step(checks, uid, target, dry_run) + checks.acts.summary()
        except Refused as exc:
            return self._result(action, target, REFUSED, str(exc))
        except Exception as exc:  # the step failed; report, never crash the agent
            log.exception("%s failed", action)
            return self._result(action, target, FAILED, f"{type(exc).__name__}: {exc}")
        return self._result(action, target, DRY_RUN if dry_run else SUCCEEDED, message)

    def _result(self, action: str, target: str, result: str, message: str) -> StepResult:
        log.info("%s %s: %s — %s", action, target or "(pod)", result, message)
        return StepResult(action, target, result, message, rfc3339(self.checks.clock()))
