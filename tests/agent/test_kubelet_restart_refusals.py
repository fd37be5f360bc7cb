"""restart-kubelet where the agent cannot tell how the host's kubelet is restarted: refused
with the reason on record, nothing run, no attempt counted (docs/agent.md, "Restarting a
kubelet that is not a systemd unit").

The "host" is a real PID namespace (`unshare --pid --fork --mount-proc`) whose PID 1 is
`sleep`, not systemd; the agent sees it as it sees a node, through its /proc
(`--host-proc`: `/proc/<its pid 1>/root/proc`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devcluster.process import wait_until
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.agent.steps.restart_kubelet import parse_nsenter

UID = "dddddddd-4444-4444-8444-dddddddddddd"
NOW = datetime(2026, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare (a PID namespace of its own)",
)


@pytest.fixture
def host_proc() -> Iterator[str]:
    """The /proc of a host whose PID 1 is `sleep`."""
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "600"],
        stdin=subprocess.DEVNULL,
    )
    try:
        children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
        init = wait_until(
            lambda: next(iter(children.read_text().split()), None), timeout=10, what="the init"
        )
        proc = f"/proc/{init}/root/proc"
        wait_until(lambda: _comm(proc) == "sleep", timeout=10, what="the host's /proc")
        yield proc
    finally:
        unshare.kill()
        unshare.wait()


def _comm(proc: str) -> str:
    try:
        return Path(proc, "1", "comm").read_text().strip()
    except OSError:
        return ""


def settings(tmp_path: Path, host_proc: str, *command: str) -> AgentSettings:
    return AgentSettings(
        node_name=f"node-{uuid.uuid4().hex[:6]}",
        host_proc=host_proc,
        kubelet_root=str(tmp_path / "kubelet"),
        state_dir=str(tmp_path / "state"),
        restart_kubelet_command=command,
    )


def restart(s: AgentSettings, dry_run: bool = False) -> tuple[str, str]:
    step = Executor(s, clock=lambda: NOW).run_step(
        UID, "restart-kubelet", "", dry_run=dry_run, lazy_unmount=False
    )
    return step.result, step.message


def test_no_command_and_no_systemd_is_refused(tmp_path: Path, host_proc: str) -> None:
    s = settings(tmp_path, host_proc)
    for dry_run in (True, False):
        result, message = restart(s, dry_run)
        assert result == "refused", message
        assert "PID 1 is 'sleep', not systemd" in message, message
        assert "does not kill processes by name" in message, message
    assert not (tmp_path / "state").exists(), "a refusal counted as a restart attempt"


def test_a_command_missing_on_the_host_is_refused(tmp_path: Path, host_proc: str) -> None:
    missing = tmp_path / "no-such" / "restart-kubelet"
    s = settings(tmp_path, host_proc, "nsenter", "-t", "1", "-m", "-p", "--", str(missing))
    result, message = restart(s)
    assert result == "refused", message
    assert f"{str(missing)!r} not found on the host" in message, message
    assert f"{host_proc}/1/root" in message, message
    by_name = settings(tmp_path, host_proc, "nsenter", "--target=1", "--mount", "no-such-restart")
    result, message = restart(by_name)
    assert result == "refused" and "'no-such-restart' not found on the host" in message, message
    assert not (tmp_path / "state").exists(), "a refusal counted as a restart attempt"


def test_a_command_missing_in_the_agent_is_refused(tmp_path: Path, host_proc: str) -> None:
    s = settings(tmp_path, host_proc, "no-such-service-manager", "restart", "kubelet")
    result, message = restart(s)
    assert result == "refused", message
    assert "'no-such-service-manager' not found in the agent's container" in message


def test_a_present_host_command_runs_after_refusals(tmp_path: Path, host_proc: str) -> None:
    """Refusals cost no attempt: a command that is there still runs (once an hour)."""
    script = tmp_path / "restart-kubelet"
    script.write_text("#!/bin/sh\necho restarted\n")
    script.chmod(0o755)
    host = settings(tmp_path, host_proc, "nsenter", "-t", "1", "-m", "--", str(script))
    result, message = restart(host, dry_run=True)
    assert result == "dry_run" and message.endswith(str(script)), message
    assert restart(settings(tmp_path, host_proc))[0] == "refused"
    local = AgentSettings(
        node_name=host.node_name,
        host_proc=host_proc,
        state_dir=host.state_dir,
        restart_kubelet_command=(str(script),),
    )
    assert restart(local) == ("succeeded", f"ran: {script} (restarted)")
    result, message = restart(local)
    assert result == "refused" and "at most once per hour" in message, message


def test_nsenter_command_lines() -> None:
    cases = {
        "nsenter -t 1 -m -u -i -n -p -- systemctl restart kubelet": ("1", True, "systemctl"),
        "nsenter -t1 -mp /opt/restart": ("1", True, "/opt/restart"),
        "nsenter --target=1 --mount -- /x": ("1", True, "/x"),
        "nsenter --target 7 -S 0 -m sh -c x": ("7", True, "sh"),
        "nsenter -t 1 -p -- restart": ("1", False, "restart"),
    }
    for line, (target, mount, program) in cases.items():
        call = parse_nsenter(line.split())
        assert (call.target, call.mount, call.program) == (target, mount, program), line
