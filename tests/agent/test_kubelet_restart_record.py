"""The kubelet-restart limit is recorded durably before the restart (#33 finding 8a).

A power cut cannot be simulated, so this checks the order of the calls on a real file:
os.fsync and the restart command are recorded as they happen (the real calls are made),
and the time of the attempt must be in the file, that file fsynced, and its directory
fsynced (the file's name is a directory entry), before the command runs. A state dir the
record cannot be written to refuses the restart: an agent that crash-loops forgets its
memory, and would restart the kubelet once per life."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import unstick.agent.steps.restart_kubelet as restart_module
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor

UID = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa"
NOW = datetime(2026, 11, 28, 4, 0, tzinfo=UTC)


def _step(settings: AgentSettings) -> Any:
    ex = Executor(settings, clock=lambda: NOW)
    return ex.run_step(UID, "restart-kubelet", "", dry_run=False, lazy_unmount=False)


def test_the_attempt_is_on_disk_before_the_kubelet_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    record = state / "last-kubelet-restart"
    events: list[tuple[str, str]] = []
    real_fsync, real_run = os.fsync, subprocess.run

    def fsync(fd: int) -> None:
        events.append(("fsync", str(Path(f"/proc/self/fd/{fd}").readlink())))
        real_fsync(fd)

    def run(cmd: Any, *args: Any, **kw: Any) -> Any:
        events.append(("run", record.read_text() if record.exists() else ""))
        return real_run(cmd, *args, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(restart_module.subprocess, "run", run)
    settings = AgentSettings(
        node_name=f"n-{uuid.uuid4().hex[:6]}",
        state_dir=str(state),
        restart_kubelet_command=("true",),
    )
    assert _step(settings).result == "succeeded"
    ran = events.index(("run", NOW.isoformat()))  # the time is in the file when it runs
    synced = [path for what, path in events[:ran] if what == "fsync"]
    assert str(state) in synced, events  # the directory, with the file's entry
    files = [p for p in synced if p != str(state)]
    assert files and all(Path(p).parent == state for p in files), events
    assert not [p for p in state.iterdir() if p != record], "a temporary file was left"


def test_a_record_that_cannot_be_written_refuses_the_restart(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # the state dir's path is a file: nothing can be written there
    ran = tmp_path / "ran"
    settings = AgentSettings(
        node_name=f"n-{uuid.uuid4().hex[:6]}",
        state_dir=str(blocked / "state"),
        restart_kubelet_command=("touch", str(ran)),
    )
    result = _step(settings)
    assert result.result == "refused", result
    assert "cannot record" in result.message, result
    assert not ran.exists()
