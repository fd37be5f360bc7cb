"""The kind suite's one cluster, for the whole session (tests/kind/support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .support import Kind, kind_cluster


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    with kind_cluster() as cluster:
        yield cluster
