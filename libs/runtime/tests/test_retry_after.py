"""The wait an HTTP server asks for, in each form servers send it."""

from __future__ import annotations

import time
from email.utils import formatdate

import httpx
import pytest

from helmline.runtime import retry_after_s


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"Retry-After-Ms": "250", "Retry-After": "9"}, 0.25),  # The finer one wins.
        ({"Retry-After": "-3"}, 0.0),  # Never a negative wait.
        ({"Retry-After": "soon"}, None),
        ({"Retry-After-Ms": "x"}, None),
        ({}, None),
    ],
)
def test_seconds_and_milliseconds(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(httpx.Headers(headers)) == expected


def test_an_http_date_is_the_time_left_until_then() -> None:
    in_a_minute = formatdate(time.time() + 60, usegmt=True)
    wait = retry_after_s(httpx.Headers({"Retry-After": in_a_minute}))
    assert wait is not None
    assert 55 <= wait <= 60

    an_hour_ago = formatdate(time.time() - 3600, usegmt=True)
    assert retry_after_s(httpx.Headers({"Retry-After": an_hour_ago})) == 0.0
