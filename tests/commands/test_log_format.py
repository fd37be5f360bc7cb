"""`--log-format json` and `--log-level` of the two long-running commands: the controller
against a real kube-apiserver writes only JSON lines in Kopf's format (message, timestamp,
severity), at the level asked; the agent's JSON (python-json-logger) has the same keys and
the logger's name."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.controller import Controller, crds_installed

VENV_BIN = Path(sys.executable).parent


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    records = []
    for line in lines:
        try:  # every line: a JSON object, no plain-text line among them
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\n{text[-3000:]}")
        assert {"message", "timestamp", "severity"} <= set(record), record
        records.append(record)
    return records


@pytest.fixture
def crds(control_plane: ControlPlane) -> Iterator[None]:
    with crds_installed(control_plane):
        yield


@pytest.mark.envtest
@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_the_controller_logs_kopfs_json_at_the_level_asked(
    control_plane: ControlPlane, crds: None, tmp_path: Path, level: str
) -> None:
    ctl = Controller(
        control_plane, tmp_path / "controller.log",
        extra_args=("--log-format", "json", "--log-level", level),
    )  # fmt: skip
    try:
        ctl.start()  # returns once the pod watcher logged its first list
    finally:
        ctl.stop()
    records = json_lines(ctl.log())
    assert any(r["message"].startswith("pod list:") for r in records)
    severities = {r["severity"] for r in records}
    assert ("debug" in severities) is (level == "DEBUG"), severities


def test_the_agent_json_has_the_same_keys_and_the_logger() -> None:
    script = (
        "import logging; from unstick.commands import logs; logs.setup('json', 'INFO');"
        "log = logging.getLogger('unstick.agent.loop');"
        "log.debug('hidden'); log.info('probe %s', 'done', extra={'node': 'n1'});"
        "log.warning('careful')"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    info, warning = json_lines(out.stderr)
    assert info["message"] == "probe done" and info["severity"] == "info"
    assert info["logger"] == "unstick.agent.loop" and info["node"] == "n1"
    assert warning["severity"] == "warn"


@pytest.mark.parametrize("command", ["controller", "agent"])
def test_both_commands_take_the_flags(command: str) -> None:
    bad = subprocess.run(
        [str(VENV_BIN / "unstick"), command, "--log-format", "xml"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--log-format: invalid choice: 'xml'" in bad.stderr and len(bad.stderr.splitlines()) == 1
    helped = subprocess.run(
        [str(VENV_BIN / "unstick"), command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--log-format {text,json}" in helped.stdout
    assert "--log-level {DEBUG,INFO,WARNING,ERROR}" in helped.stdout
