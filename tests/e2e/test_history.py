"""Issue 38: history is never acted on. A session's events met again, by an import into a
fresh stack, a log restored from its mirror, a consumer reset to the start or a projection
rebuild, re-run nothing: the log gains no event and no tool runs again. The witness is the
ledger of the test's own MCP server, one line per real invocation, which the stack never
reads; and, for the built-in tools, the sandbox's workspaces on the stack's disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamConfig, StreamSource

from helmline.contracts import EVENTS_STREAM, SERVICE_CONSUMERS, Actor, PlanStep, Playbook
from helmline.runtime import EventStore, connect_nats, consumer_config, stream_config
from helmline.runtime.testing import (
    NatsServer,
    ServiceProcesses,
    auto_approver,
    checkpointed,
    eventually,
    run_playbook,
)

from .conftest import helmline_at
from .mcp_servers import federating_stack, until_federated

APPROVER = Actor(id="robot", roles=("operator", "approver"))
WITNESS_SERVER = Path(__file__).with_name("tickets_mcp_server.py")


def _playbooks() -> list[Playbook]:
    """Built-in file tools; an MCP `write_file`; an MCP call that needs an approval."""
    return [
        Playbook(
            goal="write then read",
            steps=(
                PlanStep(id="w", tool="write_file", arguments={"path": "a.txt", "content": "hi"}),
                PlanStep(id="r", tool="read_file", arguments={"path": "a.txt"}, depends_on=("w",)),
            ),
        ),
        Playbook(
            goal="write through MCP",
            steps=(
                PlanStep(
                    id="w",
                    tool="tickets__write_file",
                    arguments={"name": "b.txt", "content": "hi"},
                ),
            ),
        ),
        Playbook(
            goal="notify, once approved",
            steps=(PlanStep(id="n", tool="tickets__notify", arguments={"message": "hi"}),),
        ),
    ]


@dataclass
class Stack:
    """A nats-server of its own with every service on it, federating the witness server."""

    url: str
    services: ServiceProcesses
    nc: NATS

    @property
    def js(self) -> JetStreamContext:
        return self.nc.jetstream()

    @property
    def store(self) -> EventStore:
        return EventStore(self.js)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every call the witness MCP server served, one JSON line each."""
    return tmp_path_factory.mktemp("witness") / "ledger.jsonl"


def _witness_servers(ledger: Path) -> list[dict[str, Any]]:
    return [
        {
            "id": "tickets",
            "stdio": {"command": sys.executable, "args": [str(WITNESS_SERVER), str(ledger)]},
            "sandbox": {"write": [str(ledger.parent)]},
            "risk": "low",
            "tools": {"notify": {"risk": "high"}},
        }
    ]


@pytest.fixture
async def stack(tmp_path: Path, ledger: Path) -> AsyncIterator[Stack]:
    """A stack of the test's own: what the test resets or restores touches no other test."""
    async with _stack(tmp_path / "origin", ledger) as started:
        yield started


@contextlib.asynccontextmanager
async def _stack(folder: Path, ledger: Path) -> AsyncIterator[Stack]:
    await asyncio.to_thread(folder.mkdir, parents=True)
    server = NatsServer(folder)
    with server, federating_stack(server.url, folder, _witness_servers(ledger)) as services:
        nc = await connect_nats(server.url)
        try:
            await until_federated(nc.jetstream(), "tickets")
            yield Stack(server.url, services, nc)
        finally:
            await nc.close()


async def _run_sessions(stack: Stack, tenant: str) -> list[str]:
    """Run every playbook to its end and its last checkpoint; the sessions' ids."""
    async with auto_approver(stack.nc, stack.store, tenant, APPROVER):
        ids = await asyncio.gather(
            *(run_playbook(stack.store, tenant, p, APPROVER) for p in _playbooks())
        )
    for session_id in ids:
        state = await checkpointed(stack.store, tenant, session_id)
        assert state.status == "completed", state.outcome
    return list(ids)


async def _logs(store: EventStore, tenant: str, ids: list[str]) -> dict[str, list[str]]:
    """Each session's event ids, in the log's order."""
    return {
        session_id: [str(s.event.id) for s in await store.read_all(tenant, session_id)]
        for session_id in ids
    }


async def _settled(js: JetStreamContext) -> None:
    """Wait until every consumer of the stack has handled every event, and nothing was
    appended while that was checked (a service acting on history appends before it
    acknowledges, and what it appends is then pending for another)."""

    async def quiet() -> bool:
        before = (await js.stream_info(EVENTS_STREAM.name)).state.last_seq
        consumers = await js.consumers_info(EVENTS_STREAM.name)
        idle = all(not c.num_pending and not c.num_ack_pending for c in consumers)
        after = (await js.stream_info(EVENTS_STREAM.name)).state.last_seq
        return idle and before == after and bool(consumers)

    await eventually(quiet, timeout_s=60, interval_s=0.2, what="every consumer idle")


