"""A process whose wall clock is off by some seconds: Debian's libfaketime, preloaded
(LD_PRELOAD), shifts what `clock_gettime(CLOCK_REALTIME)`, `gettimeofday` and `time`
return by a fixed offset (FAKETIME="+20s"), so Python's `time.time()` and
`datetime.now()` in that process, and every timestamp it writes, are off — as on a node
whose time sync is broken. The monotonic clocks (CLOCK_MONOTONIC, CLOCK_BOOTTIME) are left
alone (FAKETIME_DONT_FAKE_MONOTONIC): they have no common epoch between machines anyway,
and a skew is a wall clock set wrong, not a clock running at another rate.

libfaketime is installed by `make node-deps` (hack/install-node-deps.sh, as root); where it
is absent the tests that need it are skipped, saying so. Nothing is installed at test
time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

#: libfaketimeMT: the build for processes with threads (the controller has several).
LIBRARY = "faketime/libfaketimeMT.so.1"


def faketime_library() -> str | None:
    """The path of libfaketimeMT.so.1 (Debian's multiarch directory first), None when it
    is not installed."""
    lib = Path("/usr/lib")
    candidates = [*sorted(lib.glob(f"*-linux-gnu/{LIBRARY}")), lib / LIBRARY]
    found = [c for c in candidates if c.is_file()]
    return str(found[0]) if found else None


def skewed_clock_env(offset_s: float) -> dict[str, str]:
    """The environment variables that put a child's wall clock `offset_s` seconds ahead
    (negative: behind) of this machine's; the test is skipped when libfaketime is absent."""
    library = faketime_library()
    if library is None:
        pytest.skip(
            "libfaketime is not installed (make node-deps as root installs it, or "
            "apt-get install libfaketime): a controller's wall clock cannot be set off"
        )
    preload = " ".join(p for p in (library, os.environ.get("LD_PRELOAD", "")) if p)
    return {
        "LD_PRELOAD": preload,
        "FAKETIME": f"{offset_s:+g}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


_PROBE = """
import json, time
from datetime import UTC, datetime
print(json.dumps({
    "time": time.time(),
    "datetime": datetime.now(UTC).timestamp(),
    "monotonic": time.monotonic(),
    "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
}))
"""


def clocks_seen_by_child(env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """How far ahead of this process's clocks a Python child started with `env` reads
    its own — `time.time()`, `datetime.now()`, `time.monotonic()` and CLOCK_BOOTTIME —
    each as the bounds (low, high) the child's run puts on it: what it read minus what
    this process read after the run, and before it."""
    mine: dict[str, Callable[[], float]] = {
        "time": time.time,
        "datetime": time.time,
        "monotonic": time.monotonic,
        "boottime": lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    }
    before = {k: read() for k, read in mine.items()}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    after = {k: read() for k, read in mine.items()}
    seen = json.loads(out)
    return {k: (seen[k] - after[k], seen[k] - before[k]) for k in mine}
