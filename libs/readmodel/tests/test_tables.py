"""The declared tables are the ones the migrations create: names, columns, keys, jsonb."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from helmline.readmodel import MIGRATIONS, SESSIONS, TABLES, Table


async def test_the_migrations_create_exactly_the_declared_tables(database_url: str) -> None:
    schema = f"readmodel_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(f"CREATE SCHEMA {schema}")
        async with connection.transaction():
            await connection.execute(f"SET LOCAL search_path TO {schema}")
            for statement in MIGRATIONS:
                await connection.execute(statement)
        columns = await connection.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = $1",
            schema,
        )
        keys = await connection.fetch(
            "SELECT k.table_name, k.column_name FROM information_schema.key_column_usage k"
            " JOIN information_schema.table_constraints c USING (constraint_schema,"
            " constraint_name) WHERE c.constraint_type = 'PRIMARY KEY' AND k.table_schema = $1"
            " ORDER BY k.table_name, k.ordinal_position",
            schema,
        )
    finally:
        await connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await connection.close()

    created = {row["table_name"] for row in columns}
    assert created == {table.name for table in TABLES}
    for table in TABLES:
        mine = [row for row in columns if row["table_name"] == table.name]
        assert {row["column_name"] for row in mine} == set(table.columns), table.name
        assert len(table.columns) == len(set(table.columns)), table.name
        jsonb = {row["column_name"] for row in mine if row["data_type"] == "jsonb"}
        assert jsonb == table.json_columns, table.name
        key = tuple(row["column_name"] for row in keys if row["table_name"] == table.name)
        assert key == table.key, table.name


def test_a_select_list_names_only_columns_of_its_table() -> None:
    assert SESSIONS.listing(("session_id", "status")) == "session_id, status"
    with pytest.raises(ValueError, match="sessions has no column pending"):
        SESSIONS.listing(("session_id", "pending"))


def test_a_key_is_a_tables_first_columns() -> None:
    with pytest.raises(ValueError, match="must be its first columns"):
        Table("t", ("tenant", "note", "session_id"), key=("tenant", "session_id"))
