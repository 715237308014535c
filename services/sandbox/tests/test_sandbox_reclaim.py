"""Reclaiming the sandbox's disk: an ended session's workspace leaves it once its latest
snapshot holds it, and comes back from that snapshot before the session's next call."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    Actor,
    Event,
    Payload,
    RollbackState,
    SandboxExecutionRequested,
    SessionCancelled,
    SessionCompleted,
    SessionState,
    StepState,
    Table,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    fold,
    new_event,
)
from helmline.runtime import Deferred, Delivery, EventStore
from helmline.sandbox import SandboxHandler, SandboxSettings, tools_for
from helmline.sandbox._reclaim import (
    CALLS_FINISHING_LOOKS,
    REMOVING_PREFIX,
    Keep,
    Reclaim,
    Wait,
    marker_of,
    reclaim_decision,
    remove_half_removed,
)
from helmline.sandbox._snapshots import WorkspaceSnapshots

ANA = Actor(id="ana")


class Session:
    """One session's events handed to a sandbox handler that reclaims workspaces, as its
    consumer would hand them."""

    def __init__(
        self, store: EventStore, handler: SandboxHandler, tenant: str, workspaces: Path
    ) -> None:
        self.store = store
        self.handler = handler
        self.tenant = tenant
        self.id = uuid.uuid4().hex
        self.workspace = workspaces / tenant / self.id

    async def call(self, tool: str, **arguments: str) -> Event:
        """Run a call; the event that closed it."""
        call_id = f"c-{uuid.uuid4().hex[:8]}"
        request = SandboxExecutionRequested(
            call_id=call_id, step_id=f"step-{call_id}", tool=tool, arguments=arguments
        )
        cause = await self.append(request)
        await self.handler(Delivery(cause, seq=1, deliveries=1))
        for stored in await self.store.read_all(self.tenant, self.id):
            data = stored.event.data
            if isinstance(data, ToolCallCompleted | ToolCallFailed) and data.call_id == call_id:
                return stored.event
        raise AssertionError(f"call {call_id} recorded no outcome")

    async def append(self, payload: Payload) -> Event:
        event = new_event(payload, tenant=self.tenant, session_id=self.id, source="test")
        await self.store.append(event)
        return event

    async def end(self, payload: Payload, deliveries: int = 1) -> None:
        ended = await self.append(payload)
        await self.handler(Delivery(ended, seq=1, deliveries=deliveries))

    async def state(self) -> SessionState:
        return fold(stored.event for stored in await self.store.read_all(self.tenant, self.id))


async def reclaiming_session(
    store: EventStore, js: JetStreamContext, tenant: str, workspaces: Path, max_bytes: int = 1 << 30
) -> Session:
    """A new session of a sandbox that reclaims workspaces under `workspaces`."""
    snapshots = WorkspaceSnapshots(js, max_bytes=max_bytes)
    tools = await tools_for(SandboxSettings())
    handler = SandboxHandler(store, workspaces, tools, snapshots=snapshots, reclaim=True)
    return Session(store, handler, tenant, workspaces)


def content_read(outcome: Event) -> object:
    assert isinstance(outcome.data, ToolCallCompleted), outcome
    assert isinstance(outcome.data.output, dict)
    return outcome.data.output["content"]


async def test_an_ended_sessions_workspace_leaves_the_disk_and_comes_back_for_its_next_call(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    session = await reclaiming_session(store, js, tenant, tmp_path)
    workspace = session.workspace
    await session.call("write_file", path="notes/a.txt", content="kept in the snapshot")
    assert (workspace / "notes" / "a.txt").exists()

    await session.end(SessionCompleted(summary="done"))

    assert not workspace.exists()
    latest = (await session.state()).latest_snapshot_id
    assert latest is not None
    assert marker_of(workspace).read_text() == latest
    assert [p.name for p in (tmp_path / tenant).iterdir()] == [marker_of(workspace).name]
    # Its end delivered again (the service stopped before acknowledging it): nothing changes.
    await session.end(SessionCompleted(summary="done"), deliveries=2)
    assert marker_of(workspace).read_text() == latest

    # A rollback reopens the session, say: its next call finds the workspace as it was.
    read = await session.call("read_file", path="notes/a.txt")
    assert content_read(read) == "kept in the snapshot"
    assert (workspace / "notes" / "a.txt").read_text() == "kept in the snapshot"
    assert not marker_of(workspace).exists()


async def test_a_workspace_whose_latest_snapshot_was_not_stored_stays_on_the_disk(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    # One byte may be stored per snapshot: the file's content is refused.
    session = await reclaiming_session(store, js, tenant, tmp_path, max_bytes=1)
    await session.call("write_file", path="a.txt", content="too big to store")
    assert (await session.state()).unrestorable_snapshots

    await session.end(SessionCompleted(summary="done"))

    workspace = session.workspace
    assert (workspace / "a.txt").read_text() == "too big to store"
    assert not marker_of(workspace).exists()


async def test_an_ended_session_with_a_call_still_running_is_looked_at_again_later(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    session = await reclaiming_session(store, js, tenant, tmp_path)
    await session.call("write_file", path="a.txt", content="a")
    # Cancelled while a command runs (on another replica): its result is not in yet.
    await session.append(ToolCallStarted(call_id="slow", step_id="slow", tool="run_command"))

    with pytest.raises(Deferred, match="step slow"):
        await session.end(SessionCancelled(reason="stop"))
    workspace = session.workspace
    assert (workspace / "a.txt").exists()

    # A call that never finishes keeps the workspace, after the last look.
    cancelled = await session.append(SessionCancelled(reason="stop"))
    await session.handler(Delivery(cancelled, seq=1, deliveries=CALLS_FINISHING_LOOKS))
    assert (workspace / "a.txt").exists()


async def test_a_workspace_that_cannot_be_put_back_fails_the_call_saying_why(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    session = await reclaiming_session(store, js, tenant, tmp_path)
    workspace = session.workspace
    workspace.parent.mkdir(parents=True)
    marker_of(workspace).write_text("snap-no-longer-stored")

    outcome = await session.call("read_file", path="a.txt")

    assert isinstance(outcome.data, ToolCallFailed)
    assert outcome.data.error.kind == "not_found"
    assert "removed from the sandbox's disk" in outcome.data.error.message
    assert "snap-no-longer-stored" in outcome.data.error.message
    assert not workspace.exists()


def test_workspaces_a_crash_left_half_removed_are_deleted_at_start(tmp_path: Path) -> None:
    (tmp_path / "acme" / f"{REMOVING_PREFIX}s1.1a2b" / "deep").mkdir(parents=True)
    (tmp_path / "acme" / f"{REMOVING_PREFIX}s1.1a2b" / "deep" / "f").write_text("x")
    (tmp_path / "acme" / "s2").mkdir()
    (tmp_path / "acme" / "s3.reclaimed").write_text("snap")

    assert remove_half_removed(tmp_path) == 1
    assert sorted(p.name for p in (tmp_path / "acme").iterdir()) == ["s2", "s3.reclaimed"]


ENDED = SessionState(
    status="completed",
    latest_snapshot_id="snap-9",
    steps=Table({"a": StepState(id="a", status="succeeded")}),
)


def ended(**changes: Any) -> SessionState:
    return dataclasses.replace(ENDED, **changes)


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        (ended(), Reclaim("snap-9")),
        (ended(status="failed"), Reclaim("snap-9")),
        (ended(status="paused"), Keep("the session was reopened")),
        (
            ended(
                rollbacks=Table(
                    {
                        "rb": RollbackState(
                            rollback_id="rb", checkpoint_id="cp", requested_by=ANA, status="running"
                        )
                    }
                )
            ),
            Keep("a rollback is under way"),
        ),
        (ended(steps=Table({"b": StepState(id="b", status="running")})), Wait("step b")),
        (ended(steps=Table({"b": StepState(id="b", status="authorized")})), Wait("step b")),
        (ended(steps=Table({"b": StepState(id="b", status="scheduled")})), Reclaim("snap-9")),
        (ended(latest_snapshot_id=None), Keep("no snapshot holds the workspace")),
        (
            ended(unrestorable_snapshots=Table({"snap-9": "above the cap"})),
            Keep("its latest snapshot snap-9 was not stored: above the cap"),
        ),
    ],
)
def test_whether_an_ended_sessions_workspace_may_leave_the_disk(
    state: SessionState, decision: Reclaim | Keep | Wait
) -> None:
    assert reclaim_decision(state) == decision


async def test_a_reclaim_cut_short_after_its_marker_leaves_the_folder_in_charge(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    # Killed between writing the marker and moving the folder: the folder is the truth.
    session = await reclaiming_session(store, js, tenant, tmp_path)
    workspace = session.workspace
    await session.call("write_file", path="a.txt", content="as the call left it")
    marker_of(workspace).write_text("snap-older")

    read = await session.call("read_file", path="a.txt")
    assert content_read(read) == "as the call left it"

    # The end, delivered again, finishes the reclaim with the latest snapshot.
    await session.end(SessionCompleted(summary="done"), deliveries=2)
    assert not workspace.exists()
    assert marker_of(workspace).read_text() == (await session.state()).latest_snapshot_id
