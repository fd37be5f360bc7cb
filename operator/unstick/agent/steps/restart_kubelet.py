"""restart-kubelet: ask the host's service manager to restart the kubelet, at most once per
node per `restart_kubelet_min_interval_s` (default one hour).

How (docs/agent.md, "Restarting a kubelet that is not a systemd unit"):
- `--restart-kubelet-command` configured: that command, run from the agent's container as
  given. A program of the host is run through `nsenter` into PID 1's namespaces (as the
  default below is).
- none configured: the systemd unit `kubelet` (`systemctl restart kubelet` in PID 1's
  namespaces), but only where PID 1 is systemd and knows a unit named kubelet.

Refused before anything runs (a refusal is on record, costs no attempt, and the agent never
falls back to killing processes by name): no command configured and no systemd unit named
kubelet; a configured program that is missing — the agent's own (`$PATH`), or, after
`nsenter --target N --mount`, the host's (looked up in `<host-proc>/N/root`).

The time of the last attempt is kept in `<state_dir>/last-kubelet-restart` (RFC3339) so
the limit survives an agent restart — and a crash or power cut right after: it is written
to a new file, fsynced, renamed over the old one and the directory fsynced, all before the
command runs (record before act; a crash-looping agent forgets its memory). When it cannot
be written the restart is refused. An attempt counts whether or not the command succeeded.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from unstick.agent.settings import DEFAULT_RESTART_KUBELET, HOST_NAMESPACES, AgentSettings
from unstick.agent.steps.checks import Checks, Refused

_STATE_FILE = "last-kubelet-restart"
_last_in_memory: dict[str, datetime] = {}
SYSTEMD_UNIT = "kubelet.service"
# Where a program named without a path is looked for on the host (nsenter's child gets
# the agent's $PATH, which in the image is this list).
HOST_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
NEVER_BY_NAME = "the agent does not kill processes by name"


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
    """The attempt on disk, durably, before it is made: a new file written and fsynced,
    renamed over the old one (never a torn or empty record), the directory fsynced (the
    rename is an entry of it). Refused when it cannot be written."""
    path = os.path.join(settings.state_dir, _STATE_FILE)
    tmp = f"{path}.tmp"
    try:
        os.makedirs(settings.state_dir, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, now.isoformat().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(settings.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise Refused(
            f"cannot record the attempt in {path} ({exc}): not restarting the kubelet (a "
            "restarted agent would not know it was restarted)"
        ) from None
    _last_in_memory[settings.node_name] = now


# --- where the command's program is ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NsenterCall:
    """What an `nsenter` command line enters and runs."""

    target: str | None  # --target PID, as written
    mount: bool  # enters the target's mount namespace (--mount / -m)
    program: str | None


_SHORT_WITH_VALUE = "tSGrw"  # -t PID, -S UID, -G GID; -r/-w only attached (-r/dir)
_LONG_WITH_VALUE = ("target", "setuid", "setgid")


def _short(letters: str, following: str | None) -> tuple[str | None, bool, bool]:
    """(target, mount, consumed the next word) of one `-abc` word of nsenter options."""
    target, mount = None, False
    for j, ch in enumerate(letters):
        mount = mount or ch == "m"
        if ch in _SHORT_WITH_VALUE:
            rest = letters[j + 1 :]
            if ch == "t":
                target = rest or following
            return target, mount, not rest and ch in "tSG"
    return target, mount, False


def parse_nsenter(argv: Sequence[str]) -> NsenterCall:
    """The target, mount namespace and program of `nsenter [options] [--] program ...`."""
    target, mount, i = None, False, 1
    while i < len(argv):
        arg, following = argv[i], (argv[i + 1] if i + 1 < len(argv) else None)
        if arg == "--":
            i += 1
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            mount = mount or name == "mount"
            if name in _LONG_WITH_VALUE and not eq:
                value, i = following or "", i + 1
            target = value if name == "target" else target
        elif arg.startswith("-") and len(arg) > 1:
            t, m, consumed = _short(arg[1:], following)
            target, mount, i = t or target, mount or m, i + int(consumed)
        else:
            break
        i += 1
    return NsenterCall(target, mount, argv[i] if i < len(argv) else None)


def _present_in(root: str, program: str) -> bool:
    """An executable file (or a symlink: its target is resolved on the host, not here) named
    `program` under `root`, looked up in HOST_PATH when it has no slash."""
    names = [program] if "/" in program else [f"{d}/{program}" for d in HOST_PATH]
    for name in names:
        try:
            st = os.lstat(os.path.join(root, name.lstrip("/")))
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_mode & 0o111):
            return True
    return False


def check_command(settings: AgentSettings, argv: Sequence[str]) -> None:
    """Refused when the command's program is missing where it would run."""
    if not argv:
        raise Refused("the restart command is empty")
    if shutil.which(argv[0]) is None:
        raise Refused(f"restart command {argv[0]!r} not found in the agent's container")
    if os.path.basename(argv[0]) != "nsenter":
        return
    call = parse_nsenter(argv)
    if call.program is None:
        raise Refused(f"restart command {' '.join(argv)!r} names no program for nsenter to run")
    if not (call.mount and call.target and call.target.isdigit()):
        if call.mount:  # a namespace file or no target: the agent cannot tell where
            return
        if shutil.which(call.program) is None:
            raise Refused(f"restart command {call.program!r} not found in the agent's container")
        return
    root = os.path.join(settings.host_proc, call.target, "root")
    if not _present_in(root, call.program):
        raise Refused(
            f"restart command {call.program!r} not found on the host (looked in {root}"
            f"{'' if '/' in call.program else ' under ' + ':'.join(HOST_PATH)}): "
            f"not restarting the kubelet; {NEVER_BY_NAME}"
        )


