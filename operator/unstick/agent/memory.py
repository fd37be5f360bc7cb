"""The agent's malloc settings (measured: docs/benchmark.md, "agent memory").

With 5,000 host mounts the agent's RSS grew from ~71 MiB after start to 113-131 MiB in a
burst of 100 stuck pods (`bench.nodeside --preset mounts100`, docs/benchmark.md). glibc's
heap grew from 13 to 42 MiB meanwhile, while the blocks in use in it went from 11 to only
17 MiB (`mallinfo2`): ~25 MiB were blocks freed and kept by the allocator, for two reasons:

- **One arena per thread.** glibc gives each thread that allocates while another holds an
  arena its own arena (up to 8 per core); the agent has ~20 threads (16 workers, the watch,
  the summary, HTTP, gRPC's). Memory freed in one arena serves only that arena, so each
  keeps the high-water mark of what its thread had at once.
- **Big buffers stay in the heap.** A block of 128 KiB or more is mmapped and returned to
  the kernel when freed — but glibc raises that threshold to the size of every mmapped
  block freed (up to 32 MiB), so after the first mount table text (~700 KiB with 5,000
  mounts) was freed, every later one, and the 5,000-entry sets and dicts of each parse,
  came from the arenas, where freed blocks between live ones are never returned.

So `unstick agent` sets, before its threads start: at most `ARENA_MAX` arenas (the GIL
serialises most allocations anyway), and a fixed mmap threshold (`MMAP_THRESHOLD`), which
also stops glibc from raising it. Measured: peak RSS 113-131 MiB → 88-90 MiB (glibc's
heap ~16 MiB at the peak, ~1 MiB of it free), the agent's CPU the same. Nothing else
changes: the same reads, parses and checks; only where the allocator puts the bytes.

An operator's own setting wins: `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_` or the
matching `GLIBC_TUNABLES` (`glibc.malloc.arena_max`, `glibc.malloc.mmap_threshold`) in the
agent's environment leave that parameter as glibc read it. Not glibc (musl, another
platform): nothing is set.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

# mallopt(3) parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENA_MAX = 2  # arenas: the main one and one for threads that allocate meanwhile
MMAP_THRESHOLD = 128 * 1024  # glibc's default, but fixed: never raised by a free

# parameter -> (its environment variable, its name in GLIBC_TUNABLES)
_OVERRIDES = {
    M_ARENA_MAX: ("MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
    M_MMAP_THRESHOLD: ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
}


def _set_by_operator(param: int, environ: Mapping[str, str]) -> bool:
    variable, tunable = _OVERRIDES[param]
    tunables = environ.get("GLIBC_TUNABLES", "")
    named = {part.split("=", 1)[0].strip() for part in tunables.split(":")}
    return variable in environ or tunable in named


def tune_malloc(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Set the agent's malloc parameters (module docstring); what was set, by name
    (`arena_max`, `mmap_threshold`). Call before the threads start. Empty where the C
    library is not glibc."""
    environ = os.environ if environ is None else environ
    if platform.libc_ver()[0] != "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied: dict[str, int] = {}
    for name, param, value in (
        ("arena_max", M_ARENA_MAX, ARENA_MAX),
        ("mmap_threshold", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ):
        if not _set_by_operator(param, environ) and mallopt(param, value) == 1:
            applied[name] = value
    return applied
