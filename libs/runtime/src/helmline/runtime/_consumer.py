"""Durable consumers shared by a service's replicas, with explicit acks and dead letters.

Messages are pushed to a deliver subject that every replica subscribes to in one queue
group, so a message reaches one replica as soon as it is stored, with no polling. Within a
replica, events of one session are handled in stream order and sessions run concurrently
(unless the consumer opts out of session order: then every message runs at once).
A consumer may let events gather (`gather_s`): those its handler says may wait are handed
over together, in stream order, once the time is up or an event that may not wait arrives.
How a message ends is decided by how its handler ends: normally (ack), `Deferred` (delivered
again at the time it names), `RetryableError` or an unexpected exception (redelivered after
a backoff, at most `max_deliver` times), or `PermanentError` / an undecodable body
(dead-lettered with the reason, then terminated).

An event of a type the service does not know (one this build cannot decode, or one its
handler has no method for: a newer producer's, reaching an older replica during an upgrade)
is acknowledged and skipped, counted in `helmline_events_skipped_total` and logged once per
type: the same policy in every service. Dead-lettering it would park every such event of
the upgrade; redelivering it would keep it, and its session's later events, waiting for a
replica that may never come.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple, Protocol, runtime_checkable

import nats.errors
from cachetools import LRUCache
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.trace import NoOpTracer, Span, Status, StatusCode, Tracer

from helmline.contracts import (
    EVENT_CLASSES,
    UPCASTERS,
    ConsumerSpec,
    DeadLetter,
    Event,
    Headers,
    UndecodableEvent,
    UnknownEventType,
    UpcasterRegistry,
    dead_letter_subject,
    decode_event,
    deliver_subject,
    parse_event_subject,
    retry_subject,
    session_filter,
)
from helmline.runtime._errors import Deferred, NotHandled, PermanentError, RetryableError
from helmline.runtime._logging import log_context
from helmline.runtime._metrics import ServiceMetrics
from helmline.runtime._phases import Hop, handling
from helmline.runtime._router import Routed
from helmline.runtime._tracing import gathered_spans, handling_span

logger = logging.getLogger(__name__)

V1_ACK_TOKENS = 9
REDELIVERY_DELAYS_S = (0.1, 0.5, 2.0, 5.0, 15.0)
SETTLED = frozenset({"ok", "deferred", "skipped"})
"""Outcomes of a handler that are no error."""
KNOWN_TYPES = frozenset(payload.TYPE for payload in EVENT_CLASSES)
"""The event types this build decodes."""
SESSION_TRACES_KEPT = 10_000
"""Sessions whose trace a consumer remembers for intents that carry none."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event handed to a handler."""

    event: Event
    """The decoded event."""
    seq: int
    """Its stream sequence."""
    deliveries: int
    """1 on first delivery, more after redeliveries, as the server counts them."""
    shared: bool = True
    """Whether another replica may have been handed some of the consumer's messages since
    this one started: then a cached session may lack events that replica handled or
    appended (see `SessionCache`). True unless the consumer knows it has been alone."""
    stored_before_connect: bool = False
    """The event was stored before the consumer last (re)connected to NATS, so an earlier
    process may have been handed it although the server counts this delivery as the first:
    a power loss can cost a server its record of deliveries (a consumer's state is not
    fsynced with each one), never an event it acknowledged (tests/e2e/test_power_loss.py)."""

    @property
    def maybe_handled(self) -> bool:
        """Whether the event may have been handled before (a redelivery, or stored before the
        consumer last connected): a handler with side effects asks the log (the session's state
        folded from it: `LogStates`) before acting."""
        return self.deliveries > 1 or self.stored_before_connect


Handler = Callable[[Delivery], Awaitable[None]]

Admission = Callable[[Delivery], Awaitable[Delivery | None]]
"""Decides what of a delivery reaches the handler: it as it is, changed, or nothing (see
`History`)."""


@runtime_checkable
class GatheringHandler(Protocol):
    """A handler for a consumer that lets events gather."""

    async def __call__(self, delivery: Delivery) -> None:
        """Handle one event: one that may not wait, or one of a gathering that failed."""

    def may_wait(self, event: Event) -> bool:
        """Whether the event may be handled late, together with others."""

    async def handle_gathered(self, deliveries: Sequence[Delivery]) -> None:
        """Handle events that waited, in stream order; all of them, or raise (each is then
        handled alone, as if it had not waited)."""


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    """The JetStream configuration of a durable push consumer definition."""
    return ConsumerConfig(
        durable_name=spec.durable,
        description=spec.description,
        deliver_subject=deliver_subject(spec.durable),
        deliver_group=spec.durable,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subjects=list(spec.filter_subjects),
    )