def _invocations(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def _workspaces(services: ServiceProcesses, tenant: str) -> list[str]:
    """The sessions of the tenant whose workspace the stack's sandbox made on its disk."""
    folder = services.data_dir / "workspaces" / tenant
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_an_import_into_a_fresh_stack_stores_the_export_and_runs_nothing(
    stack: Stack, ledger: Path, tenant: str, tmp_path: Path
) -> None:
    ids = await _run_sessions(stack, tenant)
    exported = await _logs(stack.store, tenant, ids)
    ran = _invocations(ledger)
    assert len(ran) == 2  # The MCP write and the approved notice.
    there = helmline_at(stack.url)
    export = tmp_path / "sessions.ndjson"
    code, _, err = await there("export", "--all", "-t", tenant, "-o", str(export))
    assert code == 0, err

    async with _stack(tmp_path / "fresh", ledger) as fresh:
        here = helmline_at(fresh.url)
        for attempt in range(2):
            code, out, err = await here("import", str(export), "--json")
            assert code == 0, err
            events = sum(len(log) for log in exported.values())
            assert json.loads(out)["appended"] == (events if attempt == 0 else 0)
            await _settled(fresh.js)

        assert await _logs(fresh.store, tenant, ids) == exported
        for session_id in ids:
            shown = [await run("show", session_id, "-t", tenant, "--json") for run in (there, here)]
            assert shown[0] == shown[1]
        assert _invocations(ledger) == ran
        assert _workspaces(fresh.services, tenant) == []


async def test_a_log_restored_from_its_mirror_runs_nothing_again(
    stack: Stack, ledger: Path, tenant: str
) -> None:
    ids = await _run_sessions(stack, tenant)
    before = await _logs(stack.store, tenant, ids)
    ran = _invocations(ledger)
    mirror = StreamConfig(
        name="HELMLINE_EVENTS_MIRROR", mirror=StreamSource(name=EVENTS_STREAM.name)
    )
    await stack.js.add_stream(mirror)
    end = (await stack.js.stream_info(EVENTS_STREAM.name)).state.last_seq

    async def mirrored() -> bool:
        return (await stack.js.stream_info(mirror.name)).state.last_seq == end

    await eventually(mirrored, what="the mirror to catch up")

    # The log is lost and restored from its mirror (made a stream of its own first, or it
    # would mirror the stream it restores); the services start on the restored log (their
    # consumers went with the old one).
    stack.services.stop_all()
    await stack.js.delete_stream(EVENTS_STREAM.name)
    promoted = (await stack.js.stream_info(mirror.name)).config
    promoted.mirror = None
    await stack.js.update_stream(promoted)
    restored = stream_config(EVENTS_STREAM)
    restored.sources = [StreamSource(name=mirror.name)]
    await stack.js.add_stream(restored)

    async def restored_all() -> bool:
        info = await stack.js.stream_info(EVENTS_STREAM.name)
        return info.state.messages == (await stack.js.stream_info(mirror.name)).state.messages

    await eventually(restored_all, what="the log restored")
    for name in stack.services.ports:
        stack.services.start(name)
    await _settled(stack.js)

    assert await _logs(stack.store, tenant, ids) == before
    assert _invocations(ledger) == ran


async def test_a_consumer_reset_to_the_start_runs_nothing_again(
    stack: Stack, ledger: Path, tenant: str
) -> None:
    ids = await _run_sessions(stack, tenant)
    before = await _logs(stack.store, tenant, ids)
    ran = _invocations(ledger)
    workspaces = _workspaces(stack.services, tenant)

    # Each service's consumer made again while it runs: it is handed the whole log anew.
    for spec in SERVICE_CONSUMERS:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await stack.js.delete_consumer(spec.stream, spec.durable)
            await stack.js.add_consumer(spec.stream, consumer_config(spec))
    await _settled(stack.js)

    assert await _logs(stack.store, tenant, ids) == before
    assert _invocations(ledger) == ran
    assert _workspaces(stack.services, tenant) == workspaces


async def test_a_projection_rebuild_runs_nothing_again(
    stack: Stack, ledger: Path, tenant: str, own_postgres: Any
) -> None:
    ids = await _run_sessions(stack, tenant)
    before = await _logs(stack.store, tenant, ids)
    ran = _invocations(ledger)

    rebuild = helmline_at(stack.url, HELMLINE_DATABASE_URL=own_postgres.url)
    code, _, err = await rebuild("projections", "rebuild")
    assert code == 0, err
    code, out, err = await rebuild("sessions", "-t", tenant, "--json")
    assert code == 0, err
    assert len(json.loads(out)) == len(ids)
    await _settled(stack.js)

    assert await _logs(stack.store, tenant, ids) == before
    assert _invocations(ledger) == ran
