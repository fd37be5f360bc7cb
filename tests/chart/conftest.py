"""Fixtures for the chart tests: helm and promtool from bin/ (built by `make tools`).

Without them the tests that need them are skipped locally, and fail in CI (where
`make test` builds them first, so a missing one is a broken build)."""

from __future__ import annotations

import os

import pytest

from .render import find_tool


def _require(name: str) -> str:
    path = find_tool(name)
    if path is None:
        message = f"{name} not found in bin/ or on $PATH: run `make tools`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def helm() -> str:
    return _require("helm")


@pytest.fixture(scope="session")
def promtool() -> str:
    return _require("promtool")
