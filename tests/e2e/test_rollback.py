"""Issue 5's acceptance: checkpoints, rollback as compensating events, and fork, through the
`helmline` command against the real services, each in its own process."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from helmline.contracts import (
    SANDBOX_CONSUMER,
    STATE_CONSUMER,
    Actor,
    CompensationCompleted,
    CompensationScheduled,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRequested,
    RollbackState,
    SessionStarted,
    SessionState,
    ToolCallCompleted,
    WorkspaceRestored,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, auto_approver, eventually

from .mcp_servers import federating_stack, until_federated

APPROVER = Actor(id="robot", roles=("operator", "approver"))
TICKETS_SERVER = Path(__file__).with_name("tickets_mcp_server.py")

Helmline = Callable[..., Awaitable[tuple[int, str, str]]]

Tree = dict[str, tuple[str, int, bytes]]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every call the tickets MCP server served, one JSON line each."""
    return tmp_path_factory.mktemp("tickets") / "ledger.jsonl"


@pytest.fixture(scope="module")
def stack(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory, ledger: Path
) -> Iterator[ServiceProcesses]:
    """Every service as a process; the gateway federates the tickets server, whose
    `open_ticket` declares `close_ticket` (by the id it returned) as its inverse, and the
    time server, whose tools say they are read-only and nothing more."""
    inverse = {"tool": "tickets__close_ticket", "arguments": {"id": "/result/id"}}
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    servers = [
        {"id": "time", "stdio": time_server, "risk": "low"},
        {
            "id": "tickets",
            "stdio": {"command": sys.executable, "args": [str(TICKETS_SERVER), str(ledger)]},
            "sandbox": {"write": [str(ledger.parent)]},
            "risk": "low",
            "tools": {
                "open_ticket": {"inverse": inverse},
                # Closing needs a person: a rollback then waits, and can be cut there.
                "close_ticket": {"risk": "high"},
            },
        },
    ]
    with federating_stack(nats_url, tmp_path_factory.mktemp("stack"), servers) as running:
        yield running


@pytest.fixture
async def tickets(stack: ServiceProcesses, js: JetStreamContext) -> None:
    """Wait until the gateway federates the tickets server."""
    await until_federated(js, "tickets")


@pytest.fixture
async def clock(stack: ServiceProcesses, js: JetStreamContext) -> None:
    """Wait until the gateway federates the time server."""
    await until_federated(js, "time")


def tree(folder: Path) -> Tree:
    """Every entry under `folder`: kind, permission bits and content (link target)."""
    found: Tree = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        relative = str(path.relative_to(folder))
        if stat.S_ISLNK(info.st_mode):
            found[relative] = ("link", 0, os.readlink(path).encode())
        elif stat.S_ISDIR(info.st_mode):
            found[relative] = ("dir", stat.S_IMODE(info.st_mode), b"")
        else:
            found[relative] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return found


async def start(store: EventStore, tenant: str, session_id: str, playbook: Playbook) -> None:
    started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=APPROVER)
    await store.append(new_event(started, tenant=tenant, session_id=session_id, source="test"))


async def until(store: EventStore, tenant: str, session_id: str, *statuses: str) -> SessionState:
    async def reached() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.status in statuses else None

    state: SessionState = await eventually(
        reached, timeout_s=60, what=f"session {' or '.join(statuses)}"
    )
    return state


def chain(goal: str, *steps: tuple[str, str, dict[str, str]]) -> Playbook:
    """A playbook whose steps run one after the other."""
    return Playbook(
        goal=goal,
        steps=tuple(
            PlanStep(
                id=step_id,
                tool=tool,
                arguments=arguments,
                depends_on=(steps[index - 1][0],) if index else (),
            )
            for index, (step_id, tool, arguments) in enumerate(steps)
        ),
    )


def five_steps() -> Playbook:
    """Writes, a command (which needs an approval), a modification and a deletion."""
    command = "echo made > c.txt && mkdir -p out && chmod 600 a.txt"
    return chain(
        "change a workspace five ways",
        ("one", "write_file", {"path": "a.txt", "content": "one\n"}),
        ("two", "write_file", {"path": "docs/b.txt", "content": "two\n"}),
        ("three", "run_command", {"command": command}),
        ("four", "write_file", {"path": "a.txt", "content": "changed\n"}),
        ("five", "delete_file", {"path": "docs/b.txt"}),
    )


