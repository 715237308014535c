"""Checking the read model against the log: every row and column the fold disagrees with."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from helmline.contracts import SessionState
from helmline.readmodel import SESSIONS, TABLES, Table
from helmline.runtime import EventStore
from helmline.state._rows import session_rows

# Where the projection stands, not a fact of the session: not compared.
NOT_COMPARED = frozenset({"last_seq"})


async def read_model_differences(database_url: str, state: SessionState) -> list[str]:
    """Each way the session's rows differ from `state`; empty when they agree."""
    connection = await asyncpg.connect(database_url)
    try:
        stored = {
            table.name: await connection.fetch(
                # Table names come from the read model's declarations, never from input.
                f"SELECT * FROM {table.name} WHERE tenant = $1 AND session_id = $2",
                state.tenant,
                state.session_id,
            )
            for table in TABLES
        }
    finally:
        await connection.close()
    if not stored[SESSIONS.name]:
        return ["the read model has no row for this session"]
    expected = session_rows(state, 0)
    differences: list[str] = []
    for table in TABLES:
        key = table.row_key
        rows = {row[key]: dict(row) for row in stored[table.name]}
        for values in expected[table.name]:
            wanted = dict(zip(table.columns, values, strict=True))
            where = table.name if table is SESSIONS else f"{table.name}.{wanted[key]}"
            row = rows.pop(wanted[key], None)
            if row is None:
                differences.append(f"{where}: missing from the read model")
                continue
            differences += [
                f"{where}.{column}: read model {row[column]!r}, log {wanted[column]!r}"
                for column in table.columns
                if column not in NOT_COMPARED
                and _comparable(table, column, row[column])
                != _comparable(table, column, wanted[column])
            ]
        differences += [f"{table.name}.{extra}: not in the log" for extra in rows]
    return differences


async def caught_up(store: EventStore, database_url: str, tenant: str, sessions: int) -> bool:
    """Whether the read model holds `sessions` sessions of the tenant, each up to its last
    event in the log; False while PostgreSQL cannot be reached."""
    try:
        connection = await asyncpg.connect(database_url)
        try:
            rows = await connection.fetch(
                f"SELECT session_id, last_seq FROM {SESSIONS.name} WHERE tenant = $1", tenant
            )
        finally:
            await connection.close()
    except (OSError, asyncpg.PostgresError):
        return False
    if len(rows) != sessions:
        return False
    for row in rows:
        if row["last_seq"] != await store.last_seq(tenant, row["session_id"]):
            return False
    return True


def _comparable(table: Table, column: str, value: Any) -> Any:
    # jsonb comes back re-serialised (its own spacing and key order): compare what it says.
    return json.loads(value) if column in table.json_columns and value is not None else value