class EventConsumer:
    """Feeds one durable consumer's events to a handler until stopped."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        spec: ConsumerSpec,
        handler: Handler,
        upcasters: UpcasterRegistry = UPCASTERS,
        *,
        metrics: ServiceMetrics | None = None,
        tracer: Tracer | None = None,
        admit: Admission | None = None,
    ) -> None:
        """`admit` decides, before the handler runs, whether (and how) it sees each event:
        an event it holds back is acknowledged, handled.

        A handler with a router (`Routed`) must handle every type `spec` receives: else
        `RoutingError`, before any message is taken."""
        if isinstance(handler, Routed):
            handler.router.refuse_unhandled(spec)
        self._admit = admit
        self._nc = nc
        self._js = js
        self._spec = spec
        self._handler = handler
        self._upcasters = upcasters
        self._metrics = metrics
        self._tracer = tracer or NoOpTracer()
        self._session_traces: LRUCache[str, str | None] = LRUCache(SESSION_TRACES_KEPT)
        self._subscription: Subscription | None = None
        self._retries: Subscription | None = None
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._in_flight: dict[asyncio.Task[None], tuple[Msg, ...]] = {}
        self._keepalive: asyncio.Task[None] | None = None
        self._gatherer: GatheringHandler | None = None
        if spec.gather_s > 0:
            if not isinstance(handler, GatheringHandler):
                raise TypeError(f"{spec.durable} gathers events; its handler must too")
            self._gatherer = handler
        self._gathered: list[tuple[Msg, Event, Hop]] = []
        self._skipped_types: set[str] = set()
        self._gathering: asyncio.TimerHandle | None = None
        # Every message handed to a replica takes the consumer's next sequence: a sequence
        # this replica never saw went to another one. Once that happened, it stays shared.
        self._last_consumer_seq: int | None = None
        self._shared = False
        self._fresh_after_ns = time.time_ns()

    @property
    def running(self) -> bool:
        """Whether messages are being received."""
        return self._subscription is not None

    def reconnected(self) -> None:
        """The connection to NATS was lost and made again: the server may have restarted, and
        what was stored before now may have been handed out already (see `Delivery`)."""
        self._fresh_after_ns = time.time_ns()

    def _delivery(self, event: Event, position: AckPosition) -> Delivery:
        before = position.stored_ns < self._fresh_after_ns
        return Delivery(event, position.seq, position.deliveries, self._shared, before)

    async def start(self) -> None:
        """Create or update the durable consumer and start receiving."""
        self._fresh_after_ns = time.time_ns()
        # Without an explicit action JetStream creates the consumer or updates it in place.
        await self._js.add_consumer(self._spec.stream, consumer_config(self._spec))
        self._subscription = await self._nc.subscribe(
            deliver_subject(self._spec.durable),
            queue=self._spec.durable,
            cb=self._receive,
            pending_msgs_limit=self._spec.max_ack_pending * 2,
        )
        self._retries = await self._nc.subscribe(
            retry_subject(self._spec.durable), queue=self._spec.durable, cb=self._retry
        )
        self._keepalive = asyncio.create_task(self._keep_in_flight_alive())

    async def refresh_lag(self) -> None:
        """Read the consumer's lag from JetStream into the metrics."""
        if self._metrics is None:
            return
        info = await self._js.consumer_info(self._spec.stream, self._spec.durable)
        self._metrics.consumer_pending.labels(self._spec.durable).set(info.num_pending or 0)
        self._metrics.consumer_ack_pending.labels(self._spec.durable).set(info.num_ack_pending or 0)

    async def stop(self, grace_s: float) -> None:
        """Stop receiving, then give in-flight messages `grace_s` seconds to finish.

        Messages still running after the grace period are left unacknowledged; JetStream
        delivers them again (to another replica, or to this one after a restart).
        """
        for subscription in (self._subscription, self._retries):
            if subscription is not None:
                await subscription.unsubscribe()
        self._subscription = self._retries = None
        self._hand_over_gathered()
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=grace_s)
        for task in set(self._in_flight):
            task.cancel()
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None

    async def _receive(self, message: Msg) -> None:
        # Returns at once so the next message is read; per-session order is kept by chaining
        # each session's messages on the task of the one before.
        received = time.perf_counter_ns()
        position = ack_position(message.reply)
        hop = Hop(wait_ns=max(0, time.time_ns() - position.stored_ns), received_ns=received)
        self._note_consumer_seq(position.consumer_seq)
        event = None
        if self._gatherer is not None:
            with contextlib.suppress(UndecodableEvent):  # Dead-lettered when handled.
                event = decode_event(message.data, self._upcasters)
                hop.decode = time.perf_counter_ns() - received
                if self._gatherer.may_wait(event):
                    self._gather(message, event, hop)
                    return
            # Whatever gathered comes before this event, in its session's order too.
            self._hand_over_gathered()
        key = self._key_of(message)
        previous = self._tails.get(key)
        task = asyncio.create_task(
            self._handle(message, event, hop)
            if previous is None
            else self._handle_after(previous, message, event, hop)
        )
        self._follow(task, [key], (message,))

    def _note_consumer_seq(self, consumer_seq: int) -> None:
        last = self._last_consumer_seq
        if last is not None and consumer_seq != last + 1:
            self._shared = True
        self._last_consumer_seq = consumer_seq

    def _key_of(self, message: Msg) -> str:
        return _ordering_key(message.subject) if self._spec.in_session_order else message.reply

    def _follow(
        self, task: asyncio.Task[None], keys: Iterable[str], messages: tuple[Msg, ...]
    ) -> None:
        """Make `task` the last in line for each of `keys`, handling `messages`."""
        self._in_flight[task] = messages
        for key in keys:
            self._tails[key] = task
            task.add_done_callback(functools.partial(self._forget, key))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        messages = self._in_flight.pop(task, ())
        if self._tails.get(key) is task:
            del self._tails[key]
        if not task.cancelled() and task.exception() is not None and messages:
            # Acking or dead-lettering failed (NATS unreachable): the messages stay
            # unacknowledged and JetStream redelivers them after ack_wait.
            subjects = ", ".join(message.subject for message in messages)
            logger.error("could not settle %s", subjects, exc_info=task.exception())

    def _gather(self, message: Msg, event: Event, hop: Hop) -> None:
        self._gathered.append((message, event, hop))
        if self._gathering is None:
            self._gathering = asyncio.get_running_loop().call_later(
                self._spec.gather_s, self._hand_over_gathered
            )

    def _hand_over_gathered(self) -> None:
        """Start handling the events gathered so far, after what came before them."""
        if self._gathering is not None:
            self._gathering.cancel()
            self._gathering = None
        gathered, self._gathered = self._gathered, []
        if not gathered:
            return
        keys = list(dict.fromkeys(self._key_of(message) for message, _, _ in gathered))
        before = [tail for key in keys if (tail := self._tails.get(key)) is not None]
        task = asyncio.create_task(self._handle_gathered(before, gathered))
        self._follow(task, keys, tuple(message for message, _, _ in gathered))

    async def _handle_gathered(
        self, before: list[asyncio.Task[None]], gathered: list[tuple[Msg, Event, Hop]]
    ) -> None:
        assert self._gatherer is not None
        for previous in before:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(previous)
        deliveries = []
        for message, event, _ in gathered:
            position = ack_position(message.reply)
            deliveries.append(self._delivery(event, position))
        traced = [(event, await self._trace_of(event)) for _, event, _ in gathered]
        # The events share one handling: each hop is charged all of it (the phases of a
        # gathered hop say how long each event took, not what it cost).
        shared = Hop()
        began = time.perf_counter_ns()
        try:
            with handling(shared):
                admitted = await self._admitted(deliveries)
                shared.admit = time.perf_counter_ns() - began
                with gathered_spans(self._tracer, self._spec.durable, traced):
                    if admitted:
                        await self._gatherer.handle_gathered(admitted)
        except asyncio.CancelledError:
            raise
        except Exception:  # Each is handled alone, which decides its redelivery.
            logger.warning("%d events handled together failed", len(gathered), exc_info=True)
            for message, event, hop in gathered:
                await self._handle(message, event, hop)
            return
        handled = time.perf_counter_ns()
        shared.handle = handled - began - shared.admit
        # No await between them yields: the acks leave in one write.
        for message, _, _ in gathered:
            await message.ack()
        acked = time.perf_counter_ns()
        if self._metrics is not None:
            seconds = (handled - began) / 1e9
            for _, event, hop in gathered:
                self._metrics.handled(self._spec, event, "ok", seconds)
                hop.charge(shared, queued_until=began, acked_ns=acked - handled)
                self._metrics.hop(self._spec, hop)

    async def _handle_after(
        self, previous: asyncio.Task[None] | None, message: Msg, event: Event | None, hop: Hop
    ) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(previous)
        await self._handle(message, event, hop)

    async def _handle(self, message: Msg, event: Event | None, hop: Hop) -> None:
        """Handle a message (`event`: its body, when it was decoded already), timing its
        `hop`."""
        began = time.perf_counter_ns()
        hop.queue = began - hop.received_ns - hop.decode
        position = ack_position(message.reply)
        if event is None:
            try:
                event = decode_event(message.data, self._upcasters)
            except UndecodableEvent as error:
                unknown = _unknown_type(message.subject)
                if isinstance(error, UnknownEventType) and unknown is not None:
                    await self._skip(message, unknown)
                    return
                reason = f"undecodable: {error}"
                await self._dead_letter(message, "undecodable", reason, position.deliveries)
                return
            hop.decode = time.perf_counter_ns() - began
            began += hop.decode
        with self._context_of(event, await self._trace_of(event)) as span:
            outcome = await self._settle(message, self._delivery(event, position), hop)
            seconds = (time.perf_counter_ns() - began) / 1e9
            if outcome not in SETTLED:
                span.set_status(Status(StatusCode.ERROR, outcome))
            logger.debug("handled %s: %s in %.1f ms", event.type, outcome, seconds * 1000)
        if self._metrics is not None:
            self._metrics.handled(self._spec, event, outcome, seconds)
            if outcome == "ok":
                self._metrics.hop(self._spec, hop)

    @contextlib.contextmanager
    def _context_of(self, event: Event, traceparent: str | None) -> Iterator[Span]:
        """While handling `event`: its session on every log line, a span in its trace."""
        with (
            log_context(tenant=event.tenant, session_id=event.session_id, event_type=event.type),
            handling_span(self._tracer, self._spec.durable, event, traceparent) as span,
        ):
            yield span

    async def _trace_of(self, event: Event) -> str | None:
        """The trace an event continues: its own; or, for an intent that carries none (a
        person's approval or pause, appended outside any span), its session's: where the
        session's latest event handled here left it, else where its first event began it.

        An approval thus continues from the request it answers, which this consumer has
        usually seen, and costs no read on its way from the person to the tool."""
        key = f"{event.tenant}/{event.session_id}"
        if event.traceparent is not None:
            self._session_traces[key] = event.traceparent
            return event.traceparent
        if event.causation_id is not None:
            return None
        if key not in self._session_traces:
            traceparent = None
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                first = await self._js.get_msg(
                    self._spec.stream,
                    1,
                    subject=session_filter(event.tenant, event.session_id),
                    next=True,
                )
                traceparent = (first.headers or {}).get(Headers.TRACEPARENT)
            self._session_traces[key] = traceparent
        return self._session_traces[key]

    async def _settle(self, message: Msg, delivery: Delivery, hop: Hop) -> str:
        """Run the handler and ack, nak or dead-letter the message; say which."""
        deliveries = delivery.deliveries
        try:
            began = time.perf_counter_ns()
            admitted = await self._admitted([delivery])
            admitted_at = time.perf_counter_ns()
            hop.admit = admitted_at - began
            if admitted:
                with handling(hop):
                    await self._handler(admitted[0])
                hop.handle = time.perf_counter_ns() - admitted_at
        except NotHandled as unknown:
            await self._skip(message, unknown.event_type)
            return "skipped"
        except PermanentError as error:
            await self._dead_letter(message, "permanent", f"permanent error: {error}", deliveries)
            return "dead_letter"
        except Deferred as deferral:
            delay = max(0.0, (deferral.until - datetime.now(UTC)).total_seconds())
            logger.info("deferring %s by %.1f s: %s", message.subject, delay, deferral)
            await message.nak(delay=delay)
            return "deferred"
        except asyncio.CancelledError:
            raise
        except Exception as error:  # Any failure decides redelivery; none is skipped.
            if deliveries >= self._spec.max_deliver:
                await self._dead_letter(
                    message,
                    "exhausted",
                    f"gave up after {deliveries} deliveries: {error!r}",
                    deliveries,
                )
                return "dead_letter"
            logger.warning(
                "retrying %s (delivery %d): %r",
                message.subject,
                deliveries,
                error,
                exc_info=not isinstance(error, RetryableError),
            )
            delay = REDELIVERY_DELAYS_S[min(deliveries, len(REDELIVERY_DELAYS_S)) - 1]
            await message.nak(delay=delay)
            return "retry"
        began = time.perf_counter_ns()
        await message.ack()
        hop.ack = time.perf_counter_ns() - began
        return "ok"

    async def _admitted(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        if self._admit is None:
            return list(deliveries)
        return [
            admitted
            for delivery in deliveries
            if (admitted := await self._admit(delivery)) is not None
        ]

    async def _skip(self, message: Msg, event_type: str) -> None:
        """Acknowledge an event of a type the service does not know, counted, and logged
        the first time the type comes."""
        await message.ack()
        if event_type not in self._skipped_types:
            self._skipped_types.add(event_type)
            logger.warning(
                "%s skips %s events: its service does not handle them (each is acknowledged "
                "and counted in helmline_events_skipped_total; this is logged once)",
                self._spec.durable,
                event_type,
            )
        if self._metrics is not None:
            self._metrics.events_skipped.labels(self._spec.durable, event_type).inc()

    async def _dead_letter(self, message: Msg, kind: str, reason: str, deliveries: int) -> None:
        metadata = message.metadata
        letter = DeadLetter(
            consumer=self._spec.durable,
            stream=metadata.stream,
            stream_seq=metadata.sequence.stream,
            subject=message.subject,
            reason=reason,
            deliveries=deliveries,
            payload=message.data.decode("utf-8", errors="replace"),
            headers=dict(message.headers or {}),
            at=datetime.now(UTC),
        )
        logger.error("dead-lettered %s seq %d: %s", message.subject, letter.stream_seq, reason)
        # Park the message before terminating it, so a crash in between redelivers it
        # rather than losing it.
        await self._js.publish(
            dead_letter_subject(self._spec.durable),
            letter.model_dump_json().encode(),
            headers={
                Headers.MSG_ID: f"{self._spec.durable}:{letter.stream_seq}",
                Headers.DEAD_LETTER_REASON: reason[:200],
            },
        )
        await message.term()
        if self._metrics is not None:
            self._metrics.dead_letters.labels(self._spec.durable, kind).inc()

    async def _retry(self, request: Msg) -> None:
        """Handle a dead-lettered message again, on an operator's request; reply how it went.

        The message is read back from the stream by its sequence, so a retry runs the code
        this replica has now: a fixed handler, or an upcaster added since.
        """
        try:
            asked = json.loads(request.data)
            seq = int(asked["stream_seq"])
            # A parked message was delivered before and may have been acted on: it comes as
            # a redelivery, so that a handler checks the log before acting again (a tool
            # call already sent is not sent twice).
            deliveries = int(asked.get("deliveries", 1)) + 1
            stored = await self._js.get_msg(self._spec.stream, seq)
            event = decode_event(stored.data or b"", self._upcasters)
            with self._context_of(event, await self._trace_of(event)):
                await self._handler(Delivery(event, seq, deliveries))
        except Exception as error:  # The operator gets the reason; the letter stays parked.
            outcome = {"ok": False, "reason": f"{type(error).__name__}: {error}"}
        else:
            outcome = {"ok": True, "reason": ""}
        await request.respond(json.dumps(outcome).encode())

    async def _keep_in_flight_alive(self) -> None:
        # Long handlers (a sandboxed command, a model call) must not be redelivered while
        # they still run, so their messages are marked in progress well before ack_wait.
        interval = max(self._spec.ack_wait_s / 3, 0.5)
        while True:
            await asyncio.sleep(interval)
            for messages in list(self._in_flight.values()):
                for message in messages:
                    with contextlib.suppress(nats.errors.Error):
                        await message.in_progress()


class AckPosition(NamedTuple):
    """Where a delivered message stands, as its ack subject says."""

    seq: int
    """Its stream sequence."""
    deliveries: int
    """Deliveries so far."""
    pending: int
    """Messages the consumer still has to deliver after it."""
    consumer_seq: int
    """The consumer's count of deliveries (to any replica), this one included."""
    stored_ns: int
    """When the server stored the message (its clock, nanoseconds since the epoch)."""


def ack_position(ack_subject: str) -> AckPosition:
    """A delivery's position, from its ack subject.

    What `Msg.metadata` parses, without building its objects (a timestamp among them), which
    cost more than the rest of a delivery's bookkeeping.
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`,
    or with `<domain>.<account hash>` after `$JS.ACK` and a token at the end.
    """
    tokens = ack_subject.split(".")
    if len(tokens) == V1_ACK_TOKENS:
        return AckPosition(
            int(tokens[5]), int(tokens[4]), int(tokens[8]), int(tokens[6]), int(tokens[7])
        )
    return AckPosition(
        int(tokens[7]), int(tokens[6]), int(tokens[10]), int(tokens[8]), int(tokens[9])
    )


def _unknown_type(subject: str) -> str | None:
    """The event type an event subject names, if this build does not know it."""
    try:
        event_type = parse_event_subject(subject).event_type
    except ValueError:
        return None
    return None if event_type in KNOWN_TYPES else event_type


def _ordering_key(subject: str) -> str:
    try:
        parts = parse_event_subject(subject)
    except ValueError:
        return subject
    return f"{parts.tenant}/{parts.session_id}"
