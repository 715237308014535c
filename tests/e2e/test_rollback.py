"""Issue 5's acceptance: checkpoints, rollback as compensating events, and fork, through the
`helmline` command against the real services, each in its own process."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

from nats.aio.client import Client as NATS

from helmline.contracts import (
    Actor,
    CompensationCompleted,
    CompensationScheduled,
    PlanStep,
    Playbook,
    RollbackCompleted,
    SessionStarted,
    SessionState,
    WorkspaceRestored,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, auto_approver, eventually

APPROVER = Actor(id="robot", roles=("operator", "approver"))
HELMLINE = str(Path(sys.executable).with_name("helmline"))

Tree = dict[str, tuple[str, int, bytes]]


async def helmline(nats_url: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        *args,
        env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


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


def five_steps() -> Playbook:
    """Writes, a command (which needs an approval), a modification and a deletion."""

    def step(step_id: str, tool: str, after: str | None, **arguments: str) -> PlanStep:
        return PlanStep(
            id=step_id, tool=tool, arguments=arguments, depends_on=(after,) if after else ()
        )

    return Playbook(
        goal="change a workspace five ways",
        steps=(
            step("one", "write_file", None, path="a.txt", content="one\n"),
            step("two", "write_file", "one", path="docs/b.txt", content="two\n"),
            step(
                "three",
                "run_command",
                "two",
                command="echo made > c.txt && mkdir -p out && chmod 600 a.txt",
            ),
            step("four", "write_file", "three", path="a.txt", content="changed\n"),
            step("five", "delete_file", "four", path="docs/b.txt"),
        ),
    )


async def test_a_rolled_back_workspace_is_byte_identical_and_the_session_completes_again(
    services: ServiceProcesses, nc: NATS, store: EventStore, tenant: str
) -> None:
    session_id = "five-steps"
    workspace = services.data_dir / "workspaces" / tenant / session_id
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

        code, out, err = await helmline(services.nats_url, "checkpoints", session_id, *t, "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert [c["step_id"] for c in listed] == ["one", "two", "three", "four", "five"]
        assert all(c["reversible"] for c in listed), listed

        code, out, err = await helmline(
            services.nats_url, "rollback", session_id, "--to", "2", *t, "--json"
        )
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

        code, _, err = await helmline(services.nats_url, "resume", session_id, *t)
        assert code == 0, err
        again = await until(store, tenant, session_id, "completed", "failed")
    assert again.status == "completed", again.outcome
    assert await asyncio.to_thread(tree, workspace) == completed
    assert again.steps["three"].attempts == 2


async def _checkpoints(store: EventStore, tenant: str, session_id: str, count: int) -> bool:
    return len((await store.load(tenant, session_id)).state.checkpoints) == count
