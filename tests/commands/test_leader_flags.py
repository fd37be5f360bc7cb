"""`unstick controller`'s leader election flags: bad values are one line naming the flag,
exit 2 (the real entry point, before any API server is needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unstick.commands.controller import parse_duration

VENV_BIN = Path(sys.executable).parent


def test_durations_read_as_client_go_writes_them() -> None:
    assert parse_duration("15s") == 15.0
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1m") == 60.0
    assert parse_duration("7") == 7.0
    assert parse_duration("soon") is None
    assert parse_duration("-3s") is None


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--leader-elect-lease-duration", "soon"], "--leader-elect-lease-duration 'soon'"),
        (["--leader-elect-renew-deadline", "20s"], "shorter than the lease duration"),
        (["--leader-elect-retry-period", "9s"], "shorter than the renew deadline"),
        (["--leader-elect-retry-period", "0s"], "--leader-elect-retry-period '0s'"),
    ],
)
def test_bad_election_flags_are_one_line(tmp_path: Path, flags: list[str], said: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    out = subprocess.run(
        [str(VENV_BIN / "unstick"), "controller", "--kubeconfig", str(kubeconfig), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], out.stderr


def test_help_names_the_election_flags() -> None:
    out = subprocess.run(
        [str(VENV_BIN / "unstick"), "controller", "--help"], capture_output=True, text=True
    )
    for flag in (
        "--leader-elect",
        "--no-leader-elect",
        "--standalone",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-lease-name",
        "--leader-elect-lease-namespace",
    ):
        assert flag in out.stdout
    assert "--peering" not in out.stdout
