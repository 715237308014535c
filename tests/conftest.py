"""Fixtures of the whole-system tests (services as processes, the API, the stack)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helmline.runtime.testing import NatsServer


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server of the module's own, in place of the run's shared one.

    Services started as processes consume through durable consumers that begin at the
    stream's first event; on a server shared with earlier modules each new stack would first
    work through every event those modules appended, which makes tests slow and their
    deadlines depend on what ran before.
    """
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server.url
