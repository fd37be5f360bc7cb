"""The controller alerts (#31) evaluated by a real Prometheus on what two real controller
processes export: UnstickNoLeader fires while both run but neither leads (the Lease held
by a third identity) and resolves when one takes it; UnstickControllerDown fires when both
are gone and resolves when one is back. The chart's rules, rendered with 4 s `for:`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from devcluster.prometheus import Prometheus, ScrapeTarget, render_chart
from tests.support.controller import Controller, Objects, crds_installed, policy_spec
from unstick.controller.leader import Elector, LeaseSettings
from unstick.kube.client import ClientSettings, Kube

pytestmark = [pytest.mark.prometheus, pytest.mark.envtest]

LEASE = "t-prom-lease"
VALUES: dict[str, Any] = {"prometheusRule": {"controllerDownFor": "4s", "noLeaderFor": "4s"}}


def firing(prometheus: Prometheus, name: str) -> bool:
    return any(
        a["labels"]["alertname"] == name and a["state"] == "firing" for a in prometheus.alerts()
    )


def active(prometheus: Prometheus, name: str) -> bool:
    return any(a["labels"]["alertname"] == name for a in prometheus.alerts())


@pytest.fixture
def third_holder(control_plane: ControlPlane) -> Iterator[Elector]:
    """Another program holding the controllers' Lease (renewing it every second)."""
    settings = LeaseSettings(
        identity="someone-else",
        name=LEASE,
        namespace="default",
        lease_duration_s=15.0,
        renew_deadline_s=10.0,
        retry_period_s=1.0,
    )
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig), retry_attempts=1))
    elector = Elector(kube, settings)
    thread = threading.Thread(target=elector.run, daemon=True)
    thread.start()
    wait_until(elector.leading, timeout=30, what="the third identity to hold the Lease")
    try:
        yield elector
    finally:
        elector.stop.set()
        thread.join(timeout=10)
        elector.release()
        kube.close()


def test_no_leader_then_controller_down(
    control_plane: ControlPlane, third_holder: Elector, tmp_path: Path
) -> None:
    chart = render_chart(control_plane.bin_dir / "helm", VALUES)
    job, _ = chart.metrics_services["controller"]
    with crds_installed(control_plane):
        objects = Objects(control_plane)
        before = objects.replace_policy("default", policy_spec())
        ctls = [
            Controller(
                control_plane,
                tmp_path / f"{name}.log",
                lease=LEASE,
                env={"POD_NAME": name},
            )
            for name in ("prom-a", "prom-b")
        ]
        prometheus: Prometheus | None = None
        try:
            for ctl in ctls:
                ctl.start()
            targets = [ScrapeTarget(job, f"127.0.0.1:{c.metrics_port}") for c in ctls]
            prometheus = Prometheus(control_plane.bin_dir, targets, chart.rule_groups).start()
            prom = prometheus
            wait_until(lambda: prom.targets_up() == {job: "up"}, timeout=60, what="both up")

            # Both run, the Lease is someone else's: no leader.
            wait_until(lambda: firing(prom, "UnstickNoLeader"), timeout=60, what="NoLeader")
            assert not active(prom, "UnstickControllerDown")
            assert [c.sample("unstick_controller_leader") for c in ctls] == [0.0, 0.0]

            # The other program lets go: a replica takes the Lease, the alert resolves.
            third_holder.stop.set()
            third_holder.release()
            wait_until(
                lambda: not active(prom, "UnstickNoLeader"), timeout=60, what="NoLeader resolved"
            )
            leaders = [c.sample("unstick_controller_leader") for c in ctls]
            assert sorted(leaders) == [0.0, 1.0], leaders

            # Both controllers gone: ControllerDown; one back: resolved.
            for ctl in ctls:
                ctl.stop()
            stopped = time.time()
            wait_until(
                lambda: firing(prom, "UnstickControllerDown"), timeout=60, what="ControllerDown"
            )
            assert not active(prom, "UnstickNoLeader")  # nothing up: not this alert's case
            ctls[0].start()
            wait_until(
                lambda: not active(prom, "UnstickControllerDown"),
                timeout=60,
                what="ControllerDown resolved",
            )
            print(f"ControllerDown fired and resolved; {time.time() - stopped:.1f} s in all")
        finally:
            if prometheus is not None:
                print(prometheus.log_tail())
                prometheus.stop()
            for ctl in ctls:
                ctl.stop()
                print(ctl.log()[-2000:])
            objects.replace_policy("default", before)
            objects.api_client.close()
