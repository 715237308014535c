"""Checking the read model against the log: what a row says that the fold does not."""

from __future__ import annotations

from typing import Any

import asyncpg

from helmline.contracts import SessionState
from helmline.state._readmodel import (
    EVERY_ROW,
    SESSION_COLUMNS,
    STEP_COLUMNS,
    session_row,
    step_rows,
)

# `last_seq` is where the projection stands, not a fact of the session: not compared.
_COMPARED_SESSION_COLUMNS = tuple(c for c in SESSION_COLUMNS if c != "last_seq")


async def read_model_differences(database_url: str, state: SessionState) -> list[str]:
    """Each way the session's rows differ from `state`; empty when they agree."""
    connection = await asyncpg.connect(database_url)
    try:
        session = await connection.fetchrow(
            "SELECT * FROM sessions WHERE tenant = $1 AND session_id = $2",
            state.tenant,
            state.session_id,
        )
        steps = await connection.fetch(
            "SELECT * FROM steps WHERE tenant = $1 AND session_id = $2 ORDER BY position",
            state.tenant,
            state.session_id,
        )
    finally:
        await connection.close()
    if session is None:
        return ["the read model has no row for this session"]
    expected = dict(zip(SESSION_COLUMNS, session_row(state, 0), strict=True))
    differences = [
        f"sessions.{column}: read model {session[column]!r}, log {expected[column]!r}"
        for column in _COMPARED_SESSION_COLUMNS
        if session[column] != expected[column]
    ]
    rows = {row["step_id"]: row for row in steps}
    for values in step_rows(state, EVERY_ROW):
        wanted: dict[str, Any] = dict(zip(STEP_COLUMNS, values, strict=True))
        row = rows.pop(wanted["step_id"], None)
        if row is None:
            differences.append(f"steps.{wanted['step_id']}: missing from the read model")
            continue
        for column in ("status", "attempts", "call_id", "tool", "position"):
            if row[column] != wanted[column]:
                differences.append(
                    f"steps.{wanted['step_id']}.{column}: read model "
                    f"{row[column]!r}, log {wanted[column]!r}"
                )
    differences += [f"steps.{step_id}: not in the log" for step_id in rows]
    return differences
