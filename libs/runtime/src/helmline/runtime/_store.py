"""The event store: sessions' events appended to and replayed from JetStream."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, Header, PubAck
from nats.js.errors import APIError, NotFoundError

from helmline.contracts import (
    ALL_EVENTS,
    ATOMIC_BATCH_LIMIT,
    EVENTS_STREAM,
    Event,
    Headers,
    SessionFold,
    SessionState,
    UndecodableEvent,
    decode_event,
    encode_event,
    event_subject,
    session_filter,
)
from helmline.runtime._consumer import ack_position
from helmline.runtime._elections import through_elections
from helmline.runtime._errors import ConcurrencyConflict, EventTooLarge
from helmline.runtime._phases import current_hop
from helmline.runtime._tracing import record_appended, traceparent_for

logger = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071
DIRECT_BATCH = 256
"""Events of a session read by one batched direct get; the rest stream through a consumer."""
END_OF_BATCH, NOT_FOUND = "204", "404"
"""Statuses that end a batched direct get's answer: all sent, or nothing matched."""
_BEHIND_FIRST_PAUSE_S = 0.002
_BEHIND_MAX_PAUSE_S = 0.05
STORED_SEQUENCE = "Nats-Sequence"
"""Header of a directly got message: its stream sequence."""
PENDING_AFTER_BATCH = "Nats-Num-Pending"
"""Header of a batched direct get's end: matching messages stored after the batch."""

