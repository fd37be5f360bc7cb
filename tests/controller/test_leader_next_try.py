"""When a standby tries again (controller/leader.py `next_try_in`): at its retry period, or
at the moment the other replica's record expires on its own clock if that comes first —
never sooner than that expiry, never in a busy loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unstick.controller.leader import EXPIRY_MARGIN_S, next_try_in


def test_no_record_of_another_replica_waits_the_retry_period() -> None:
    assert next_try_in(2.2, None) == 2.2


def test_an_expiry_before_the_next_retry_is_tried_right_after_it() -> None:
    assert next_try_in(2.2, 0.7) == pytest.approx(0.7 + EXPIRY_MARGIN_S)


def test_an_expiry_after_the_next_retry_waits_the_retry_period() -> None:
    assert next_try_in(2.2, 9.0) == 2.2


@pytest.mark.parametrize("until", [0.0, -0.01, -30.0])
def test_an_expiry_already_past_waits_the_retry_period(until: float) -> None:
    # a try that lost the race (409) or met an API error: no busy loop
    assert next_try_in(2.2, until) == 2.2


@given(
    retry=st.floats(min_value=0.01, max_value=60),
    until=st.none() | st.floats(min_value=-60, max_value=60),
)
def test_never_before_the_expiry_and_never_after_the_retry(
    retry: float, until: float | None
) -> None:
    wait = next_try_in(retry, until)
    assert 0 < wait <= retry
    if until is not None and until > 0:
        assert wait >= min(retry, until)  # never tried before the record could have expired
