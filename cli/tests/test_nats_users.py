"""The embedded stack's NATS users: each service may publish only the event types it owns."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.errors import TimeoutError as NatsTimeout

from helmline.cli._nats import ADMIN, NatsUsers, write_nats_config
from helmline.contracts import (
    EXAMPLE_PAYLOADS,
    SERVICES,
    encode_event,
    event_subject,
    example_event,
    published_by,
)
from helmline.runtime import EventStore, connect_nats, ensure_topology
from helmline.runtime.testing import NatsServer, free_port


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsUsers, int]]:
    folder: Path = tmp_path_factory.mktemp("secured-nats")
    users, port = NatsUsers.generate(), free_port()
    store = folder / "jetstream"
    store.mkdir()
    config = write_nats_config(folder / "nats.conf", store_dir=store, port=port, users=users)
    assert config.stat().st_mode & 0o077 == 0, "the passwords are readable by others"
    with NatsServer(store, port, config):
        yield users, port


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_appends_its_own_events_and_is_refused_anothers(
    secured: tuple[NatsUsers, int], service: str, tenant: str
) -> None:
    users, port = secured
    admin = await connect_nats(users.url(port, ADMIN))
    await ensure_topology(admin.jetstream())
    await admin.close()

    refusals: list[str] = []

    async def record(error: Exception) -> None:
        refusals.append(str(error))

    connection = await connect_nats(users.url(port, service), error_cb=record)
    try:
        js = connection.jetstream()
        # Services provision on start, so their users may, too.
        await ensure_topology(js)
        store = EventStore(js, timeout_s=2)
        own = {payload.TYPE for payload in published_by(service)}
        examples = [
            example_event(p).model_copy(update={"tenant": tenant, "id": uuid.uuid4()})
            for p in EXAMPLE_PAYLOADS
        ]
        mine = next(e for e in examples if e.type in own)
        theirs = next(e for e in examples if e.type not in own)

        appended = await store.append(mine)
        assert not appended.duplicate

        with pytest.raises(NatsTimeout):
            await js.publish(
                event_subject(tenant, theirs.session_id, theirs.type),
                encode_event(theirs),
                timeout=1,
            )
        assert any("permissions violation for publish" in r.lower() for r in refusals), refusals
        assert await store.last_seq(tenant, theirs.session_id) == appended.seq
    finally:
        await connection.close()
