"""controller.nodeRoundTrip: the controller's --node-round-trip (one round trip with a
mandate, design.md §11) or, false, --no-node-round-trip (the previous release's flow, the
way back for one release: docs/upgrading.md) — always one of them, said explicitly, so the
chart runs the flow its value names whatever the image's default; a value that is not a
boolean is refused by the values schema."""

from __future__ import annotations

from typing import Any

from .render import CHART, one, run_helm, template

FLAGS = ("--node-round-trip", "--no-node-round-trip")


def _flags(objects: list[dict[str, Any]]) -> list[str]:
    deployment = one(objects, "Deployment", "unstick-controller")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a in FLAGS]


def test_the_round_trip_is_a_value(helm: str) -> None:
    assert len(_flags(template(helm))) == 1
    assert _flags(template(helm, "--set", "controller.nodeRoundTrip=true")) == [FLAGS[0]]
    assert _flags(template(helm, "--set", "controller.nodeRoundTrip=false")) == [FLAGS[1]]
    bad = run_helm(
        helm, "template", "x", str(CHART), "--set-string", "controller.nodeRoundTrip=yes",
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "nodeRoundTrip" in bad.stderr