def check_systemd_unit(settings: AgentSettings) -> None:
    """No command configured: only a kubelet that is a systemd unit on the host."""
    try:
        with open(os.path.join(settings.host_proc, "1", "comm"), encoding="utf-8") as f:
            init = f.read().strip()
    except OSError as exc:
        raise Refused(f"cannot tell what runs the host's PID 1: {exc}") from None
    if init != "systemd":
        raise Refused(
            "no --restart-kubelet-command configured and the host's PID 1 is "
            f"{init!r}, not systemd: no systemd unit named kubelet to restart; "
            f"configure the command that restarts this host's kubelet; {NEVER_BY_NAME}"
        )
    show = [*HOST_NAMESPACES, "systemctl", "show", "--property=LoadState", "--value", SYSTEMD_UNIT]
    try:
        done = subprocess.run(show, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Refused(f"cannot ask systemd about {SYSTEMD_UNIT}: {exc}") from None
    state = done.stdout.strip() or done.stderr.strip()[:200]
    if done.returncode != 0 or state != "loaded":
        raise Refused(
            "no --restart-kubelet-command configured and systemd on the host has no unit "
            f"named kubelet (LoadState: {state or 'unknown'}); {NEVER_BY_NAME}"
        )


# --- the action ------------------------------------------------------------------------


def run(checks: Checks, uid: str, target: str, dry_run: bool) -> str:
    """Restart the kubelet with the configured host command, at most once an hour.
    The target is empty or this node's name."""
    settings = checks.settings
    if target not in ("", settings.node_name):
        raise Refused(f"target {target!r} is not this node ({settings.node_name})")
    return restart_kubelet(settings, checks.clock(), dry_run)


def restart_kubelet(settings: AgentSettings, now: datetime, dry_run: bool) -> str:
    """Run the restart command; raises Refused when too soon or when the agent cannot tell
    how this host's kubelet is restarted."""
    last = _last(settings)
    if last is not None and (now - last).total_seconds() < settings.restart_kubelet_min_interval_s:
        raise Refused(f"the kubelet was restarted at {last.isoformat()}: at most once per hour")
    command = list(settings.restart_kubelet_command)
    if command:
        check_command(settings, command)
    else:
        check_systemd_unit(settings)
        command = list(DEFAULT_RESTART_KUBELET)
    if dry_run:
        return "would run: " + " ".join(command)
    _record(settings, now)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[:500]}")
    said = done.stdout.strip().splitlines()
    return "ran: " + " ".join(command) + (f" ({said[-1][:300]})" if said else "")
