"""The images of the real-node suite, built by `hack/build-images.sh` (`make images`) into
OCI archives: unstick (from the project's Dockerfile), the pods' sandbox (pause) and the
busybox workload. The script writes their references and archives to
`bin/node-images.json`; this reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from devcluster.controlplane import find_bin_dir

INDEX_NAME = "node-images.json"


@dataclass(frozen=True)
class NodeImage:
    ref: str  # e.g. localhost/unstick:0123456789abcdef
    archive: Path  # OCI archive that `ctr images import` takes

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


@dataclass(frozen=True)
class NodeImages:
    unstick: NodeImage
    pause: NodeImage
    busybox: NodeImage

    def all(self) -> tuple[NodeImage, ...]:
        return (self.pause, self.busybox, self.unstick)


def load_images(index: Path | None = None) -> NodeImages:
    """The images listed in `bin/node-images.json`; FileNotFoundError (saying how to
    build them) when it or an archive is missing."""
    index = index or find_bin_dir() / INDEX_NAME
    if not index.exists():
        raise FileNotFoundError(
            f"{index} not found: build the node suite's images with `make images` (as root)"
        )
    raw = json.loads(index.read_text())
    images = {}
    for name in ("unstick", "pause", "busybox"):
        entry = raw.get(name) or {}
        image = NodeImage(ref=str(entry.get("ref", "")), archive=Path(entry.get("archive", "")))
        if not image.ref or not image.archive.is_file():
            raise FileNotFoundError(
                f"{index}: image {name!r} has no archive ({image.archive}): run `make images`"
            )
        images[name] = image
    return NodeImages(**images)
