"""The kind suite's one cluster for all of tests/kind (tests/kind/support.py): made before
its first test, deleted after its last, so the rest of the session runs without it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .support import Kind, kind_cluster


@pytest.fixture(scope="package")
def kind() -> Iterator[Kind]:
    with kind_cluster() as cluster:
        yield cluster
