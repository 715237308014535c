"""Every event type has a service that may publish it, and only known services do."""

from __future__ import annotations

from helmline.contracts import (
    BUCKET_WRITERS,
    EVENT_PUBLISHERS,
    KEY_VALUE_BUCKETS,
    OBJECT_STORES,
    SERVICES,
    nats_permissions,
)


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
