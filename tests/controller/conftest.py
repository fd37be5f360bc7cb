"""The controller's envtests share the policies and the controller of their module:

- `objects` (per module): the CRDs and the module's `POLICIES` (name → spec; none where
  the module has none) in place, put back as they were at the module's end.
- `controller` (per module): the controller running with those policies Valid, with the
  module's `CONTROLLER_ARGS` and `CONTROLLER_ENV` (none where it has none).
- `far_namespace` (per session): `FAR_NS`, where the FAR operator would keep its records
  (the fencing modules' policies name it), made once: the envtests run no namespace
  controller, so a namespace deleted stays Terminating and its name cannot be made again.
- `medik8s` (per module): the real FenceAgentsRemediation (FAR v0.7.0) and
  SelfNodeRemediation (SNR v0.13.0) CRDs, from the vendored sources in
  ../shared/thirdparty/ (`UNSTICK_THIRDPARTY`); a test that reads FAR or SNR records asks
  for it, and is skipped without them.
"""

from __future__ import annotations

import os
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import ControlPlane
from tests.support.controller import Controller, Objects, controller_started, policies_in_place
from unstick.kube.client import ClientSettings, Kube

REPO = Path(__file__).resolve().parents[2]
THIRDPARTY = Path(os.environ.get("UNSTICK_THIRDPARTY", REPO.parent / "shared" / "thirdparty"))
MEDIK8S_CRDS = {  # archive → its CRD
    "fence-agents-remediation-v0.7.0.tar.gz": "config/crd/bases/"
    "fence-agents-remediation.medik8s.io_fenceagentsremediations.yaml",
    "self-node-remediation-v0.13.0.tar.gz": "config/crd/bases/"
    "self-node-remediation.medik8s.io_selfnoderemediations.yaml",
}
FAR_NS = f"t-far-{uuid.uuid4().hex[:6]}"  # where the FAR operator keeps its records


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


@pytest.fixture(scope="session")
def far_namespace(control_plane: ControlPlane) -> Iterator[Kube]:
    """FAR's namespace, without the CRDs; the admin's client."""
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": FAR_NS}})
    try:
        yield kube
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{FAR_NS}")
        kube.close()


@pytest.fixture(scope="module")
def medik8s(
    far_namespace: Kube, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kube]:
    """The real FAR and SNR CRDs (read from the vendored archives); the admin's client."""
    missing = [a for a in MEDIK8S_CRDS if not (THIRDPARTY / a).is_file()]
    if missing:
        pytest.skip(
            f"reads FAR/SNR records, whose CRDs come from the medik8s sources: none at "
            f"{THIRDPARTY} ({', '.join(missing)}); set UNSTICK_THIRDPARTY"
        )
    crds = tmp_path_factory.mktemp("medik8s-crds")
    for archive, member in MEDIK8S_CRDS.items():
        with tarfile.open(THIRDPARTY / archive) as tar:
            top = archive.removesuffix(".tar.gz")
            data = tar.extractfile(f"{top}/{member}")
            assert data is not None, member
            (crds / Path(member).name).write_bytes(data.read())
    names = control_plane.install_crds(crds)
    try:
        yield far_namespace
    finally:
        for name in names:
            control_plane.kubectl("delete", "crd", name, "--wait=false", check=False)
