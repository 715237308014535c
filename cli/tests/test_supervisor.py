"""The supervisor's back-off, which decides how soon a dying service is started again."""

from __future__ import annotations

import pytest

from helmline.cli._supervisor import MAX_DELAY_S, restart_delay


@pytest.mark.parametrize(
    ("young_deaths", "delay"),
    [(1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0), (8, MAX_DELAY_S), (50, MAX_DELAY_S)],
)
def test_a_service_dying_young_again_and_again_waits_longer_each_time(
    young_deaths: int, delay: float
) -> None:
    assert restart_delay(young_deaths) == delay
