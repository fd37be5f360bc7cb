"""The demo on the real node takes the real node's lock (one node of a name per machine),
which the real-node suite's session node (tests/node) holds until the end of the pytest
session. So the demo's real-node test runs first, before any session node exists: in one
pytest process (`make test`, or `pytest tests/node tests/demo`) it never waits for a lock
its own process holds."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [
        i
        for i in items
        if i.get_closest_marker("node") is not None and "tests/machines/demo/" in i.path.as_posix()
    ]
    if first:
        items[:] = first + [i for i in items if i not in first]
