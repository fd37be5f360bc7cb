"""The controller's envtests share the policies and the controller of their module:

- `objects` (per module): the CRDs and the module's `POLICIES` (name → spec; none where
  the module has none) in place, put back as they were at the module's end.
- `controller` (per module): the controller running with those policies Valid, with the
  module's `CONTROLLER_ARGS` and `CONTROLLER_ENV` (none where it has none).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import ControlPlane
from tests.support.controller import Controller, Objects, controller_started, policies_in_place


@pytest.fixture(scope="module")
def objects(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Objects]:
    with policies_in_place(control_plane, getattr(request.module, "POLICIES", {})) as objs:
        yield objs


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane,
    objects: Objects,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Controller]:
    with controller_started(
        control_plane,
        objects,
        tmp_path_factory.mktemp("controller") / "controller.log",
        valid=getattr(request.module, "POLICIES", {}),
        extra_args=getattr(request.module, "CONTROLLER_ARGS", ()),
        env=getattr(request.module, "CONTROLLER_ENV", None),
    ) as ctl:
        yield ctl
