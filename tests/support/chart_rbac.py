"""The controller under the chart's own RBAC on a test API server: the chart's controller
ServiceAccount, ClusterRole(s), Role(s) and their bindings rendered with `helm template`
(with the test's `--set`s), applied, and a kubeconfig that authenticates with a token of
that ServiceAccount — so a test's requests are allowed exactly what the chart allows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devcluster import ControlPlane
from tests.chart.render import release_objects
from tests.support.integrity import apply_objects, delete_objects, token_for

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _controllers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    labels = lambda o: (o.get("metadata") or {}).get("labels") or {}  # noqa: E731
    return [o for o in objects if labels(o).get("app.kubernetes.io/component") == "controller"]


@contextmanager
def controller_kubeconfig(
    cp: ControlPlane, namespace: str, path: Path, *sets: str, release: str = "unstick"
) -> Iterator[Path]:
    """A kubeconfig at `path` for the chart's controller ServiceAccount (`release` in
    `namespace`, which must exist), its RBAC applied; deleted again at the end."""
    rbac = _controllers(release_objects(release, namespace, RBAC_KINDS, *sets))
    [account] = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    apply_objects(cp, rbac)
    try:
        token = token_for(cp, namespace, account).token
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: chart\n"
            f"clusters:\n- name: chart\n  cluster:\n    server: {cp.url}\n"
            f"    certificate-authority: {cp.certs.ca_cert}\n"
            f"users:\n- name: {account}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: chart\n  context:\n    cluster: chart\n    user: {account}\n"
        )
        yield path
    finally:
        delete_objects(cp, rbac)
