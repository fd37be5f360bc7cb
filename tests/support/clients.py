"""The Kubernetes API clients a test holds, closed when it is done with them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

from devcluster import ControlPlane


@contextmanager
def core_v1(cp: ControlPlane) -> Iterator[Any]:
    """A CoreV1Api of the control plane; its API client closed at the end."""
    from kubernetes import client

    with closing(cp.api_client()) as api_client:
        yield client.CoreV1Api(api_client)
