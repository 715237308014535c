"""A sandbox that reclaims its disk, as the Helm chart runs it: an ended session's workspace
leaves the disk, what the session made stays readable from its snapshots, and a rollback and
a resume work on the workspace put back from them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from helmline.contracts import PlanStep, Playbook
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, eventually

from .conftest import SERVICES, Helmline
from .test_rollback import start, until


@pytest.fixture(scope="module")
def reclaiming(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcesses]:
    running = ServiceProcesses(nats_url, tmp_path_factory.mktemp("stack"))
    reclaim = {"HELMLINE_RECLAIM_WORKSPACES": "true"}
    try:
        for name in SERVICES:
            running.start(name, reclaim if name == "sandbox" else None)
        yield running
    finally:
        running.stop_all()


def three_writes() -> Playbook:
    writes = [("one", "a.txt", "one"), ("two", "b.txt", "two"), ("three", "a.txt", "three")]
    return Playbook(
        goal="write, write, overwrite",
        steps=tuple(
            PlanStep(
                id=step_id,
                tool="write_file",
                arguments={"path": path, "content": content},
                depends_on=(writes[index - 1][0],) if index else (),
            )
            for index, (step_id, path, content) in enumerate(writes)
        ),
    )


async def reclaimed(workspace: Path) -> bool:
    gone = not await asyncio.to_thread(workspace.exists)
    marked = await asyncio.to_thread(workspace.with_name(workspace.name + ".reclaimed").exists)
    return gone and marked


async def test_a_reclaimed_workspace_is_read_rolled_back_and_resumed_from_its_snapshots(
    reclaiming: ServiceProcesses, store: EventStore, tenant: str, helmline: Helmline
) -> None:
    session_id = uuid.uuid4().hex
    workspace = reclaiming.data_dir / "workspaces" / tenant / session_id
    t = ("--tenant", tenant)
    await start(store, tenant, session_id, three_writes())
    await until(store, tenant, session_id, "completed")
    await eventually(lambda: reclaimed(workspace), timeout_s=30, what="the workspace reclaimed")

    code, out, err = await helmline("workspace", session_id, "cat", "a.txt", *t)
    assert (code, out) == (0, "three"), err

    # Back to the first checkpoint: the sandbox restores the workspace onto its disk.
    code, out, err = await helmline("rollback", session_id, "--to", "1", *t, "--json")
    assert code == 0, (out, err)
    assert await asyncio.to_thread((workspace / "a.txt").read_text) == "one"
    assert not await asyncio.to_thread((workspace / "b.txt").exists)

    code, _, err = await helmline("resume", session_id, *t)
    assert code == 0, err
    again = await until(store, tenant, session_id, "completed", "failed")
    assert again.status == "completed", again.outcome
    await eventually(lambda: reclaimed(workspace), timeout_s=30, what="reclaimed once more")
    for path, content in (("a.txt", "three"), ("b.txt", "two")):
        code, out, err = await helmline("workspace", session_id, "cat", path, *t)
        assert (code, out) == (0, content), err
