"""The rows the projection writes for an event are all the rows the event changes.

The projection writes a session's row and the rows its events touch (`touched`), and
rewrites all of the session's rows only for events that say so: a row an event changes
without naming it would stay as it was in PostgreSQL while the log says otherwise.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from helmline.contracts import (
    Actor,
    Event,
    ForkOrigin,
    SessionStarted,
    SessionState,
    Touched,
    evolve,
    fold,
    new_event,
    touched,
)
from helmline.contracts.testing import sessions
from helmline.state._rows import session_rows

KEYS = 3
"""Tenant, session and the row's own id: the key of every row but the session's."""
TABLES = ("steps", "approvals", "checkpoints")


def _rows_by_key(state: SessionState) -> dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]]:
    rows = session_rows(state, last_seq=0)
    return {(table, row[:KEYS]): row for table in TABLES for row in rows[table]}


def _rows_written(rows: Touched) -> set[tuple[str, str]]:
    named = {"steps": rows.steps, "approvals": rows.approvals, "checkpoints": rows.checkpoints}
    return {(table, row_id) for table in TABLES for row_id in named[table] if row_id}


def _rows_not_written(before: SessionState, event: Event) -> set[tuple[str, str]]:
    """The rows `event` changes (or removes) that the projection would leave as they were."""
    after = evolve(before, event)
    rows = touched(event.data)
    if rows.every_row:
        return set()
    was, now = _rows_by_key(before), _rows_by_key(after)
    changed = {
        (table, key[2])
        for table, key in was.keys() | now.keys()
        if was.get((table, key)) != now.get((table, key))
    }
    return changed - _rows_written(rows)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=sessions(max_events=30))
def test_every_row_an_event_changes_is_one_the_projection_writes(events: list[Event]) -> None:
    state = fold([])
    for event in events:
        assert _rows_not_written(state, event) == set(), f"{event.type} after {state.status}"
        state = evolve(state, event)


def test_a_fork_writes_the_steps_it_took_over_as_it_starts() -> None:
    # The first event of a fork marks the steps completed before the fork: the
    # projection's first write of the session must hold them.
    fork = new_event(
        SessionStarted(
            goal="again",
            requested_by=Actor(id="ana"),
            fork_of=ForkOrigin(
                session_id="origin", checkpoint_id="cp-1", at_seq=12, completed_steps=("s0",)
            ),
        ),
        tenant="acme",
        session_id="fork",
        source="helmline/api",
    )
    assert "s0" in fold([fork]).steps
    assert _rows_not_written(fold([]), fork) == set()
