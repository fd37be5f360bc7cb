"""A real client whose watches meet an expired resourceVersion, for the envtests of the
list+watch loops (tests/kube/test_listwatch.py, tests/controller/test_remediation_watch.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from unstick.kube.client import ClientSettings, Kube


class StaleFirstList(Kube):
    """A real client whose first LIST reports resourceVersion "1": the watch that follows
    asks the real API server for history it no longer has (410 Gone)."""

    def __init__(self, settings: ClientSettings) -> None:
        super().__init__(settings)
        self.listed = 0

    def list_pages(self, path: str, query: Any = None, limit: int = 500) -> Iterator[Any]:
        self.listed += 1
        for page in super().list_pages(path, query, limit):
            if self.listed == 1:
                yield {**page, "metadata": {**page["metadata"], "resourceVersion": "1"}}
            else:
                yield page
