"""Export and import: a session moves to another cluster unchanged; importing twice is a no-op."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helmline.cli.testing import invoke
from helmline.contracts import (
    EVENTS_STREAM,
    Actor,
    Event,
    PlanProposed,
    PlanStep,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    new_event,
)
from helmline.runtime import EventStore, connect_nats, ensure_topology
from helmline.runtime.testing import NatsServer


@pytest.fixture
async def other_cluster(tmp_path: Path) -> AsyncIterator[str]:
    """A second, empty nats-server: the cluster sessions are moved to."""
    with NatsServer(tmp_path) as server:
        connection = await connect_nats(server.url)
        await ensure_topology(connection.jetstream())
        await connection.close()
        yield server.url


def _session(tenant: str, session_id: str) -> list[Event]:
    started = new_event(
        SessionStarted(goal="move me", requested_by=Actor(id="ana")),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    return [
        started,
        started.derive(
            PlanProposed(revision=1, steps=(PlanStep(id="a", tool="echo"),)), source="test"
        ),
        started.derive(StepScheduled(step_id="a", call_id="a.1", tool="echo"), source="test"),
        started.derive(
            ToolCallCompleted(step_id="a", call_id="a.1", tool="echo", output={"message": "hi"}),
            source="test",
        ),
    ]


async def test_a_session_moves_unchanged_and_a_second_import_changes_nothing(
    nats_url: str, other_cluster: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    await store.append_all(_session(tenant, "s1"))
    export_file = tmp_path / "s1.ndjson"

    exported = await invoke(nats_url, "export", "s1", "-t", tenant, "-o", str(export_file))
    assert exported.exit_code == 0, exported.output
    assert len(export_file.read_text().splitlines()) == 4

    first = await invoke(other_cluster, "import", str(export_file))
    assert first.exit_code == 0, first.output
    assert "imported 4 events of 1 sessions (0 were already there)" in first.stdout
    again = await invoke(other_cluster, "import", str(export_file), "--json")
    assert json.loads(again.stdout) == {
        "appended": 0,
        "already_present": 4,
        "sessions": 1,
        "not_stored": [],
    }

    here = await invoke(nats_url, "show", "s1", "-t", tenant, "--json")
    there = await invoke(other_cluster, "show", "s1", "-t", tenant, "--json")
    assert json.loads(there.stdout) == json.loads(here.stdout)


async def test_a_bad_line_is_named_and_nothing_is_imported(
    nats_url: str, other_cluster: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    await store.append_all(_session(tenant, "s1"))
    export_file = tmp_path / "s1.ndjson"
    await invoke(nats_url, "export", "s1", "-t", tenant, "-o", str(export_file))
    lines = export_file.read_text().splitlines()
    lines[2] = lines[2].replace('"step.scheduled"', '"step.exploded"')
    export_file.write_text("\n".join(lines) + "\n")

    result = await invoke(other_cluster, "import", str(export_file))

    assert result.exit_code == 2
    assert f"{export_file}:3: unknown event type 'step.exploded'" in result.stderr
    assert "no session" in (await invoke(other_cluster, "show", "s1", "-t", tenant)).stderr


async def test_a_line_longer_than_any_event_is_refused_quoting_only_its_start(
    nats_url: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    await store.append_all(_session(tenant, "s1"))
    export_file = tmp_path / "s1.ndjson"
    await invoke(nats_url, "export", "s1", "-t", tenant, "-o", str(export_file))
    with export_file.open("a") as export:
        export.write('{"id": "' + "z" * (2 * EVENTS_STREAM.max_msg_size) + '"}\n')

    result = await invoke(nats_url, "import", str(export_file))

    assert result.exit_code == 2
    assert f"{export_file}:5: the line is longer than the 2097152 bytes" in result.stderr
    assert 'it begins \'{"id": "' + "z" * 192 + "' (and " in result.stderr
    assert "z" * 193 not in result.stderr


async def test_an_export_past_max_bytes_is_refused_before_anything_is_imported(
    nats_url: str, other_cluster: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    await store.append_all(_session(tenant, "s1"))
    export_file = tmp_path / "s1.ndjson"
    await invoke(nats_url, "export", "s1", "-t", tenant, "-o", str(export_file))
    size = export_file.stat().st_size

    refused = await invoke(other_cluster, "import", str(export_file), "--max-bytes", str(size - 1))
    assert refused.exit_code == 2
    assert f"the export is larger than {size - 1} bytes" in refused.stderr
    assert "no session" in (await invoke(other_cluster, "show", "s1", "-t", tenant)).stderr
    taken = await invoke(other_cluster, "import", str(export_file), "--max-bytes", str(size))
    assert taken.exit_code == 0, taken.output


async def test_events_whose_ids_another_session_holds_are_named_as_not_stored(
    nats_url: str, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    # An export edited to move the session to another tenant of the same log: JetStream
    # takes each event for the one it stored under the other tenant, and drops it.
    await store.append_all(_session(tenant, "s1"))
    export_file = tmp_path / "s1.ndjson"
    await invoke(nats_url, "export", "s1", "-t", tenant, "-o", str(export_file))
    moved = export_file.read_text().replace(f'"tenant":"{tenant}"', f'"tenant":"{tenant}x"')
    export_file.write_text(moved)

    result = await invoke(nats_url, "import", str(export_file))

    assert result.exit_code == 1, result.output
    assert "imported 0 events of 1 sessions (0 were already there)" in result.stdout
    assert "4 events were not stored: the log holds events with their ids" in result.stderr
    assert "no session" in (await invoke(nats_url, "show", "s1", "-t", f"{tenant}x")).stderr


async def test_all_exports_only_that_tenant(nats_url: str, store: EventStore, tenant: str) -> None:
    await store.append_all(_session(tenant, "s1"))
    await store.append_all(_session(tenant, "s2"))
    await store.append_all(_session(f"{tenant}x", "s3"))

    result = await invoke(nats_url, "export", "--all", "-t", tenant)

    assert result.exit_code == 0, result.output
    sessions = {json.loads(line)["sessionid"] for line in result.stdout.splitlines()}
    assert sessions == {"s1", "s2"}


async def test_replay_prints_the_state_up_to_a_sequence(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    appended = await store.append_all(_session(tenant, "s1"))

    result = await invoke(
        nats_url, "replay", "s1", "-t", tenant, "--to-seq", str(appended[1].seq), "--json"
    )

    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state["event_count"] == 2
    assert state["steps"]["a"]["status"] == "pending"
    assert "not compared with a read model" in result.stderr
