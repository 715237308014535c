"""Export sessions' events as NDJSON CloudEvents, and import them again, idempotently."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from helmline.cli._connection import EventLog
from helmline.cli._errors import CliError
from helmline.contracts import (
    Event,
    UndecodableEvent,
    decode_event,
    encode_event,
    event_type_filter,
    tenant_filter,
)


async def export_session(log: EventLog, tenant: str, session_id: str, out: TextIO) -> int:
    """Write one session's events, oldest first; how many."""
    stored = await log.store.read_all(tenant, session_id)
    if not stored:
        raise CliError(f"no session {session_id} in tenant {tenant!r}")
    return _write(out, (item.event for item in stored))


async def export_tenant(
    log: EventLog, tenant: str, out: TextIO, since: datetime | None = None
) -> int:
    """Write every event of the tenant's sessions started since `since`; how many."""
    starts = await log.store.read_matching(
        event_type_filter("session.started", tenant), since=since
    )
    sessions = {item.event.session_id for item in starts}
    every = await log.store.read_matching(tenant_filter(tenant), since=since)
    return _write(out, (item.event for item in every if item.event.session_id in sessions))


def _write(out: TextIO, events: Iterable[Event]) -> int:
    count = 0
    for event in events:
        out.write(encode_event(event).decode() + "\n")
        count += 1
    return count


def read_export(lines: Iterable[str], name: str) -> list[Event]:
    """Every event of an export, validated; the first bad line is named and nothing is kept."""
    events = []
    for number, line in _numbered(lines):
        try:
            events.append(decode_event(line))
        except UndecodableEvent as error:
            raise CliError(f"{name}:{number}: {error}") from error
    return events


def _numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line


@dataclass(frozen=True)
class ImportResult:
    """What an import did."""

    appended: int
    already_present: int
    sessions: int
    not_stored: tuple[str, ...] = ()
    """Ids of events JetStream discarded as duplicates of events of other sessions: ids
    are unique across the log, and these were stored elsewhere lately (within the stream's
    duplicate window), say by an export edited to move a session to another tenant."""


async def import_events(log: EventLog, events: list[Event]) -> ImportResult:
    """Append the events a session's log does not hold yet, in their order.

    Existing event ids are read from each session's log first, so importing the same file
    twice, however long apart, stores every event once.
    """
    by_session: dict[tuple[str, str], list[Event]] = {}
    for event in events:
        by_session.setdefault((event.tenant, event.session_id), []).append(event)
    appended = present = 0
    not_stored: list[str] = []
    for (tenant, session_id), session_events in by_session.items():
        known = {item.event.id for item in await log.store.read_all(tenant, session_id)}
        for event in session_events:
            if event.id in known:
                present += 1
                continue
            stored = await log.store.append(event)
            known.add(event.id)
            if not stored.duplicate:
                appended += 1
            elif await _holds(log, event, stored.seq):
                present += 1  # Appended by another writer since the log was read.
            else:
                not_stored.append(str(event.id))
    return ImportResult(
        appended=appended,
        already_present=present,
        sessions=len(by_session),
        not_stored=tuple(not_stored),
    )


async def _holds(log: EventLog, event: Event, seq: int) -> bool:
    """Whether the event stored at `seq` is this one, in its own session."""
    stored = await log.store.read_at(event.tenant, event.session_id, seq)
    return stored is not None and stored.event.id == event.id