_Batch = tuple[list[tuple[int, bytes]], bool]
"""Stored messages with their sequences, as one direct get brings them, and whether more
were stored after them."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event with its position in the stream."""

    seq: int
    """Stream sequence; orders a session's events and names a point in its history."""
    event: Event
    """The event."""


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an appended event landed."""

    seq: int
    """Its stream sequence (the original's, for a duplicate)."""
    duplicate: bool
    """True when an event with the same id was already stored."""


@dataclass(frozen=True, slots=True)
class EventsOfType:
    """A session's recent events of one type, and where its last of that type lies."""

    events: list[StoredEvent]
    """Those stored since the time asked, oldest first."""
    last_seq: int
    """Sequence of the session's last event of the type, however old; 0 when it has none."""


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """An event ready to be published to the session's subject."""

    event: Event
    subject: str
    body: bytes
    headers: dict[str, str]

    @staticmethod
    def of(
        event: Event, expected_last_seq: int | None, expected_last_of_type: int | None = None
    ) -> _Outgoing:
        """The event with the current trace context, encoded, with the headers JetStream
        de-duplicates and (given an expected sequence) checks concurrency by."""
        traceparent = traceparent_for(event)
        if traceparent != event.traceparent:
            event = event.model_copy(update={"traceparent": traceparent})
        headers = {Headers.MSG_ID: str(event.id), Headers.EVENT_TYPE: event.type}
        if event.traceparent is not None:
            headers[Headers.TRACEPARENT] = event.traceparent
        if expected_last_seq is not None:
            headers[Headers.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_last_seq)
            headers[Headers.EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT] = session_filter(
                event.tenant, event.session_id
            )
        elif expected_last_of_type is not None:
            # The subject published to holds the session's events of this type and no other.
            headers[Headers.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_last_of_type)
        subject = event_subject(event.tenant, event.session_id, event.type)
        body = encode_event(event)
        # JetStream counts the headers too, as they go on the wire.
        size = (
            len(body)
            + len(b"NATS/1.0\r\n\r\n")
            + sum(len(k) + len(v) + 4 for k, v in headers.items())
        )
        if size > EVENTS_STREAM.max_msg_size:
            raise EventTooLarge(event.type, size, EVENTS_STREAM.max_msg_size)
        return _Outgoing(event, subject, body, headers)


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A session's state and the sequence of the last event folded into it."""

    state: SessionState
    """The folded state."""
    last_seq: int
    """Sequence of the last event folded; 0 for a session with no events."""


class EventStore:
    """Appends events with de-duplication and optimistic concurrency, and replays sessions."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        timeout_s: float = 5.0,
        on_append: Callable[[Event, bool], None] | None = None,
    ) -> None:
        """`on_append` is told of each event appended and whether it was a duplicate."""
        self._js = js
        self._stream = EVENTS_STREAM.name
        self._timeout_s = timeout_s
        self._on_append = on_append
        # Reads of a replicated stream may be answered by a replica that is behind (direct
        # gets go to any of them): a read that must reach an event asks again until it does.
        self._replicated: bool | None = None

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context the store reads and appends through."""
        return self._js

    async def append(
        self,
        event: Event,
        *,
        expected_last_seq: int | None = None,
        expected_last_of_type: int | None = None,
    ) -> Appended:
        """Append one event.

        With `expected_last_seq`, the append succeeds only if the session's last event is
        still at that sequence (0: the session has no events); with `expected_last_of_type`,
        only if the session's last event of this event's type is (see `read_since`).
        Otherwise `ConcurrencyConflict` is raised and nothing is written. The event id is the
        JetStream message id, so appending the same event twice within the duplicate window
        stores it once. The event carries the current trace context (see `traceparent_for`).
        """
        if expected_last_seq is not None and expected_last_of_type is not None:
            raise ValueError("expect the session's last event or its last of a type, not both")
        hop = current_hop()
        began = time.perf_counter_ns()
        outgoing = _Outgoing.of(event, expected_last_seq, expected_last_of_type)
        encoded = time.perf_counter_ns()
        try:
            ack = await self._publish(outgoing.subject, outgoing.body, outgoing.headers)
        except APIError as error:
            if error.err_code == WRONG_LAST_SEQUENCE:
                if expected_last_seq is not None:
                    raise ConcurrencyConflict(
                        event.tenant, event.session_id, expected_last_seq
                    ) from error
                if expected_last_of_type is not None:
                    raise ConcurrencyConflict(
                        event.tenant, event.session_id, expected_last_of_type, event.type
                    ) from error
            raise
        if hop is not None:
            hop.encode += encoded - began
            hop.append += time.perf_counter_ns() - encoded
        return self._appended(outgoing, ack)

    async def append_pipelined(self, events: Sequence[Event]) -> list[Appended]:
        """Append events in the order given, sending each without waiting for the one before
        to be acknowledged: one round trip for them all rather than one each.

        JetStream stores the messages of one connection in the order they were sent. Should
        one fail, the ones after it may be stored all the same: the error is raised once
        every acknowledgement is in, the caller's handler fails, and its redelivery appends
        the same events again, which stores only the missing one (ids de-duplicate), after
        the others. So use it for events whose readers do not need them in order when one
        comes late: decisions taken together, not a chain of facts.
        """
        hop = current_hop()
        began = time.perf_counter_ns()
        outgoing = [_Outgoing.of(event, None) for event in events]
        encoded = time.perf_counter_ns()
        pending = [
            # Awaiting each send (not its acknowledgement) keeps them in order.
            await self._js.publish_async(item.subject, item.body, headers=item.headers)
            for item in outgoing
        ]
        async with asyncio.timeout(self._timeout_s):
            acks = await asyncio.gather(*pending)
        if hop is not None:
            hop.encode += encoded - began
            hop.append += time.perf_counter_ns() - encoded
        return [self._appended(item, ack) for item, ack in zip(outgoing, acks, strict=True)]

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> PubAck:
        """Publish, riding out a stream without a leader: sending again is safe, as the
        message id de-duplicates it should the first one have been stored after all."""
        return await through_elections(
            lambda: self._js.publish(subject, body, timeout=self._timeout_s, headers=headers)
        )

    def _appended(self, outgoing: _Outgoing, ack: PubAck) -> Appended:
        duplicate = bool(ack.duplicate)
        record_appended(outgoing.event, len(outgoing.body), duplicate)
        if self._on_append is not None:
            self._on_append(outgoing.event, duplicate)
        return Appended(seq=ack.seq, duplicate=duplicate)

    async def append_atomically(self, events: Sequence[Event]) -> list[Appended]:
        """Append events in the order given as one atomic batch (at most
        `ATOMIC_BATCH_LIMIT`): stored all together, so no reader ever sees some of them
        without the others (a consumer handed the first finds the rest in the log), or
        none of them, raising `APIError` (one of them is stored already, say)."""
        if len(events) > ATOMIC_BATCH_LIMIT:
            raise ValueError(f"{len(events)} events are more than one atomic batch holds")
        if not events:
            return []
        hop = current_hop()
        began = time.perf_counter_ns()
        outgoing = [_Outgoing.of(event, None) for event in events]
        encoded = time.perf_counter_ns()
        batch = uuid.uuid4().hex
        nc = self._js._nc  # nats-py offers atomic batches on no public API yet
        for position, item in enumerate(outgoing, start=1):
            headers = {
                **item.headers,
                Headers.BATCH_ID: batch,
                Headers.BATCH_SEQUENCE: str(position),
            }
            if position < len(outgoing):
                await nc.publish(item.subject, item.body, headers=headers)
                continue
            headers[Headers.BATCH_COMMIT] = "1"
            reply = await nc.request(
                item.subject, item.body, timeout=self._timeout_s, headers=headers
            )
        if hop is not None:
            hop.encode += encoded - began
            hop.append += time.perf_counter_ns() - encoded
        answer = json.loads(reply.data)
        if "error" in answer:
            error = answer["error"]
            raise APIError(
                code=error.get("code"),
                err_code=error.get("err_code"),
                description=error.get("description"),
            )
        # The batch's messages take consecutive sequences, ending at the commit's.
        first = int(answer["seq"]) - len(outgoing) + 1
        return [
            self._appended(item, PubAck(stream=answer["stream"], seq=first + index))
            for index, item in enumerate(outgoing)
        ]

    async def publish(self, subject: str, event: Event) -> Appended:
        """Store an event that belongs to no session's log (the tool registry, a breaker's
        change, a stream warning) on its own subject, de-duplicated by its id; `on_append` is
        told of it like of an appended one."""
        hop = current_hop()
        began = time.perf_counter_ns()
        body = encode_event(event)
        encoded = time.perf_counter_ns()
        ack = await self._publish(subject, body, {Headers.MSG_ID: str(event.id)})
        if hop is not None:
            hop.encode += encoded - began
            hop.append += time.perf_counter_ns() - encoded
        duplicate = bool(ack.duplicate)
        if self._on_append is not None:
            self._on_append(event, duplicate)
        return Appended(seq=ack.seq, duplicate=duplicate)

    async def append_all(
        self, events: Sequence[Event], *, expected_last_seq: int | None = None
    ) -> list[Appended]:
        """Append events of one session in order, each expecting the one before it.

        A conflict can only happen on the first event: after it, each append expects the
        sequence its predecessor landed at, so no other writer can slip in between unseen.
        """
        appended: list[Appended] = []
        expected = expected_last_seq
        for event in events:
            result = await self.append(event, expected_last_seq=expected)
            appended.append(result)
            if expected is not None:
                expected = result.seq
        return appended

    async def last_seq(self, tenant: str, session_id: str) -> int:
        """Sequence of the session's last event; 0 when it has none."""
        return await self._last_seq_matching(session_filter(tenant, session_id))

    async def read(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        up_to_seq: int | None = None,
    ) -> AsyncIterator[StoredEvent]:
        """The session's events after `after_seq`, up to `up_to_seq` or its current last event.

        Events appended while reading are not included: the end is fixed when reading starts.
        """
        for item in await self.read_all(
            tenant, session_id, after_seq=after_seq, up_to_seq=up_to_seq
        ):
            yield item

    async def read_all(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        up_to_seq: int | None = None,
        known_seq: int = 0,
    ) -> list[StoredEvent]:
        """Like `read`, as one list. `known_seq`: the sequence of an event of the session
        known to be stored (one delivered): the read reaches it, whichever replica of a
        clustered stream answers."""
        stored: list[StoredEvent] = []
        subject_filter = session_filter(tenant, session_id)
        await self._read_session(
            subject_filter,
            after_seq=after_seq,
            up_to_seq=up_to_seq,
            receive=stored.append,
            reach=await self._must_reach(subject_filter, up_to_seq, known_seq),
        )
        return stored

    async def read_page(
        self, tenant: str, session_id: str, *, after_seq: int, limit: int, known_seq: int = 0
    ) -> tuple[list[StoredEvent], bool]:
        """At most `limit` of the session's events after `after_seq`, oldest first, and
        whether more were stored after them: a page of a long log costs what it holds, where
        `read_all` reads on to the end. `known_seq` is as for `read_all`."""
        subject_filter = session_filter(tenant, session_id)
        stored: list[StoredEvent] = []
        position, taken, more = after_seq, 0, True
        while more and taken < limit:
            batch, more = await self._direct_batch(
                subject_filter, position + 1, reach=known_seq, size=min(DIRECT_BATCH, limit - taken)
            )
            for seq, data in batch:
                _deliver_stored(seq, data, subject_filter, stored.append)
                position = seq
            taken += len(batch)
        return stored, more

    async def _must_reach(self, subject_filter: str, up_to_seq: int | None, known_seq: int) -> int:
        """The sequence a session's read must reach: the one the caller knows is stored; and
        for a read to the session's end on a replicated stream, its last event as the
        stream's leader knows it, so that a decision recorded by a process that died is seen
        (one more request; none on a single server, whose answer is always current)."""
        if up_to_seq is None and await self._is_replicated():
            return max(known_seq, await self._last_seq_matching(subject_filter))
        return known_seq

    async def _is_replicated(self) -> bool:
        if self._replicated is None:
            info = await through_elections(lambda: self._js.stream_info(self._stream))
            self._replicated = (info.config.num_replicas or 1) > 1
        return self._replicated

    async def read_at(self, tenant: str, session_id: str, seq: int) -> StoredEvent | None:
        """The session's event stored at `seq`; None when the log holds none of the
        session's there (the sequence is another session's, or the event was pruned)."""
        subject_filter = session_filter(tenant, session_id)
        try:
            message = await self._js.get_msg(
                self._stream, seq, subject=subject_filter, next=True, direct=True
            )
        except NotFoundError:
            return None
        if message.seq != seq or message.data is None:
            return None
        found: list[StoredEvent] = []
        _deliver_stored(seq, message.data, subject_filter, found.append)
        return found[0] if found else None

    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        up_to_seq: int | None = None,
        start: SessionSnapshot | None = None,
        nearest_stored: Callable[[], Awaitable[SessionSnapshot | None]] | None = None,
        known_seq: int = 0,
    ) -> SessionSnapshot:
        """The session's state folded from its whole log (or up to a sequence); from `start`,
        the state at an earlier sequence, only the events after it are read.

        `nearest_stored` is asked only when the events to fold are more than one read
        brings: it may offer a state stored further on (see `FoldedStates`), and then only
        the events after that one are read. A short session is thus read in one request.
        `known_seq` is as for `read_all`.
        """
        subject_filter = session_filter(tenant, session_id)
        after_seq = start.last_seq if start is not None else 0
        reach = await self._must_reach(subject_filter, up_to_seq, known_seq)
        batch = await self._direct_batch(subject_filter, after_seq + 1, reach=reach)
        first: _Batch | None = batch
        if nearest_stored is not None and _reaches_past(batch, up_to_seq):
            nearer = await nearest_stored()
            if nearer is not None and nearer.last_seq > after_seq:
                # Fold on from there, reading anew: the batch read most often ends before it.
                start, after_seq, first = nearer, nearer.last_seq, None
        folding = SessionFold(start.state if start is not None else None)
        last_seq = after_seq

        def apply(item: StoredEvent) -> None:
            nonlocal last_seq
            folding.apply(item.event)
            last_seq = item.seq

        # Folding each event as it arrives, without keeping it, is the fastest replay.
        await self._read_session(
            subject_filter, after_seq=after_seq, up_to_seq=up_to_seq, receive=apply, first=first
        )
        return SessionSnapshot(state=folding.state(), last_seq=last_seq)

    async def read_since(
        self, tenant: str, session_id: str, event_type: str, *, since: datetime
    ) -> EventsOfType:
        """The session's events of one type stored since a time, oldest first, and the
        sequence of its last event of that type: what to count before deciding, and what
        the decision's append then expects (`expected_last_of_type`), so that a decision
        counted before another writer added to the count is not recorded."""
        subject = event_subject(tenant, session_id, event_type)
        stored: list[StoredEvent] = []
        first = await self._direct_batch(subject, 1, since=since)
        await self._read_session(
            subject, after_seq=0, up_to_seq=None, receive=stored.append, first=first
        )
        # Read up to now, the window ends with the type's last event, if it holds any.
        last_seq = stored[-1].seq if stored else await self._last_seq_matching(subject)
        return EventsOfType(stored, last_seq)

    async def read_matching(
        self, subject_filter: str, *, since: datetime | None = None
    ) -> list[StoredEvent]:
        """Every stored event on subjects matching a filter (across sessions), oldest first.

        `since` skips events stored before that time, without reading them.
        """
        stored: list[StoredEvent] = []
        await self._replay(
            subject_filter, after_seq=0, up_to_seq=None, receive=stored.append, since=since
        )
        return stored

    async def read_last(self, tenant: str, session_id: str, event_type: str) -> StoredEvent | None:
        """The session's last event of one type (from the stream's leader: current on a
        cluster too); None when it has none."""
        subject = event_subject(tenant, session_id, event_type)
        try:
            message = await through_elections(lambda: self._js.get_last_msg(self._stream, subject))
        except NotFoundError:
            return None
        if message.seq is None or message.data is None:
            return None
        found: list[StoredEvent] = []
        _deliver_stored(message.seq, message.data, subject, found.append)
        return found[0] if found else None

    async def log_end(self) -> int:
        """Sequence of the last event of any session; 0 when the log is empty."""
        return await self._last_seq_matching(ALL_EVENTS)

    async def replay_log(
        self, receive: Callable[[StoredEvent], None], *, after_seq: int, up_to_seq: int
    ) -> None:
        """Hand every session's events after `after_seq` up to `up_to_seq` to `receive`, in
        stream order, as they are read (nothing is kept: for folding the whole log)."""
        await self._replay(ALL_EVENTS, after_seq=after_seq, up_to_seq=up_to_seq, receive=receive)

    async def _last_seq_matching(self, subject_filter: str) -> int:
        try:
            message = await through_elections(
                lambda: self._js.get_last_msg(self._stream, subject_filter)
            )
        except NotFoundError:
            return 0
        return message.seq or 0

    async def _read_session(
        self,
        subject_filter: str,
        *,
        after_seq: int,
        up_to_seq: int | None,
        receive: Callable[[StoredEvent], None],
        first: _Batch | None = None,
        reach: int = 0,
    ) -> None:
        """Hand one session's events after `after_seq`, up to `up_to_seq` or its last event
        when reading ends, to `receive`, in order (`first`: the batch from `after_seq` on,
        when already read; `reach`: see `_direct_batch`).

        Most sessions are short: their events come in one batched direct get, which costs
        a few times less than creating and deleting the consumer a replay streams through
        (and every service replays each session it meets once). A longer session's other
        events stream through such a consumer, which reads long logs faster.
        """
        position = after_seq
        with bulk_allocation():
            batch, more = first or await self._direct_batch(
                subject_filter, after_seq + 1, reach=reach
            )
            for seq, data in batch:
                if up_to_seq is not None and seq > up_to_seq:
                    return
                _deliver_stored(seq, data, subject_filter, receive)
                position = seq
        if more and (up_to_seq is None or position < up_to_seq):
            await self._replay(
                subject_filter, after_seq=position, up_to_seq=up_to_seq, receive=receive
            )

    async def _direct_batch(
        self,
        subject_filter: str,
        from_seq: int,
        *,
        since: datetime | None = None,
        reach: int = 0,
        size: int = DIRECT_BATCH,
    ) -> _Batch:
        """Up to `size` stored messages on `subject_filter` from `from_seq` on (or
        from the first stored at or after `since`), with their sequences; and whether more
        were stored after them. The answer holds `reach`, a sequence known to be stored on
        the subjects (or goes past it): a replica behind it answered without it, and the
        request is sent again (to whichever replica takes it) until one is current."""
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        pause = _BEHIND_FIRST_PAUSE_S
        while True:
            batch, more = await self._direct_batch_once(subject_filter, from_seq, since, size)
            behind = reach >= from_seq and not more and (not batch or batch[-1][0] < reach)
            if not behind:
                return batch, more
            if asyncio.get_running_loop().time() + pause > deadline:
                raise TimeoutError(f"no replica of {self._stream} answered up to {reach}")
            # Nothing to wait on: the replica catches up by itself, in milliseconds.
            await asyncio.sleep(pause)
            pause = min(pause * 2, _BEHIND_MAX_PAUSE_S)

    async def _direct_batch_once(
        self, subject_filter: str, from_seq: int, since: datetime | None, size: int
    ) -> _Batch:
        """One batched direct get."""
        nc = self._js._nc  # nats-py offers batched direct gets on no public API yet
        inbox = nc.new_inbox()
        batch: list[tuple[int, bytes]] = []
        ended: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

        async def collect(message: Msg) -> None:
            headers = message.headers or {}
            if Header.STATUS not in headers:
                batch.append((int(headers[STORED_SEQUENCE]), message.data))
            elif not ended.done():
                ended.set_result(headers)

        subscription = await nc.subscribe(inbox, cb=collect)
        try:
            request: dict[str, object] = {"next_by_subj": subject_filter, "batch": size}
            if since is None:
                request["seq"] = from_seq
            else:
                request["start_time"] = since.isoformat()
            await nc.publish(
                f"$JS.API.DIRECT.GET.{self._stream}", json.dumps(request).encode(), reply=inbox
            )
            end = await asyncio.wait_for(ended, timeout=self._timeout_s)
        finally:
            await subscription.unsubscribe()
        status = end[Header.STATUS]
        if status == NOT_FOUND:
            return batch, False
        if status != END_OF_BATCH:
            raise RuntimeError(f"direct get of {subject_filter} from {from_seq}: status {status}")
        # The end of a batch tells how many matching messages it left out.
        pending = end.get(PENDING_AFTER_BATCH)
        return batch, int(pending) > 0 if pending is not None else len(batch) == size

    async def _replay(
        self,
        subject_filter: str,
        *,
        after_seq: int,
        up_to_seq: int | None,
        receive: Callable[[StoredEvent], None],
        since: datetime | None = None,
    ) -> None:
        last = await self._last_seq_matching(subject_filter)
        end = last if up_to_seq is None else min(up_to_seq, last)
        if end <= after_seq:
            return
        finished = asyncio.get_running_loop().create_future()

        # Decoding inside the delivery callback avoids a queue hop per event, which is most
        # of the cost of a replay after decoding itself.
        async def deliver(message: Msg) -> None:
            if finished.done():
                return
            seq, _, pending, _, _ = ack_position(message.reply)
            if seq <= end:
                _deliver_stored(seq, message.data, message.subject, receive)
            if seq >= end or pending == 0:
                finished.set_result(None)

        with bulk_allocation():
            start = (
                ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
                if since is not None
                else ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
                )
            )
            subscription = await through_elections(
                lambda: self._js.subscribe(
                    subject_filter,
                    ordered_consumer=True,
                    config=start,
                    cb=deliver,
                    pending_msgs_limit=1_000_000,
                    pending_bytes_limit=1 << 30,
                )
            )
            if since is not None and not finished.done():
                info = await subscription.consumer_info()
                if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
                    finished.set_result(None)  # Nothing was stored since then.
            try:
                await asyncio.wait_for(finished, timeout=self._timeout_s + (end - after_seq) / 1000)
            finally:
                await subscription.unsubscribe()
                # The server keeps an ephemeral consumer for seconds after its subscriber
                # leaves, and refuses new ones past its limit (1,000 here): a service or an
                # API that replays many sessions a second must not leave them behind.
                with contextlib.suppress(NotFoundError):
                    await self._js.delete_consumer(subscription._stream, subscription._consumer)


