"""restart-kubelet: run the configured host command, at most once per node per
`restart_kubelet_min_interval_s` (default one hour).

The time of the last attempt is kept in `<state_dir>/last-kubelet-restart` (RFC3339) so
the limit survives an agent restart, and in memory when the state dir is not writable.
An attempt counts whether or not the command succeeded.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime

from unstick.agent.refused import Refused
from unstick.agent.settings import AgentSettings

_STATE_FILE = "last-kubelet-restart"
_last_in_memory: dict[str, datetime] = {}


def _last(settings: AgentSettings) -> datetime | None:
    path = os.path.join(settings.state_dir, _STATE_FILE)
    times = [t for t in [_last_in_memory.get(settings.node_name)] if t]
    try:
        with open(path, encoding="utf-8") as f:
            times.append(datetime.fromisoformat(f.read().strip().replace("Z", "+00:00")))
    except (OSError, ValueError):
        pass
    return max(times) if times else None


def _record(settings: AgentSettings, now: datetime) -> None:
    _last_in_memory[settings.node_name] = now
    try:
        os.makedirs(settings.state_dir, exist_ok=True)
        with open(os.path.join(settings.state_dir, _STATE_FILE), "w", encoding="utf-8") as f:
            f.write(now.isoformat())
    except OSError:
        pass  # the in-memory record still limits this agent process


def restart_kubelet(settings: AgentSettings, now: datetime, dry_run: bool) -> str:
    """Run the restart command; raises Refused when too soon."""
    last = _last(settings)
    if last is not None and (now - last).total_seconds() < settings.restart_kubelet_min_interval_s:
        raise Refused(f"the kubelet was restarted at {last.isoformat()}: at most once per hour")
    command = list(settings.restart_kubelet_command)
    if dry_run:
        return "would run: " + " ".join(command)
    _record(settings, now)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[:500]}")
    return "ran: " + " ".join(command)
