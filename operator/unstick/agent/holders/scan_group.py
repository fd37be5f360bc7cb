"""One holder scan for several pods at once: the checks of a burst (group commit).

A holder scan reads every process's fds, cwd, root, maps and every mount namespace's
table; its cost grows with processes times open files, not with the number of mounts asked
about. When many pods of a node are probed at the same time (a CSI driver restart strands
all of its pods at once), one scan can answer all of them.

What may be shared, and why it is safe: a caller joins the **next** scan to start, never
one already running. The scan it gets started after it asked, so it is exactly as fresh as
a scan of its own would have been (which would have started at about the same moment, and
read each process at about the same time). A scan is never reused: once it ended, it
answers no new caller, so no scan is ever used after an act it did not see coming.

What a shared scan answers a caller is never less than its own scan would: the targets of
one scan all come from the same host table (one home namespace); with more targets, more
namespaces "could hold" and are searched in full; holders are matched per target and each
caller gets those of its own mounts; an incomplete scan is incomplete for every caller.
Another pod's act during the shared scan is no different from another worker thread's
act during a scan of one's own. A pod's own acts never run during its check: one batch of
node steps per pod at a time (`Handler.pod_locks`), each check right before its act.

Used by the probes and by the executor's checks right before each unmount or unpublish
(`Executor.holder_scans`): in a burst, the checks that four worker threads ask for at the
same moment cost one scan. `NextPass` applies the same rule to other whole reads: the
cgroup pass (`containers`), the namespace and policy GETs (`loop`), the waiter scan's pass
over the node's tasks (`waiter_pass`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from unstick.core.model.mountinfo import Mount


class _Hold(Protocol):
    """What a shared scan needs of one hold it found (agent/holders/scan.py's Holder)."""

    @property
    def mount_point(self) -> str: ...


class _Found(Protocol):
    """What a shared scan needs of a scan's answer (agent/holders/scan.py's HolderScan, which
    calls this module: it is not imported here): a dataclass with the holds it found."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def holders(self) -> Sequence[_Hold]: ...


S = TypeVar("S", bound=_Found)
_Key = tuple[str, str | None]
R = TypeVar("R")
K = TypeVar("K")


@dataclass
class _Pass(Generic[R]):
    done: threading.Event = field(default_factory=threading.Event)
    result: R | None = None
    error: BaseException | None = None
    callers: int = 0
    mounts: list[Mount] = field(default_factory=list)  # ScanGroup: the batch's targets


@dataclass
class _Shared(Generic[K, R]):
    """The one home of the rule (module docstring): a caller joins the batch of the **next**
    run for its key; the first caller of a batch waits for the running one (if any) to end,
    closes its batch and runs it; everyone in the batch gets the same result (or the same
    exception). A result is never handed out after its run ended."""

    runs: int = 0  # passes/scans run
    served: int = 0  # callers answered
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Condition = field(init=False)
    _next: dict[K, _Pass[R]] = field(default_factory=dict)
    _running: set[K] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._idle = threading.Condition(self._lock)

    def _share(self, key: K, fn: Callable[[_Pass[R]], R], mounts: Iterable[Mount] = ()) -> R:
        """`fn(batch)` run after this call began, shared with the callers of the same `key`
        waiting for it (`fn` is the leader's: the same for one key)."""
        with self._lock:
            batch = self._next.get(key)
            leader = batch is None
            if batch is None:
                batch = self._next[key] = _Pass()
            batch.callers += 1
            batch.mounts.extend(mounts)
        if leader:
            self._lead(key, batch, fn)
        batch.done.wait()
        if batch.error is not None:
            raise batch.error
        with self._lock:
            self.served += 1
        return cast(R, batch.result)

    def _lead(self, key: K, batch: _Pass[R], fn: Callable[[_Pass[R]], R]) -> None:
        with self._lock:
            while key in self._running:
                self._idle.wait()
            self._running.add(key)
            del self._next[key]  # closed: a caller from now on waits for the next run
            self.runs += 1
        try:
            batch.result = fn(batch)
        except BaseException as exc:  # every caller of the batch sees it
            batch.error = exc
        finally:
            with self._lock:
                self._running.discard(key)
                self._idle.notify_all()
            batch.done.set()


@dataclass
class ScanGroup(_Shared[_Key, _Found]):
    """Holder scans shared by callers that ask at the same time (module docstring).

    The first caller of a batch waits for the running scan (if any) to end, closes the
    batch and scans the union of the batch's mounts; each caller gets the holders of its
    own mounts and the scan's completeness (a gap is a gap for every caller: never less
    cautious than a scan of its own)."""

    @property
    def scans(self) -> int:
        return self.runs

    def scan(
        self,
        host_proc: str,
        mounts: list[Mount],
        kubelet_root: str | None,
        scan_fn: Callable[[str, list[Mount], str | None], S],
    ) -> S:
        def run(batch: _Pass[_Found]) -> _Found:
            targets = list({(m.mount_id, m.mount_point): m for m in batch.mounts}.values())
            return scan_fn(host_proc, targets, kubelet_root)

        # one scan_fn per group (scan_holders'), so the batch's answer is an S
        result = cast(S, self._share((host_proc, kubelet_root), run, mounts))
        mine = {m.mount_point for m in mounts}
        holders = [h for h in result.holders if h.mount_point in mine]
        return dataclasses.replace(result, holders=holders)


_SHARING: contextvars.ContextVar[ScanGroup | None] = contextvars.ContextVar(
    "unstick_holder_scan_group", default=None
)


def current_group() -> ScanGroup | None:
    """The group `scan_holders` joins in this thread, if any."""
    return _SHARING.get()


@contextlib.contextmanager
def shared_scans(group: ScanGroup) -> Iterator[None]:
    """Within this block (this thread), `scan_holders` joins `group`'s next scan."""
    token = _SHARING.set(group)
    try:
        yield
    finally:
        _SHARING.reset(token)


@dataclass
class NextPass(_Shared[str, R]):
    """One read of something whole (every process's cgroup file, ...) for the callers that
    ask at the same time, by the rule of `ScanGroup`: a caller joins the **next** pass to
    start, never one already running, so what it gets was read after it asked — exactly as
    fresh as a pass of its own. The first caller of a pass waits for the running pass (if
    any) to end, closes its batch and runs it; everyone in the batch gets the same result
    (or the same exception). A result is never handed out after its pass ended."""

    @property
    def passes(self) -> int:
        return self.runs

    def run(self, key: str, fn: Callable[[], R]) -> R:
        """`fn()` run after this call began, shared with the callers of the same `key`
        waiting for it (`fn` is the same for one key)."""
        return self._share(key, lambda _batch: fn())