def _reaches_past(batch: _Batch, up_to_seq: int | None) -> bool:
    """Whether events to fold remain after `batch` (they do not when it ends at `up_to_seq`)."""
    messages, more = batch
    return more and (up_to_seq is None or not messages or messages[-1][0] < up_to_seq)


def _deliver_stored(
    seq: int, data: bytes, subject: str, receive: Callable[[StoredEvent], None]
) -> None:
    try:
        event = decode_event(data)
    except UndecodableEvent as error:
        # Not an event of this catalogue (a foreign publisher, a newer build): consumers
        # dead-letter it; a replay leaves it out rather than stall.
        logger.warning("skipping undecodable message %d of %s: %s", seq, subject, error)
        return
    receive(StoredEvent(seq=seq, event=event))


_gc_pauses = 0


@contextmanager
def bulk_allocation() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many short-lived objects.

    Replaying a long session allocates millions of small objects that are all reachable;
    the collector's generation scans over them halve replay speed and free nothing.
    Reference counting still frees garbage meanwhile. Pauses nest.
    """
    global _gc_pauses
    _gc_pauses += 1
    was_enabled = gc.isenabled()
    if _gc_pauses == 1 and was_enabled:
        gc.disable()
    try:
        yield
    finally:
        _gc_pauses -= 1
        if _gc_pauses == 0 and was_enabled:
            gc.enable()
