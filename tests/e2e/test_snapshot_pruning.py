"""A session keeps the workspace snapshots of its newest checkpoints only: older ones are
pruned from the object store while the log keeps every checkpoint, and no fork starts from
a workspace that is gone. Every service is its own process, the state service keeping 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import ObjectNotFoundError

from helmline.contracts import WORKSPACES_BUCKET, WorkspaceSnapshotsPruned
from helmline.runtime import EventStore
from helmline.runtime.testing import ServiceProcesses, checkpointed, eventually
from tests.e2e.conftest import SERVICES, Helmline

KEPT = 2


@pytest.fixture(scope="module")
def keeping_two(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcesses]:
    running = ServiceProcesses(nats_url, tmp_path_factory.mktemp("stack"))
    try:
        for name in SERVICES:
            running.start(name, {"HELMLINE_SNAPSHOTS_KEPT": str(KEPT)} if name == "state" else None)
        yield running
    finally:
        running.stop_all()


async def test_older_snapshots_are_pruned_and_a_fork_from_them_is_refused(
    keeping_two: ServiceProcesses,
    helmline: Helmline,
    store: EventStore,
    js: JetStreamContext,
    tenant: str,
    tmp_path: Path,
) -> None:
    steps = "".join(
        f"  - {{id: s{i}, tool: write_file, arguments: {{path: f{i}.txt, content: '{i}'}}"
        + (f", depends_on: [s{i - 1}]}}\n" if i > 1 else "}\n")
        for i in range(1, 5)
    )
    playbook = tmp_path / "four.yaml"
    playbook.write_text(f"goal: four files, one after the other\nsteps:\n{steps}")
    code, out, err = await helmline(
        "run", "--playbook", str(playbook), "--tenant", tenant, "--wait", "--json"
    )
    assert code == 0, err
    session_id = json.loads(out.splitlines()[0])["session_id"]
    state = await checkpointed(store, tenant, session_id)
    assert len(state.checkpoints) == 4

    pruned = [
        snapshot
        for stored in await store.read_all(tenant, session_id)
        if isinstance(stored.event.data, WorkspaceSnapshotsPruned)
        for snapshot in stored.event.data.snapshot_ids
    ]
    snapshots = [c.snapshot_id for c in state.checkpoints]
    assert pruned == snapshots[: 4 - KEPT]
    bucket = await js.object_store(WORKSPACES_BUCKET.bucket)

    async def gone() -> bool:
        for snapshot in pruned:
            try:
                await bucket.get_info(f"manifests/{tenant}/{session_id}/{snapshot}")
            except ObjectNotFoundError:
                continue
            return False
        return True

    await eventually(gone, timeout_s=30, what="the pruned snapshots deleted")
    for snapshot in [*snapshots[4 - KEPT :], state.initial_snapshot_id]:
        assert await bucket.get_info(f"manifests/{tenant}/{session_id}/{snapshot}")

    code, _, err = await helmline("fork", session_id, "--at", "1", "--tenant", tenant)
    assert code == 1
    assert "is not kept (pruned: a session keeps its newest 2 workspace snapshots)" in err
    code, out, err = await helmline("fork", session_id, "--at", "3", "--tenant", tenant, "--json")
    assert code == 0, err
