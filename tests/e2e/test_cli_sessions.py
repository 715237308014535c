"""Issue 3's acceptance, driven through the `helmline` command against the real services."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import TypeAdapter

from helmline.contracts import (
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    Event,
    FileChanges,
    SessionCancelRequested,
    SessionPauseRequested,
    SessionState,
    StepScheduled,
    ToolCallFailed,
    authorizations,
    fold,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually

OPERATOR = Actor(id="ana", roles=("operator",))
APPROVER = Actor(id="abe", roles=("approver",))
Helmline = Callable[..., Awaitable[tuple[int, str, str]]]
HELLO = Path(__file__).resolve().parents[2] / "examples" / "playbooks" / "hello.yaml"


async def run_playbook(helmline: Helmline, tenant: str, playbook: Path, *more: str) -> str:
    code, out, err = await helmline(
        "run", "--playbook", str(playbook), "--tenant", tenant, "--json", *more
    )
    assert code == 0, err
    session_id: str = json.loads(out)["session_id"]
    return session_id


async def until(store: EventStore, tenant: str, session_id: str, *statuses: str) -> SessionState:
    async def reached() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.status in statuses else None

    state: SessionState = await eventually(
        reached, timeout_s=30, what=f"session {' or '.join(statuses)}"
    )
    return state


def write_playbook(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def one_step_playbook(
    folder: Path, name: str, *, goal: str, step: str, tool: str, arguments: str
) -> Path:
    """A playbook of one step calling `tool` with `arguments` (a YAML flow mapping)."""
    text = f"goal: {goal}\nsteps:\n  - id: {step}\n    tool: {tool}\n    arguments: {arguments}\n"
    return write_playbook(folder, name, text)


async def test_hello_completes_after_one_approval(
    services: ServiceProcesses, helmline: Helmline, store: EventStore, tenant: str
) -> None:
    session_id = await run_playbook(helmline, tenant, HELLO)
    await until(store, tenant, session_id, "waiting")
    code, _, err = await helmline("approve", session_id, "--tenant", tenant)
    assert code == 0, err
    await until(store, tenant, session_id, "completed")

    async def three_checkpoints() -> SessionState | None:
        code, out, _ = await helmline("show", session_id, "--tenant", tenant, "--json")
        state = TypeAdapter(SessionState).validate_json(out)
        return state if code == 0 and len(state.checkpoints) == 3 else None

    shown: SessionState = await eventually(three_checkpoints, timeout_s=20, what="checkpoints")
    assert [step.status for step in shown.steps.values()] == ["succeeded"] * 3
    # Each checkpoint of a step the sandbox ran says what it changed in the workspace.
    assert {c.step_id: c.changes for c in shown.checkpoints} == {
        "write": FileChanges(created=("notes.txt",)),
        "count": FileChanges(),
        "read": None,
    }
    # As people read it: a read changes nothing either, though nobody had to look.
    code, out, err = await helmline("checkpoints", session_id, "--tenant", tenant)
    assert code == 0, err
    rows = {
        line.split("│")[3].strip(): line.split("│")[6].strip()
        for line in out.splitlines()
        if line.count("│") == 9
    }
    assert rows == {"write": "+notes.txt", "count": "none", "read": "none"}
    counted, read = shown.steps["count"].output, shown.steps["read"].output
    assert isinstance(counted, dict)
    assert isinstance(read, dict)
    assert str(counted["stdout"]).split()[0] == str(len(str(read["content"]).encode()))
    assert "Hello from Helmline." in str(read["content"])
    note = services.data_dir / "workspaces" / tenant / session_id / "notes.txt"
    assert (await asyncio.to_thread(note.read_text)).startswith("Hello from Helmline.")
    logged = fold(item.event for item in await store.read_all(tenant, session_id))
    assert shown == logged


async def test_a_denied_command_never_runs_and_the_session_fails(
    services: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
) -> None:
    playbook = one_step_playbook(
        tmp_path,
        "touch.yaml",
        goal="leave a mark",
        step="mark",
        tool="run_command",
        arguments="{command: touch proof}",
    )
    # Started as someone else, holding a permission a tool might require.
    session_id = await run_playbook(
        helmline, tenant, playbook, "--as", "rita", "--role", "operator", "--role", "repo.write"
    )
    await until(store, tenant, session_id, "waiting")
    code, _, err = await helmline("deny", session_id, "--tenant", tenant, "--comment", "no marks")
    assert code == 0, err
    state = await until(store, tenant, session_id, "failed")
    assert "no marks" in state.outcome
    assert state.requested_by == Actor(id="rita", roles=("operator", "repo.write"))
    proof = services.data_dir / "workspaces" / tenant / session_id / "proof"
    assert not await asyncio.to_thread(proof.exists)


async def test_a_path_outside_the_workspace_is_refused_and_recorded(
    services: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
) -> None:
    playbook = one_step_playbook(
        tmp_path,
        "escape.yaml",
        goal="read what is not mine",
        step="escape",
        tool="read_file",
        arguments="{path: ../../etc/passwd}",
    )
    session_id = await run_playbook(helmline, tenant, playbook)
    state = await until(store, tenant, session_id, "failed", "completed")
    assert state.status == "failed"
    error = state.steps["escape"].error
    assert error is not None
    assert error.kind == "permission"
    assert "../../etc/passwd" in error.message


async def test_pause_stops_new_steps_within_one_step_and_resume_continues(
    services: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
) -> None:
    steps = "".join(
        f"  - id: s{i}\n    tool: echo\n    arguments: {{message: m{i}}}\n"
        + (f"    depends_on: [s{i - 1}]\n" if i else "")
        for i in range(300)
    )
    playbook = write_playbook(tmp_path, "long.yaml", "goal: many echoes\nsteps:\n" + steps)
    session_id = await run_playbook(helmline, tenant, playbook)

    async def under_way() -> bool:
        state = (await store.load(tenant, session_id)).state
        return sum(s.status == "succeeded" for s in state.steps.values()) >= 5

    await eventually(under_way, timeout_s=30, what="five steps done")
    # Appended directly rather than by `helmline pause`: the command's start-up takes longer
    # than this whole session would need to finish.
    first = (await store.read_all(tenant, session_id))[0].event
    await store.append(
        first.derive(SessionPauseRequested(requested_by=OPERATOR), source="test", key="pause")
    )
    await until(store, tenant, session_id, "paused")

    log = await store.read_all(tenant, session_id)
    pause_seq = next(i.seq for i in log if isinstance(i.event.data, SessionPauseRequested))
    late = [i for i in log if i.seq > pause_seq and isinstance(i.event.data, StepScheduled)]
    assert len(late) <= 1, "a step was started after the pause took effect"

    code, _, err = await helmline("resume", session_id, "--tenant", tenant)
    assert code == 0, err
    state = await until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome


async def test_a_call_approved_while_the_session_is_paused_runs_only_once_it_resumes(
    services: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
) -> None:
    playbook = one_step_playbook(
        tmp_path,
        "tally.yaml",
        goal="count the runs",
        step="tally",
        tool="run_command",
        arguments="{command: echo ran >> tally}",
    )
    session_id = await run_playbook(helmline, tenant, playbook)
    await until(store, tenant, session_id, "waiting")
    assert (await helmline("pause", session_id, "--tenant", tenant))[0] == 0
    await until(store, tenant, session_id, "paused")
    code, _, err = await helmline("approve", session_id, "--tenant", tenant)
    assert code == 0, err

    # The approval service handles a session's events in order: once it has answered a
    # later vote, it has recorded all it decided on the grant.
    first = (await store.read_all(tenant, session_id))[0].event
    again = ApprovalDecisionSubmitted(request_id="tally.1", decision="grant", decided_by=APPROVER)
    await store.append(first.derive(again, source="test", key="again"))

    async def answered() -> list[Event] | None:
        log = [item.event for item in await store.read_all(tenant, session_id)]
        return log if any(isinstance(e.data, ApprovalDecisionRefused) for e in log) else None

    log: list[Event] = await eventually(answered, timeout_s=20, what="the second vote answered")
    assert any(isinstance(e.data, ApprovalGranted) for e in log)
    assert not list(authorizations(log))
    state = fold(log)
    assert (state.status, state.steps["tally"].status) == ("paused", "scheduled")
    tally = services.data_dir / "workspaces" / tenant / session_id / "tally"
    assert not await asyncio.to_thread(tally.exists)

    code, _, err = await helmline("resume", session_id, "--tenant", tenant)
    assert code == 0, err
    state = await until(store, tenant, session_id, "completed", "failed")
    assert state.status == "completed", state.outcome
    assert await asyncio.to_thread(tally.read_text) == "ran\n"
    log = [item.event for item in await store.read_all(tenant, session_id)]
    authorized = [call for _, call in authorizations(log)]
    assert [a.approval_request_id for a in authorized] == ["tally.1"]


async def test_cancel_kills_a_running_command_within_two_seconds(
    services: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    tenant: str,
    tmp_path: Path,
) -> None:
    playbook = one_step_playbook(
        tmp_path,
        "sleep.yaml",
        goal="wait a long time",
        step="nap",
        tool="run_command",
        arguments="{command: sleep 60}",
    )
    session_id = await run_playbook(helmline, tenant, playbook)
    await until(store, tenant, session_id, "waiting")
    assert (await helmline("approve", session_id, "--tenant", tenant))[0] == 0

    async def running() -> bool:
        state = (await store.load(tenant, session_id)).state
        return state.steps["nap"].status == "running"

    await eventually(running, timeout_s=30, what="the command running")
    began = time.monotonic()
    assert (await helmline("cancel", session_id, "--tenant", tenant))[0] == 0

    async def killed() -> ToolCallFailed | None:
        for item in await store.read_all(tenant, session_id):
            if isinstance(item.event.data, ToolCallFailed):
                return item.event.data
        return None

    failure: ToolCallFailed = await eventually(killed, timeout_s=10, what="the command killed")
    assert failure.error.kind == "cancelled"
    log = [item.event for item in await store.read_all(tenant, session_id)]
    asked = next(e.time for e in log if isinstance(e.data, SessionCancelRequested))
    ended = next(e.time for e in log if isinstance(e.data, ToolCallFailed))
    assert (ended - asked).total_seconds() < 2.0
    assert time.monotonic() - began < 10
    state = (await store.load(tenant, session_id)).state
    assert state.status == "cancelled"
