"""`make image` builds the release image from the Dockerfile with buildah, without a
registry: an OCI archive of an image index with this machine's architecture (the others
where the machine can run them), tagged ghcr.io/unstick-dev/unstick:VERSION, whose image
runs `unstick --version` as uid 65532. Root with buildah only, like the real-node suite
(skipped elsewhere, with the reason)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from unstick import __version__

ROOT = Path(__file__).parents[2]
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        pytest.skip("make image: needs root and buildah (make node-deps)")
    dist = tmp_path_factory.mktemp("dist")
    out = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "image",
                          f"DIST={dist}", "ARCHES=amd64 arm64"],
                         capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (built,) = dist.glob("*.oci.tar")
    assert built.name == f"unstick-{__version__}.oci.tar"
    return built


def blob(tar: tarfile.TarFile, digest: str) -> Any:
    algo, hexa = digest.split(":")
    return json.loads(tar.extractfile(f"blobs/{algo}/{hexa}").read())  # type: ignore[union-attr]


def test_the_archive_is_an_index_of_this_machines_image(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        (top,) = index["manifests"]
        assert top["annotations"]["org.opencontainers.image.ref.name"] == (
            f"ghcr.io/unstick-dev/unstick:{__version__}"
        )
        images = blob(tar, top["digest"])["manifests"]
        arches = [m["platform"]["architecture"] for m in images]
        assert ARCH in arches  # arm64 too where binfmt_misc can run it (skipped here, said)
        mine = next(m for m in images if m["platform"]["architecture"] == ARCH)
        config = blob(tar, blob(tar, mine["digest"])["config"]["digest"])
    assert config["architecture"] == ARCH and config["os"] == "linux"
    assert config["config"]["Entrypoint"] == ["unstick"]
    assert config["config"]["User"] == "65532:65532"
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_image_runs_unstick(archive: Path, tmp_path: Path) -> None:
    store = ["--root", str(tmp_path / "storage"), "--runroot", str(tmp_path / "run"),
             "--storage-driver", "vfs"]  # fmt: skip
    env = {**os.environ, "BUILDAH_RUNTIME": "runc"}

    def buildah(*args: str) -> str:
        out = subprocess.run(["buildah", *store, *args], capture_output=True, text=True,
                             env=env, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    ctr = buildah("from", "--quiet", f"oci-archive:{archive}")
    try:
        version = buildah("run", "--isolation", "chroot", ctr, "--", "unstick", "--version")
        uid = buildah("run", "--isolation", "chroot", ctr, "--", "id", "-u")
        # the server extra: what the controller and the agent import
        server = "import kopf, grpc, google.protobuf, prometheus_client, pythonjsonlogger"
        buildah("run", "--isolation", "chroot", ctr, "--", "python3", "-c", server)
    finally:
        buildah("rm", ctr)
        buildah("rmi", "--all", "--force")
    assert version == f"unstick {__version__}"
    assert uid == "65532"
