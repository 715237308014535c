"""`helmline events tail`: every session's events, filtered by tenant and type, live."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from helmline.cli import app
from helmline.cli.testing import invoke
from helmline.contracts import (
    Actor,
    Event,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    ToolCallStarted,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import eventually


def _session(tenant: str, session_id: str) -> list[Event]:
    started = new_event(
        SessionStarted(goal="tail me", requested_by=Actor(id="ana")),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    return [
        started,
        started.derive(StepScheduled(step_id="a", call_id="a.1", tool="echo"), source="test"),
        started.derive(ToolCallStarted(step_id="a", call_id="a.1", tool="echo"), source="test"),
        started.derive(
            ToolCallCompleted(step_id="a", call_id="a.1", tool="echo", output="hi"), source="test"
        ),
    ]


async def test_tail_prints_exactly_one_tenants_matching_events_across_sessions(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    start = await store.log_end() + 1
    await store.append_all(_session(tenant, "s1"))
    await store.append_all(_session(f"{tenant}x", "s2"))
    await store.append_all(_session(tenant, "s3"))

    # One command at a time: the runner swaps the process's stdout while a command runs.
    as_json = await invoke(
        nats_url,
        *("events", "tail", "-t", tenant, "--type", "tool.call.*"),
        *("--from-seq", str(start), "--count", "4", "--json"),
    )
    human = await invoke(
        nats_url, "events", "tail", "-t", tenant, "--from-seq", str(start), "--count", "1"
    )

    assert as_json.exit_code == 0, as_json.output
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(e["sessionid"], e["type"]) for e in events] == [
        ("s1", "tool.call.started"),
        ("s1", "tool.call.completed"),
        ("s3", "tool.call.started"),
        ("s3", "tool.call.completed"),
    ]
    assert human.exit_code == 0, human.output
    assert human.stdout.startswith(f"{tenant}/s1 ")
    assert "session.started" in human.stdout


async def test_tail_follows_events_appended_after_it_starts(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    before = await store.log_end()
    tailing = asyncio.create_task(
        invoke(
            nats_url, "events", "tail", "-t", tenant, "--type", "session.started", "--count", "1"
        )
    )
    appended = 0

    async def one_more_session() -> bool:
        # The tail starts at the next event once it is subscribed: keep starting sessions
        # until it has printed one.
        nonlocal appended
        if not tailing.done():
            appended += 1
            await store.append(_session(tenant, f"live{appended}")[0])
        return tailing.done()

    await eventually(one_more_session, timeout_s=30, interval_s=0.1, what="the tail to print")
    result = await tailing
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{tenant}/live")
    assert int(line.split()[1]) > before


def test_a_type_pattern_no_event_has_is_refused() -> None:
    result = CliRunner().invoke(app, ["events", "tail", "--type", "tool.calls.*"])

    assert result.exit_code == 2
    assert "'tool.calls.*' matches no event type" in result.stderr