def write(step_id: str, path: str) -> tuple[str, str, dict[str, str]]:
    return (step_id, "write_file", {"path": path, "content": f"{step_id}\n"})


def open_ticket(step_id: str) -> tuple[str, str, dict[str, str]]:
    return (step_id, "tickets__open_ticket", {"title": step_id})


def ledger_calls(ledger: Path) -> list[dict[str, object]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines()]


async def ticket_ids(store: EventStore, tenant: str, session_id: str) -> list[int]:
    """The ids of the tickets the session opened, as the tool returned them."""
    ids = []
    for stored in await store.read_all(tenant, session_id):
        data = stored.event.data
        if isinstance(data, ToolCallCompleted) and data.tool == "tickets__open_ticket":
            assert isinstance(data.output, dict)
            ids.append(int(str(data.output["id"])))
    return ids


async def test_a_rolled_back_workspace_is_byte_identical_and_the_session_completes_again(
    stack: ServiceProcesses, nc: NATS, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    session_id = "five-steps"
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    t = ("--tenant", tenant)
    async with auto_approver(nc, store, tenant, APPROVER) as approver:
        # The command waits for its approval after checkpoint 2: the workspace is then
        # exactly what checkpoint 2 captured, and is kept for comparison.
        approver.holding = True
        await start(store, tenant, session_id, five_steps())
        await until(store, tenant, session_id, "waiting")
        at_checkpoint_2 = await asyncio.to_thread(tree, workspace)
        assert set(at_checkpoint_2) == {"a.txt", "docs", "docs/b.txt"}
        await approver.release()
        finished = await until(store, tenant, session_id, "completed", "failed")
        assert finished.status == "completed", finished.outcome
        await eventually(
            lambda: _checkpoints(store, tenant, session_id, 5), timeout_s=30, what="5 checkpoints"
        )
        completed = await asyncio.to_thread(tree, workspace)
        assert completed != at_checkpoint_2
        before = [stored.event for stored in await store.read_all(tenant, session_id)]

        code, out, err = await helmline("checkpoints", session_id, *t, "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert [c["step_id"] for c in listed] == ["one", "two", "three", "four", "five"]
        assert all(c["reversible"] for c in listed), listed

        code, out, err = await helmline("rollback", session_id, "--to", "2", *t, "--json")
        assert code == 0, (out, err)
        report = json.loads(out)
        assert report["status"] == "completed"
        assert report["undone_steps"] == ["five", "four", "three"]
        assert await asyncio.to_thread(tree, workspace) == at_checkpoint_2

        after = [stored.event for stored in await store.read_all(tenant, session_id)]
        assert after[: len(before)] == before, "the log keeps every original event"
        added = [type(event.data) for event in after[len(before) :]]
        assert CompensationScheduled in added
        assert WorkspaceRestored in added
        assert CompensationCompleted in added
        assert added[-1] is RollbackCompleted
        paused = await until(store, tenant, session_id, "paused")
        assert [c.step_id for c in paused.checkpoints] == ["one", "two"]
        assert {s.id: s.status for s in paused.steps.values()} == {
            "one": "succeeded",
            "two": "succeeded",
            "three": "undone",
            "four": "undone",
            "five": "undone",
        }

        code, _, err = await helmline("resume", session_id, *t)
        assert code == 0, err
        again = await until(store, tenant, session_id, "completed", "failed")
    assert again.status == "completed", again.outcome
    assert await asyncio.to_thread(tree, workspace) == completed
    assert again.steps["three"].attempts == 2


async def _checkpoints(
    store: EventStore, tenant: str, session_id: str, count: int
) -> SessionState | None:
    state = (await store.load(tenant, session_id)).state
    return state if len(state.checkpoints) == count else None


async def completed_with_checkpoints(
    store: EventStore, tenant: str, session_id: str, playbook: Playbook
) -> SessionState:
    """Run the playbook to its end; the session once each of its steps has a checkpoint."""
    await start(store, tenant, session_id, playbook)
    done = await until(store, tenant, session_id, "completed", "failed")
    assert done.status == "completed", done.outcome
    count = len(playbook.steps)
    state: SessionState = await eventually(
        lambda: _checkpoints(store, tenant, session_id, count),
        timeout_s=30,
        what=f"{count} checkpoints",
    )
    return state


async def test_rolling_back_past_an_external_call_calls_its_inverse_exactly_once(
    stack: ServiceProcesses,
    tickets: None,
    nc: NATS,
    store: EventStore,
    tenant: str,
    ledger: Path,
    helmline: Helmline,
) -> None:
    session_id = "inverse"
    playbook = chain(
        "open a ticket between two writes",
        write("first", "a.txt"),
        ("say", "echo", {"message": "hello"}),
        open_ticket("ticket"),
        write("last", "b.txt"),
    )
    await completed_with_checkpoints(store, tenant, session_id, playbook)
    (ticket,) = await ticket_ids(store, tenant, session_id)

    async with auto_approver(nc, store, tenant, APPROVER):
        code, out, err = await helmline(
            "rollback", session_id, "--to", "1", "--tenant", tenant, "--json"
        )
        # The undo call needs a person: the command says so (exit 3) and the rollback goes on.
        assert code == 3, (out, err)
        rollback = await ended(store, tenant, session_id, json.loads(out)["rollback_id"])

    assert rollback.status == "completed", rollback
    assert rollback.undone_steps == ("last", "ticket", "say")
    closes = [c for c in ledger_calls(ledger) if c["call"] == "close" and c["id"] == ticket]
    assert len(closes) == 1
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    assert set(await asyncio.to_thread(tree, workspace)) == {"a.txt"}


async def test_a_read_only_mcp_tool_does_not_stand_in_the_way_of_a_rollback(
    stack: ServiceProcesses, clock: None, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    # mcp-server-time's tools say `readOnlyHint: true`, and the servers file says nothing of
    # their effect: read-only, they change nothing, so nothing is left to undo.
    session_id = "read-only"
    playbook = chain(
        "ask the time between two writes",
        write("first", "a.txt"),
        ("now", "time__get_current_time", {"timezone": "UTC"}),
        write("last", "b.txt"),
    )
    await completed_with_checkpoints(store, tenant, session_id, playbook)
    t = ("--tenant", tenant)
    code, out, err = await helmline("checkpoints", session_id, *t, "--json")
    assert code == 0, err
    assert [(c["step_id"], c["reversible"]) for c in json.loads(out)] == [
        ("first", True),
        ("now", True),
        ("last", True),
    ]

    code, out, err = await helmline("rollback", session_id, "--to", "1", *t, "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["status"] == "completed", report
    assert report["undone_steps"] == ["last", "now"]
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    assert set(await asyncio.to_thread(tree, workspace)) == {"a.txt"}


async def test_an_irreversible_step_refuses_the_rollback_unless_partial_is_accepted(
    stack: ServiceProcesses,
    tickets: None,
    nc: NATS,
    store: EventStore,
    tenant: str,
    ledger: Path,
    helmline: Helmline,
) -> None:
    session_id = "irreversible"
    playbook = chain(
        "send a notice between writes",
        write("first", "a.txt"),
        ("notice", "tickets__notify", {"message": f"hello from {tenant}"}),
        open_ticket("ticket"),
        write("last", "b.txt"),
    )
    await completed_with_checkpoints(store, tenant, session_id, playbook)
    t = ("--tenant", tenant)
    code, out, err = await helmline("checkpoints", session_id, *t, "--json")
    assert code == 0, err
    assert [c["reversible"] for c in json.loads(out)] == [True, False, True, True]

    code, out, err = await helmline("rollback", session_id, "--to", "1", *t)
    assert code == 1
    assert "steps notice cannot be undone" in err
    assert (stack.data_dir / "workspaces" / tenant / session_id / "b.txt").exists()
    (ticket,) = await ticket_ids(store, tenant, session_id)
    assert not [c for c in ledger_calls(ledger) if c["call"] == "close" and c["id"] == ticket]

    async with auto_approver(nc, store, tenant, APPROVER):
        code, out, err = await helmline(
            "rollback", session_id, "--to-step", "first", "--accept-partial", *t
        )
        assert code == 3, (out, err)
        assert "an undo call waits for approval" in err
        rollback_id = list((await store.load(tenant, session_id)).state.rollbacks)[-1]
        rollback = await ended(store, tenant, session_id, rollback_id)
    assert rollback.status == "completed", rollback
    assert rollback.undone_steps == ("last", "ticket")
    assert rollback.not_undone_steps == ("notice",)
    assert [c for c in ledger_calls(ledger) if c["call"] == "close" and c["id"] == ticket]
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    assert set(await asyncio.to_thread(tree, workspace)) == {"a.txt"}


async def test_a_rollback_under_a_call_waiting_for_a_person_is_refused_naming_its_request(
    stack: ServiceProcesses, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    session_id = "asks-first"
    command = ("count", "run_command", {"command": "wc -c a.txt > count.txt"})
    await start(store, tenant, session_id, chain("write, then ask", write("one", "a.txt"), command))
    await until(store, tenant, session_id, "waiting")
    await eventually(
        lambda: _checkpoints(store, tenant, session_id, 1), timeout_s=30, what="1 checkpoint"
    )
    t = ("--tenant", tenant)
    code, _, err = await helmline("pause", session_id, *t)
    assert code == 0, err
    await until(store, tenant, session_id, "paused")

    code, out, err = await helmline("rollback", session_id, "--to", "1", *t)

    # Refused, not taken for an undo call waiting (the request is the plan's own); and a
    # paused session is not told to pause.
    assert code == 1, (out, err)
    (request,) = (await store.load(tenant, session_id)).state.pending_approvals
    assert f"rollback refused: step count waits for a decision on {request.request_id}" in err
    assert "pause" not in err
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    assert (workspace / "a.txt").exists()
    assert not (workspace / "count.txt").exists()


async def test_a_rollback_survives_killing_the_state_and_sandbox_services_undoing_each_once(
    stack: ServiceProcesses,
    tickets: None,
    nc: NATS,
    store: EventStore,
    tenant: str,
    ledger: Path,
    helmline: Helmline,
) -> None:
    session_id = "killed"
    playbook = chain(
        "interleave writes and tickets",
        write("w1", "one.txt"),
        open_ticket("t1"),
        write("w2", "two.txt"),
        open_ticket("t2"),
        write("w3", "docs/three.txt"),
    )
    state = await completed_with_checkpoints(store, tenant, session_id, playbook)
    workspace = stack.data_dir / "workspaces" / tenant / session_id
    opened = await ticket_ids(store, tenant, session_id)
    first = (await store.read_all(tenant, session_id))[0].event
    checkpoint = state.checkpoints[0].checkpoint_id
    requested = RollbackRequested(
        rollback_id="rb-killed", checkpoint_id=checkpoint, requested_by=APPROVER
    )
    async with auto_approver(nc, store, tenant, APPROVER) as approver:
        approver.holding = True
        await store.append(first.derive(requested, source="test"))
        # Cut once as the workspace restore is scheduled, once while an undo call waits.
        await eventually(
            lambda: _logged(store, tenant, session_id, CompensationScheduled),
            timeout_s=30,
            what="a compensation scheduled",
        )
        for victim in ("state", "sandbox"):
            stack.kill(victim)
            await asyncio.to_thread(stack.start, victim)
        # Each service killed may have held a message of the rollback in flight (the state
        # service nearly always does): JetStream delivers it again only after its consumer's
        # ack_wait, so the rollback may go on only after one such wait per kill.
        recovery_s = STATE_CONSUMER.ack_wait_s + SANDBOX_CONSUMER.ack_wait_s + 30
        try:
            waiting: SessionState = await eventually(
                lambda: _undo_waiting(store, tenant, session_id),
                timeout_s=recovery_s,
                what="an undo call waiting for its approval",
            )
        except TimeoutError as error:
            log = await _timeline(store, tenant, session_id)
            raise AssertionError(f"{error}; the log:\n{log}") from error
        assert waiting.rollbacks["rb-killed"].active
        stack.kill("state")
        await asyncio.to_thread(stack.start, "state")
        await approver.release()

        async def rolled_back() -> SessionState | None:
            now = (await store.load(tenant, session_id)).state
            return now if not now.rollbacks["rb-killed"].active else None

        after: SessionState = await eventually(
            rolled_back, timeout_s=60, what="the rollback to end"
        )
    assert after.rollbacks["rb-killed"].status == "completed", after.rollbacks["rb-killed"]
    events = [stored.event.data for stored in await store.read_all(tenant, session_id)]
    scheduled = Counter(e.compensation_id for e in events if isinstance(e, CompensationScheduled))
    completed = Counter(e.compensation_id for e in events if isinstance(e, CompensationCompleted))
    restored = Counter(e.compensation_id for e in events if isinstance(e, WorkspaceRestored))
    assert len(scheduled) == 3, scheduled
    assert set(scheduled.values()) == set(completed.values()) == {1}
    assert list(restored.values()) == [1]
    closes = Counter(c["id"] for c in ledger_calls(ledger) if c["call"] == "close")
    assert [closes[ticket] for ticket in opened] == [1, 1]
    assert set(await asyncio.to_thread(tree, workspace)) == {"one.txt"}


async def test_a_fork_at_checkpoint_10_completes_on_its_own_and_leaves_its_origin_alone(
    stack: ServiceProcesses, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    session_id = "origin"
    playbook = chain("twelve files", *(write(f"s{i}", f"f{i}.txt") for i in range(1, 13)))
    done = await completed_with_checkpoints(store, tenant, session_id, playbook)
    origin_log = await store.read_all(tenant, session_id)

    code, out, err = await helmline("fork", session_id, "--at", "10", "--tenant", tenant, "--json")

    assert code == 0, err
    fork_id = json.loads(out)["session_id"]
    forked = await until(store, tenant, fork_id, "completed", "failed")
    assert forked.status == "completed", forked.outcome
    assert forked.fork_of is not None
    assert (forked.fork_of.session_id, forked.fork_of.checkpoint_id) == (
        session_id,
        done.checkpoints[9].checkpoint_id,
    )
    fork_log = [stored.event.data for stored in await store.read_all(tenant, fork_id)]
    ran = [e.step_id for e in fork_log if isinstance(e, ToolCallCompleted)]
    assert ran == ["s11", "s12"]
    assert all(step.status == "succeeded" for step in forked.steps.values())
    origin_workspace = stack.data_dir / "workspaces" / tenant / session_id
    fork_workspace = stack.data_dir / "workspaces" / tenant / fork_id
    assert await asyncio.to_thread(tree, fork_workspace) == await asyncio.to_thread(
        tree, origin_workspace
    )
    assert await store.read_all(tenant, session_id) == origin_log

    # Without --at: from the latest checkpoint, as a retry of what failed after it would be.
    code, out, err = await helmline("fork", session_id, "--tenant", tenant, "--json")
    assert code == 0, err
    latest = await until(store, tenant, json.loads(out)["session_id"], "completed", "failed")
    assert latest.fork_of is not None
    assert latest.fork_of.checkpoint_id == done.checkpoints[-1].checkpoint_id
    assert latest.status == "completed", latest.outcome
    # That fork ran no step, so it has no checkpoint of its own to fork from.
    code, _, err = await helmline("fork", latest.session_id, "--tenant", tenant)
    assert code == 2
    assert f"session {latest.session_id} has no checkpoint yet" in err


async def _logged(store: EventStore, tenant: str, session_id: str, kind: type) -> bool:
    return any(isinstance(s.event.data, kind) for s in await store.read_all(tenant, session_id))


async def _timeline(store: EventStore, tenant: str, session_id: str) -> str:
    """The session's log, one event a line: what a failure shows of how far it got."""
    return "\n".join(
        f"{s.seq} {s.event.time:%H:%M:%S.%f} {s.event.source} {s.event.type}"
        for s in await store.read_all(tenant, session_id)
    )


async def _undo_waiting(store: EventStore, tenant: str, session_id: str) -> SessionState | None:
    state = (await store.load(tenant, session_id)).state
    return state if state.pending_approvals else None


async def ended(store: EventStore, tenant: str, session_id: str, rollback_id: str) -> RollbackState:
    async def over() -> RollbackState | None:
        rollback = (await store.load(tenant, session_id)).state.rollbacks[rollback_id]
        return rollback if not rollback.active else None

    rollback: RollbackState = await eventually(over, timeout_s=60, what="the rollback to end")
    return rollback
