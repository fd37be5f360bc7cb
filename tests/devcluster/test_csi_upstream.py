"""The upstream CSI driver's build and deployment, without a node: hack/build-thirdparty.sh
refusing archives whose sha256 is not the README's (nothing built, exit 0, the reason kept
for the skip), the images' lookup, the objects deployed (docs/csi.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from devcluster.csi_upstream import (
    DRIVER,
    NAMESPACE,
    RUNNER_RULES,
    SERVICE_ACCOUNT,
    STORAGE_CLASS,
    upstream_images,
)
from devcluster.csi_upstream_objects import driver_objects, plugin_statefulset

REPO = Path(__file__).resolve().parents[2]
ARCHIVES = (
    "csi-driver-host-path-v1.11.0", "csi-driver-host-path-v1.12.0",
    "node-driver-registrar-v2.17.0", "external-provisioner-v6.3.0", "external-attacher-v4.12.0",
    "fence-agents-remediation-v0.7.0",
)  # fmt: skip


def test_archives_whose_sha256_differs_from_the_readme_are_refused(tmp_path: Path) -> None:
    root, sources, cache = tmp_path / "checkout", tmp_path / "sources", tmp_path / "cache"
    (root / "hack").mkdir(parents=True)
    shutil.copy(REPO / "hack" / "build-thirdparty.sh", root / "hack")
    sources.mkdir()
    rows = []
    for name in ARCHIVES:
        (sources / f"{name}.tar.gz").write_bytes(b"not the release")
        rows.append(f"| {name}.tar.gz | github.com/x/y | v0 | {'0' * 40} | {'a' * 64} |")
    (sources / "README.md").write_text(
        "| archive | repository | tag | commit | sha256 |\n" + "\n".join(rows)
    )
    env = {**os.environ, "UNSTICK_THIRDPARTY": str(sources), "UNSTICK_TOOLS_CACHE": str(cache)}
    proc = subprocess.run(
        ["bash", str(root / "hack" / "build-thirdparty.sh")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "not built" in line]
    assert len(said) == 1 and f"README.md lists '{'a' * 64}'" in said[0], proc.stderr
    index = json.loads((root / "bin" / "thirdparty.json").read_text())
    assert set(index) == {"missing"} and "sha256" in index["missing"]
    assert not [p for p in cache.iterdir()], "nothing built or left half-unpacked"


def test_images_missing_say_why(tmp_path: Path) -> None:
    (tmp_path / "node-images.json").write_text("{}")
    (tmp_path / "thirdparty.json").write_text(json.dumps({"missing": "not built: x (why)"}))
    with pytest.raises(FileNotFoundError, match=r"csi-hostpath-v1\.11\.0.*not built: x \(why\)"):
        upstream_images("v1.11.0", tmp_path / "node-images.json")
    with pytest.raises(ValueError, match=r"'v1\.13\.0': one of"):
        upstream_images("v1.13.0", tmp_path / "node-images.json")


def test_the_driver_is_deployed_as_upstream_deploys_it() -> None:
    objects = dict(
        (body["kind"], body)
        for _, body in driver_objects(
            NAMESPACE, SERVICE_ACCOUNT, RUNNER_RULES, DRIVER, STORAGE_CLASS
        )
    )
    assert objects["CSIDriver"]["spec"]["attachRequired"] is True
    assert objects["StorageClass"]["provisioner"] == DRIVER
    sts = plugin_statefulset(
        name="p", namespace=NAMESPACE, service_account=SERVICE_ACCOUNT, driver=DRIVER,
        plugin_image="plugin:1", sidecars_image="sidecars:1", node="n",
        kubelet_root="/k", data_dir="/d",
    )  # fmt: skip
    spec = sts["spec"]["template"]["spec"]
    names = [c["name"] for c in spec["containers"]]
    assert names == ["hostpath", "node-driver-registrar", "csi-provisioner", "csi-attacher"]
    registrar = spec["containers"][1]
    assert "--kubelet-registration-path=/k/plugins/csi-hostpath/csi.sock" in registrar["args"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert volumes["socket-dir"] == "/k/plugins/csi-hostpath"
    assert volumes["registration-dir"] == "/k/plugins_registry"
    plugin_mounts = {m["mountPath"]: m.get("mountPropagation") for m in
                     spec["containers"][0]["volumeMounts"]}  # fmt: skip
    assert plugin_mounts["/k/pods"] == "Bidirectional"
