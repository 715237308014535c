"""Export sessions' events as NDJSON CloudEvents, and import them again, idempotently."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, TextIO

from nats.js.errors import APIError

from helmline.cli._connection import EventLog
from helmline.cli._errors import INVALID_INPUT, CliError
from helmline.contracts import (
    ATOMIC_BATCH_LIMIT,
    EVENTS_STREAM,
    Event,
    UndecodableEvent,
    decode_event,
    encode_event,
    event_type_filter,
    quoted,
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


LINE_MAX_BYTES = 2 * EVENTS_STREAM.max_msg_size
"""The longest line of an export: no event the log holds is longer, even as JSON."""


def read_export(export: BinaryIO, name: str, *, max_bytes: int) -> list[Event]:
    """Every event of an export, validated; the first bad line is named and nothing is kept.
    An export past `max_bytes`, or a line past `LINE_MAX_BYTES`, is refused without being
    read whole."""
    events = []
    for number, line in _numbered(export, name, max_bytes):
        try:
            events.append(decode_event(line))
        except UndecodableEvent as error:
            raise CliError(f"{name}:{number}: {error}", exit_code=INVALID_INPUT) from error
    return events


def _numbered(export: BinaryIO, name: str, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    read = 0
    for number in itertools.count(1):
        line = export.readline(LINE_MAX_BYTES + 1)
        if not line:
            return
        read += len(line)
        if read > max_bytes:
            raise CliError(
                f"{name}: the export is larger than {max_bytes} bytes; import it with a "
                "larger --max-bytes, or export fewer sessions at a time",
                exit_code=INVALID_INPUT,
            )
        if len(line) > LINE_MAX_BYTES:
            raise CliError(
                f"{name}:{number}: the line is longer than the {LINE_MAX_BYTES} bytes of the "
                f"largest event; it begins {quoted(line)}",
                exit_code=INVALID_INPUT,
            )
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
        missing = [event for event in session_events if event.id not in known]
        together: set[uuid.UUID] = set()
        for start in range(0, len(missing), ATOMIC_BATCH_LIMIT):
            batch = missing[start : start + ATOMIC_BATCH_LIMIT]
            # All at once: a service handed an event of the session finds what follows it
            # in the log, so it knows it for history (see `History`) and acts on none of it.
            with contextlib.suppress(APIError):  # One is stored already: one at a time.
                await log.store.append_atomically(batch)
                together.update(event.id for event in batch)
        appended += len(together)
        for event in session_events:
            if event.id in together:
                continue
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
