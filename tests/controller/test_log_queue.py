"""The controller's log is written by one thread (logfilter.write_off_thread): every
worker's record arrives, in order per thread, with the handler's filters applied."""

from __future__ import annotations

import io
import logging
import threading

from unstick.controller import logfilter


def test_records_of_many_threads_are_written_by_one_with_the_filters() -> None:
    root = logging.Logger("test-root")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    logfilter.install(root)
    listener = logfilter.write_off_thread(root)
    try:
        assert [type(h).__name__ for h in root.handlers] == ["QueueHandler"]

        def work(n: int) -> None:
            for i in range(50):
                root.info("worker=%d line=%d", n, i)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        kopf = logging.LogRecord(
            "kopf._cogs.clients", logging.ERROR, __file__, 1,
            "Request attempt #1/6 failed; will retry: APITooManyRequestsError(429)", None, None,
        )  # fmt: skip
        root.handle(kopf)
    finally:
        listener.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 8 * 50 + 1
    for n in range(8):
        mine = [line for line in lines if f"worker={n} " in line]
        assert mine == [f"INFO test-root: worker={n} line={i}" for i in range(50)]
    assert lines[-1].startswith("WARNING kopf._cogs.clients: Request attempt #1/6")
