"""kube/server_clock.py: the API server's clock from the `Date` of its answers, rounded in
the safe direction (a slack measured with it ends no earlier than on the server's clock)."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from devcluster import ControlPlane
from unstick.kube.client import ClientSettings, Kube
from unstick.kube.server_clock import KEEP_S, ServerClock, date_header


def date(server: float) -> str:
    """The `Date` header the server writes at `server` (whole seconds, truncated)."""
    return formatdate(int(server), usegmt=True)


def answers(clock: ServerClock, offset: float, at: list[float], rtt: float = 0.02) -> None:
    """Answers sent at local times `at`, the server's clock `offset` ahead of the local one,
    each written halfway through the round trip."""
    for sent in at:
        clock.answered(sent, sent + rtt, date(sent + rtt / 2 + offset))


@pytest.mark.parametrize("offset", [20.0, -20.0, 0.0, 3.7, -0.4])
def test_the_offset_is_a_lower_bound_that_narrows(offset: float) -> None:
    clock = ServerClock()
    base = 1_800_000_000.0
    answers(clock, offset, [base])
    first = clock.bounds()
    assert first is not None and first[0] <= offset <= first[1]
    assert first[1] - first[0] <= 1.0 + 0.02 + 1e-9
    # answers at every tenth of a second: the bounds narrow to about the round trip
    answers(clock, offset, [base + 1.0 + i * 0.13 for i in range(40)])
    low, high = clock.bounds() or (0.0, 0.0)
    assert low <= offset <= high
    assert high - low < 0.2
    local = base + 10.0
    assert clock.server_now(local) <= local + offset  # never later than the server's clock
    assert clock.local_at(local + offset) >= local  # never earlier than when it reads that
    assert clock.server_latest(local) >= local + offset  # a first sighting: never earlier


def test_no_answer_yet_no_correction() -> None:
    clock = ServerClock()
    assert clock.offset() is None
    assert clock.server_now(100.0) == 100.0
    assert clock.local_at(100.0) == 100.0
    assert clock.server_latest(100.0) == 100.0
    clock.answered(100.0, 100.1, None)
    clock.answered(100.0, 100.1, "not a date")
    assert clock.offset() is None


def test_a_stepped_clock_is_measured_again() -> None:
    clock = ServerClock()
    base = 1_800_000_000.0
    answers(clock, 0.0, [base + i * 0.13 for i in range(20)])
    answers(clock, -20.0, [base + 5.0])  # this clock was stepped 20 s ahead
    low, high = clock.bounds() or (0.0, 0.0)
    assert low <= -20.0 <= high and high - low <= 1.1


def test_old_answers_are_let_go() -> None:
    clock = ServerClock()
    base = 1_800_000_000.0
    answers(clock, 0.3, [base + i * 0.13 for i in range(20)])
    narrow = clock.bounds()
    answers(clock, 0.3, [base + KEEP_S + 10.0])
    wide = clock.bounds()
    assert narrow is not None and wide is not None
    assert wide[1] - wide[0] > narrow[1] - narrow[0]
    assert wide[0] <= 0.3 <= wide[1]


def test_date_header() -> None:
    assert date_header("Sat, 28 Nov 2026 07:00:00 GMT") == 1795849200.0
    assert date_header("") is None
    assert date_header("yesterday") is None


@pytest.mark.envtest
def test_the_client_measures_the_api_server(control_plane: ControlPlane) -> None:
    """Kube's answers feed its ServerClock: the real API server runs on this machine's
    clock, so the bounds hold 0."""
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    try:
        assert kube.server_clock.bounds() is None
        for _ in range(3):
            kube.get("/api/v1/namespaces/default")
        low, high = kube.server_clock.bounds() or (1.0, -1.0)
        assert low <= 0.0 <= high
    finally:
        kube.close()
