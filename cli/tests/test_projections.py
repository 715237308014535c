"""`helmline projections rebuild`: the read model built again from the log, and switched to."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
from typer.testing import CliRunner

from helmline.cli import app
from helmline.cli.testing import invoke
from helmline.contracts import Actor, PlanProposed, PlanStep, SessionStarted, new_event
from helmline.runtime import EventStore


async def test_rebuild_projects_every_session_and_reports_it(
    own_log: tuple[str, EventStore], own_postgres: Any
) -> None:
    nats_url, store = own_log
    for number in range(3):
        started = new_event(
            SessionStarted(goal=f"goal {number}", requested_by=Actor(id="ana")),
            tenant="acme",
            session_id=f"s{number}",
            source="test",
        )
        plan = PlanProposed(revision=1, steps=(PlanStep(id="a", tool="echo"),))
        await store.append_all([started, started.derive(plan, source="test")])

    result = await invoke(
        nats_url, "projections", "rebuild", "--json", database_url=own_postgres.url
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["events"], report["sessions"], report["last_seq"]) == (6, 3, 6)
    connection = await asyncpg.connect(own_postgres.url)
    try:
        rows = await connection.fetch("SELECT session_id, goal, steps_total FROM sessions")
    finally:
        await connection.close()
    assert sorted(tuple(row) for row in rows) == [(f"s{n}", f"goal {n}", 1) for n in range(3)]


def test_an_unknown_projection_is_named() -> None:
    result = CliRunner().invoke(app, ["projections", "rebuild", "--name", "x"])

    assert result.exit_code == 1
    assert "no projection named 'x'; known: sessions" in result.stderr
