"""Every event type has a service that may publish it, and only known services do."""

from __future__ import annotations

from helmline.contracts import (
    BUCKET_WRITERS,
    EVENT_PUBLISHERS,
    KEY_VALUE_BUCKETS,
    OBJECT_STORES,
    SERVICES,
    SESSIONLESS_CHANNELS,
    nats_permissions,
)
from helmline.contracts.events import PAYLOAD_CLASSES


def test_a_service_may_publish_exactly_the_event_subjects_it_owns() -> None:
    for service in SERVICES:
        events = {
            subject.rsplit(".*.*.", 1)[1]
            for subject in nats_permissions(service).publish_allow
            if subject.startswith("helmline.events.")
        }
        owned = {payload.TYPE for payload, owners in EVENT_PUBLISHERS.items() if service in owners}
        assert events == owned, service


def test_every_bucket_has_a_writer() -> None:
    buckets = {b.bucket for b in KEY_VALUE_BUCKETS} | {s.bucket for s in OBJECT_STORES}
    # An empty line is a choice: only NATS admins (people, with the CLI) write it.
    missing = sorted(b for b in buckets if b not in BUCKET_WRITERS)
    assert not missing, f"buckets without a writing service: {missing}; add them to BUCKET_WRITERS"


def test_an_event_of_no_session_is_published_on_its_channel_by_its_publishers_only() -> None:
    publishers: dict[str, set[str]] = {}
    for payload, channel in SESSIONLESS_CHANNELS.items():
        publishers.setdefault(channel.covers, set()).update(payload.PUBLISHED_BY)
    for service in SERVICES:
        allowed = nats_permissions(service).publish_allow
        for covers, owners in publishers.items():
            assert (covers in allowed) == (service in owners), (covers, service)
        # Never into a session's log, where a fold would meet it.
        for payload in SESSIONLESS_CHANNELS:
            assert not any(subject.endswith(f".*.*.{payload.TYPE}") for subject in allowed)


def test_every_event_type_is_in_sessions_logs_or_on_a_channel_of_its_own() -> None:
    for payload in PAYLOAD_CLASSES:
        assert (payload in EVENT_PUBLISHERS) != (payload in SESSIONLESS_CHANNELS), payload.TYPE
