"""Retention: configurable limits on the events stream, and a warning before events go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nats.js.errors import NotFoundError

from helmline.contracts import (
    EVENTS_STREAM,
    OPS_STREAM,
    RETENTION_SUBJECT,
    Actor,
    SessionStarted,
    StreamLimitApproaching,
    ThoughtRecorded,
    decode_event,
    new_event,
)
from helmline.runtime import EventStore, ServiceHost
from helmline.runtime.testing import eventually
from helmline.state.__main__ import setup_state
from helmline.state._retention import limits_in_use
from helmline.state._settings import StateSettings

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


DAY = 24 * 3600.0


def _readings(stored_bytes: int, oldest_days: float) -> list[tuple[str, float, float]]:
    """What a stream limited to 1,000 bytes and 10 days reads."""
    return [
        (reading.limit, reading.used, reading.current_value)
        for reading in limits_in_use(
            max_age_s=10 * DAY,
            max_bytes=1000,
            stored_bytes=stored_bytes,
            oldest_at=NOW - timedelta(days=oldest_days),
            now=NOW,
        )
    ]


def test_each_limit_set_is_read_as_the_share_in_use() -> None:
    assert _readings(850, 9) == [("bytes", 0.85, 850), ("age", 0.9, 9 * DAY)]
    assert _readings(0, 0) == [("bytes", 0, 0), ("age", 0, 0)]
    assert not limits_in_use(
        max_age_s=None, max_bytes=None, stored_bytes=10**12, oldest_at=None, now=NOW
    )


async def test_the_state_service_applies_the_limits_and_warns_as_the_stream_nears_them(
    own_log: tuple[str, EventStore],
) -> None:
    nats_url, store = own_log
    settings = StateSettings(
        nats_url=nats_url,
        events_max_bytes=200_000,
        retention_check_s=0.1,
        shutdown_grace_s=1,
    )
    async with ServiceHost("state", settings) as host:
        await setup_state(settings)(host)
        info = await host.js.stream_info(EVENTS_STREAM.name)
        assert info.config.max_bytes == 200_000

        started = new_event(
            SessionStarted(goal="fill the log", requested_by=Actor(id="ana")),
            tenant="acme",
            session_id="big",
            source="test",
        )
        await store.append(started)
        text = "x" * 2_000
        for number in range(90):  # About 90 times 2.3 kB: past 80 % of 200 kB.
            thought = ThoughtRecorded(kind="reasoning", text=text)
            await store.append(started.derive(thought, source="test", key=str(number)))

        async def warned() -> StreamLimitApproaching | None:
            try:
                message = await host.js.get_last_msg(OPS_STREAM.name, RETENTION_SUBJECT)
            except NotFoundError:
                return None
            assert message.data is not None
            payload = decode_event(message.data).data
            assert isinstance(payload, StreamLimitApproaching)
            return payload

        warning = await eventually(warned, timeout_s=30, what="a retention warning")
        used = host.metrics.registry.get_sample_value(
            "helmline_stream_limit_used_ratio",
            {"stream": EVENTS_STREAM.name, "limit": "bytes"},
        )
    assert warning.limit == "bytes"
    assert warning.stream == EVENTS_STREAM.name
    assert 0.8 <= warning.used < 1.05
    assert warning.limit_value == 200_000
    assert (used or 0) >= 0.8
