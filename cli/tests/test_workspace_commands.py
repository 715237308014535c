"""`helmline workspace SESSION ls|cat|export` against snapshots a real sandbox took (bubblewrap,
JetStream object store), now and at a checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from typer.testing import CliRunner, Result

from helmline.cli import app
from helmline.contracts import (
    CheckpointCreated,
    SandboxExecutionRequested,
    ToolCallCompleted,
    new_event,
)
from helmline.runtime import Delivery, EventStore
from helmline.sandbox import SandboxHandler, SandboxSettings, WorkspaceSnapshots, tools_for
from helmline.sandbox._snapshots import HashCache, scan


async def helmline(nats_url: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, app, list(args), env={"HELMLINE_NATS_URL": nats_url}
    )


def tree(root: Path) -> tuple[object, ...]:
    """Every entry under root: path, kind, mode, size and content hash (or link target)."""
    return scan(root, HashCache())


@pytest.fixture
async def session(js: JetStreamContext, tenant: str, tmp_path: Path) -> tuple[str, Path]:
    """A session whose sandbox wrote a.txt ("one"), was checkpointed as cp-1, then changed
    a.txt and added a nested binary file, a mode and a link. Its id and workspace."""
    store = EventStore(js)
    workspaces = tmp_path / "workspaces"
    handler = SandboxHandler(
        store,
        workspaces,
        await tools_for(SandboxSettings()),
        snapshots=WorkspaceSnapshots(js, max_bytes=1 << 20),
    )
    session_id = f"s{uuid.uuid4().hex[:8]}"

    async def call(tool: str, **arguments: str) -> str:
        call_id = f"c-{uuid.uuid4().hex[:8]}"
        request = new_event(
            SandboxExecutionRequested(call_id=call_id, step_id="s", tool=tool, arguments=arguments),
            tenant=tenant,
            session_id=session_id,
            source="test",
        )
        await store.append(request)
        await handler(Delivery(request, seq=1, deliveries=1))
        return call_id

    first = await call("write_file", path="a.txt", content="one")
    (completed,) = [
        stored
        for stored in await store.read_all(tenant, session_id)
        if isinstance(stored.event.data, ToolCallCompleted)
    ]
    checkpoint = CheckpointCreated(
        checkpoint_id="cp-1", step_id="s", call_id=first, at_seq=completed.seq
    )
    await store.append(completed.event.derive(checkpoint, source="test"))
    await call(
        "run_command",
        command="mkdir -p d/e && printf '\\000\\001\\377' > d/e/bin && chmod 700 d/e/bin "
        "&& echo two > a.txt && ln -s a.txt l",
    )
    return session_id, workspaces / tenant / session_id


async def test_ls_and_cat_now_and_at_a_checkpoint(
    nats_url: str, tenant: str, session: tuple[str, Path]
) -> None:
    session_id, _ = session
    base = ("workspace", session_id)
    t = ("--tenant", tenant)

    listed = await helmline(nats_url, *base, "ls", *t)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert [line.split()[-1] for line in lines] == ["a.txt", "d/", "a.txt"]
    assert lines[2].endswith("l -> a.txt")
    nested = await helmline(nats_url, *base, "ls", "d/e", "--json", *t)
    (entry,) = json.loads(nested.stdout)["entries"]
    assert (entry["path"], entry["kind"], entry["mode"], entry["size"]) == (
        "d/e/bin",
        "file",
        0o700,
        3,
    )
    at_checkpoint = await helmline(nats_url, *base, "ls", "--at", "cp-1", *t)
    assert [line.split()[-1] for line in at_checkpoint.stdout.splitlines()] == ["a.txt"]

    now = await helmline(nats_url, *base, "cat", "a.txt", *t)
    assert now.stdout == "two\n"
    before = await helmline(nats_url, *base, "cat", "/a.txt", "--at", "cp-1", *t)
    assert before.stdout == "one"
    binary = await helmline(nats_url, *base, "cat", "d/e/bin", *t)
    assert binary.stdout_bytes == b"\x00\x01\xff"


async def test_export_is_byte_identical_to_the_workspace(
    nats_url: str, tenant: str, session: tuple[str, Path], tmp_path: Path
) -> None:
    session_id, workspace = session
    base = ("workspace", session_id)
    t = ("--tenant", tenant)

    exported = await helmline(nats_url, *base, "export", str(tmp_path / "now"), *t)
    assert exported.exit_code == 0, exported.output
    assert "2 files" in exported.stdout
    assert tree(tmp_path / "now") == tree(workspace)

    older = await helmline(nats_url, *base, "export", str(tmp_path / "old"), "--at", "cp-1", *t)
    assert older.exit_code == 0, older.output
    assert (tmp_path / "old" / "a.txt").read_text() == "one"
    assert sorted(os.listdir(tmp_path / "old")) == ["a.txt"]


async def test_mistakes_are_named(
    nats_url: str, tenant: str, session: tuple[str, Path], tmp_path: Path
) -> None:
    session_id, _ = session
    base = ("workspace", session_id)
    t = ("--tenant", tenant)

    folder = await helmline(nats_url, *base, "cat", "d", *t)
    assert folder.exit_code == 1
    assert "'d' is a folder" in folder.stderr
    missing = await helmline(nats_url, *base, "cat", "nope.txt", *t)
    assert "no 'nope.txt' in the workspace" in missing.stderr
    escaping = await helmline(nats_url, *base, "ls", "../other", *t)
    assert escaping.exit_code == 2
    unknown = await helmline(nats_url, *base, "ls", "--at", "cp-9", *t)
    assert "no checkpoint or snapshot 'cp-9'" in unknown.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    occupied = await helmline(nats_url, *base, "export", str(tmp_path / "full"), *t)
    assert occupied.exit_code == 2
    assert "not an empty folder" in occupied.stderr
    nobody = await helmline(nats_url, "workspace", "nosuch", "ls", *t)
    assert "no session nosuch" in nobody.stderr
