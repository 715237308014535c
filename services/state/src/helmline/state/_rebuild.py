"""Rebuilding the read model from the log: built aside, then switched to in one transaction.

The new tables are filled in a schema of their own while the live ones keep answering (and
the state service keeps writing them). The switch locks the live tables, folds the few
events stored since, and moves the new tables into the live schema under the same names, so
readers see the old tables or the new ones, never a mix or a gap, and keep their grants.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import asyncpg

from helmline.contracts import SessionFold
from helmline.readmodel import MIGRATIONS, TABLES
from helmline.runtime import EventStore, StoredEvent, bulk_allocation
from helmline.state._projection import UNAVAILABLE, Connection, migrate
from helmline.state._rows import session_rows

PROJECTIONS = ("sessions",)
"""Projections `rebuild` knows. The read model's tables (sessions, steps, approvals,
checkpoints) are one projection: they are written from one fold in one transaction."""

BUILDING_SCHEMA = "helmline_rebuild"
RETIRED_SCHEMA = "helmline_retired"
REBUILD_LOCK = 7240532
"""Advisory lock held by the one rebuild that may run at a time."""
LOCKED_CATCH_UP = 1_000
"""Events stored during the build are folded before the switch until at most this many are
left; those are folded while the live tables are locked (readers wait that long)."""
SWITCH_ATTEMPTS = 5
PROGRESS_EVERY = 1_000

Progress = Callable[[int, int], None]
"""Called with the stream sequence folded so far and the sequence the rebuild aims for."""


class RebuildError(Exception):
    """The rebuild could not run; nothing was switched."""


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a finished rebuild did."""

    events: int
    """Events folded."""
    sessions: int
    """Sessions written."""
    last_seq: int
    """The stream sequence the new tables are up to at the switch."""
    seconds: float
    """From start to switch."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


class _LogFold:
    """Every session's fold, and which sessions changed since their rows were last written.

    All sessions stay in memory until the switch: a SessionState per session.
    """

    def __init__(self, progress: Progress) -> None:
        self._folds: dict[tuple[str, str], SessionFold] = {}
        self._last_seq: dict[tuple[str, str], int] = {}
        self._progress = progress
        self.changed: set[tuple[str, str]] = set()
        self.events = 0
        self.last_seq = 0
        self.target = 0

    def apply(self, stored: StoredEvent) -> None:
        event = stored.event
        key = (event.tenant, event.session_id)
        folding = self._folds.get(key)
        if folding is None:
            folding = self._folds[key] = SessionFold()
        folding.apply(event)
        self._last_seq[key] = stored.seq
        self.changed.add(key)
        self.events += 1
        self.last_seq = stored.seq
        if self.events % PROGRESS_EVERY == 0:
            self._progress(self.last_seq, self.target)

    async def fold_up_to(self, store: EventStore, end: int) -> None:
        self.target = end
        if end > self.last_seq:
            await store.replay_log(self.apply, after_seq=self.last_seq, up_to_seq=end)
        # Sequences with no decodable event (or none at all) still count as read.
        self.last_seq = max(self.last_seq, end)
        self._progress(self.last_seq, self.target)

    @property
    def sessions(self) -> int:
        return len(self._folds)

    def rows(self, keys: Iterable[tuple[str, str]]) -> dict[str, list[tuple[object, ...]]]:
        tables: dict[str, list[tuple[object, ...]]] = {table.name: [] for table in TABLES}
        for key in keys:
            state = self._folds[key].state()
            for table, rows in session_rows(state, self._last_seq[key]).items():
                tables[table] += rows
        return tables


async def rebuild_read_model(
    store: EventStore, database_url: str, *, progress: Progress | None = None
) -> RebuildReport:
    """Rebuild every table of the read model from the whole log, then switch to it."""
    began = time.perf_counter()
    log = _LogFold(progress or (lambda done, end: None))
    try:
        connection = await asyncpg.connect(database_url)
    except UNAVAILABLE as error:
        raise RebuildError(f"cannot reach the read model's database: {error}") from error
    try:
        if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", REBUILD_LOCK):
            raise RebuildError("another rebuild of the read model is running")
        await migrate(connection)  # The live tables exist and have the newest shape.
        live = _quoted(await connection.fetchval("SELECT current_schema()"))
        await _create_building_tables(connection)
        with bulk_allocation():
            end = await store.log_end()
            while True:
                await log.fold_up_to(store, end)
                async with connection.transaction():
                    await _write(connection, log)
                log.changed.clear()
                end = await store.log_end()
                if end - log.last_seq <= LOCKED_CATCH_UP:
                    break
            await _switch(connection, store, log, live)
    except UNAVAILABLE as error:
        raise RebuildError(
            f"lost the read model's database mid-rebuild ({error!r}); nothing was switched: "
            "run the rebuild again once it is back"
        ) from error
    finally:
        if not connection.is_closed():
            await connection.close()  # Also releases the advisory lock.
    return RebuildReport(
        events=log.events,
        sessions=log.sessions,
        last_seq=log.last_seq,
        seconds=time.perf_counter() - began,
    )


async def _create_building_tables(connection: Connection) -> None:
    # Left over by an interrupted rebuild, if any: never switched to, so nothing reads it.
    await connection.execute(f"DROP SCHEMA IF EXISTS {BUILDING_SCHEMA} CASCADE")
    await connection.execute(f"CREATE SCHEMA {BUILDING_SCHEMA}")
    async with connection.transaction():
        # The migrations create unqualified names: run them inside the building schema, so
        # the new tables and their indexes are named exactly as the live ones.
        await connection.execute(f"SET LOCAL search_path TO {BUILDING_SCHEMA}")
        for statement in MIGRATIONS:
            await connection.execute(statement)


async def _write(connection: Connection, log: _LogFold) -> None:
    """Replace the building tables' rows of every session changed since the last write
    (the caller forgets which changed once the transaction commits)."""
    if not log.changed:
        return
    tenants, session_ids = zip(*log.changed, strict=True)
    for table in TABLES:
        await connection.execute(
            f"DELETE FROM {BUILDING_SCHEMA}.{table.name} WHERE (tenant, session_id) IN"
            " (SELECT * FROM unnest($1::text[], $2::text[]))",
            list(tenants),
            list(session_ids),
        )
    rows_by_table = log.rows(log.changed)
    for table in TABLES:
        if rows := rows_by_table[table.name]:
            await connection.copy_records_to_table(
                table.name, records=rows, columns=table.columns, schema_name=BUILDING_SCHEMA
            )


async def _switch(connection: Connection, store: EventStore, log: _LogFold, live: str) -> None:
    """Fold the last events and put the new tables in the live ones' place, atomically."""
    tables = ", ".join(f"{live}.{table.name}" for table in TABLES)
    for attempt in range(1, SWITCH_ATTEMPTS + 1):
        try:
            async with connection.transaction():
                # Waits for writers in flight; from here on, readers and writers wait for the
                # switch, and afterwards use the new tables (PostgreSQL looks names up again).
                await connection.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
                await log.fold_up_to(store, await store.log_end())
                await _write(connection, log)
                grants = await _grants(connection, live)
                await connection.execute(f"DROP SCHEMA IF EXISTS {RETIRED_SCHEMA} CASCADE")
                await connection.execute(f"CREATE SCHEMA {RETIRED_SCHEMA}")
                for table in TABLES:
                    await connection.execute(
                        f"ALTER TABLE {live}.{table.name} SET SCHEMA {RETIRED_SCHEMA}"
                    )
                    await connection.execute(
                        f"ALTER TABLE {BUILDING_SCHEMA}.{table.name} SET SCHEMA {live}"
                    )
                for grant in grants:
                    await connection.execute(grant)
                await connection.execute(f"DROP SCHEMA {RETIRED_SCHEMA} CASCADE")
                await connection.execute(f"DROP SCHEMA {BUILDING_SCHEMA} CASCADE")
        except asyncpg.DeadlockDetectedError:
            # A reader took the tables' locks in another order and ours was the transaction
            # chosen to give way; it rolled back whole (the changed sessions are still
            # marked), so try again.
            if attempt == SWITCH_ATTEMPTS:
                raise
        else:
            log.changed.clear()
            return


async def _grants(connection: Connection, live: str) -> list[str]:
    """GRANT statements giving the new tables the privileges the live ones have (a read-only
    role of the API, say), to run once the new tables carry the live names."""
    records = await connection.fetch(
        """
        SELECT c.relname AS table_name, a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) a
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.relnamespace = $1::regnamespace AND c.relname = ANY($2::text[])
          AND a.grantee <> c.relowner
        """,
        live,
        [table.name for table in TABLES],
    )
    return [
        f"GRANT {record['privilege_type']} ON {live}.{record['table_name']} TO {record['grantee']}"
        for record in records
    ]


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
