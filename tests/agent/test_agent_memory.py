"""The agent's malloc settings (agent/memory.py, issue 23 fifth round): set where the C
library is glibc, an operator's own setting left alone, and what they are for — big
buffers freed between live blocks go back to the kernel instead of staying resident.

Each case runs in a fresh interpreter: the settings belong to a process's allocator, and
the test process's own must not change.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not Path("/proc/self/statm").exists(),
    reason="glibc's mallopt and Linux's /proc",
)

# The agent's pattern in a burst: a big buffer (a mount table text of ~5,000 mounts, a
# 5,000-entry set of a parse) made and dropped again and again while small blocks made in
# between stay alive. Prints the resident growth (MiB) that outlives the big buffers.
SCENARIO = textwrap.dedent(
    """
    import json, sys
    from unstick.agent.memory import tune_malloc

    applied = tune_malloc() if sys.argv[1] == "tuned" else {}
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    big = 700 * 1024
    first = b"x" * big
    del first  # untuned, glibc now takes every block up to this size from its heap
    before = rss()
    held, kept = [], []
    for _ in range(64):
        held.append(b"x" * big)  # ~44 MiB written
        kept.append(b"k" * 32768)  # stays (2 MiB in all): a glibc block after each
    del held
    print(json.dumps({"applied": applied, "kept_mib": (rss() - before) / 2**20}))
    """
)


def _run(mode: str, env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO, mode],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


BOTH = {"arena_max": 2, "mmap_threshold": 128 * 1024}


def test_freed_big_buffers_go_back_to_the_kernel() -> None:
    untuned = _run("untuned")
    tuned = _run("tuned")
    assert tuned["applied"] == BOTH
    # the mechanism is real here: without the settings the freed buffers stay resident;
    # with them only the small blocks kept (2 MiB) remain
    assert float(untuned["kept_mib"]) > 30, untuned  # type: ignore[arg-type]
    assert float(tuned["kept_mib"]) < 5, tuned  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "applied"),
    [
        ({"MALLOC_ARENA_MAX": "4"}, {"mmap_threshold": 128 * 1024}),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, {"arena_max": 2}),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=65536"}, {}),
        ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}, BOTH),
    ],
)
def test_an_operators_own_setting_wins(env: dict[str, str], applied: dict[str, int]) -> None:
    assert _run("tuned", env)["applied"] == applied
