"""Fixtures shared by every test: a real nats-server, connections, unique tenants."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from helmline.runtime import EventStore, ensure_topology
from helmline.runtime.testing import NatsServer


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real nats-server with JetStream for the whole run, on a free port."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    """A connection to that server, with Helmline's streams and buckets provisioned."""
    connection = await nats.connect(nats_url)
    await ensure_topology(connection.jetstream())
    yield connection
    await connection.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    """JetStream on the test connection."""
    return nc.jetstream()


@pytest.fixture
def store(js: JetStreamContext) -> EventStore:
    """The event store."""
    return EventStore(js)


@pytest.fixture
def tenant() -> str:
    """A tenant of its own for each test, so tests never see each other's events."""
    return f"t{uuid.uuid4().hex[:12]}"
