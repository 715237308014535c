"""Where one hop's time goes: an event from its append to the ack of its delivery.

A hop is one delivered event handled by one consumer. Its phases, and who measures them:

- `wait`: from JetStream storing the event (the timestamp in the delivery's ack subject, the
  server's clock) to this process receiving it (this host's clock): compare the two clocks
  before trusting it across machines. The consumer measures it.
- `queue`: from receiving the event to starting on it, waiting for the session's earlier
  events to be handled (or for a gathering to be handed over). The consumer.
- `decode`: parsing and validating the body into its event class; one step (`decode_event`
  validates while it parses), so there is no separate validate phase. The consumer.
- `admit`: deciding whether the handler sees the event (`History`, for consumers that
  decide: a redelivery reads the log there). The consumer.
- `read`: reading the session's log to bring its state up to date (a session met after its
  start, a redelivery, a consumer shared with other replicas). `SessionCache`.
- `fold`: advancing the session's state by the events delivered and by the service's own
  appended decisions (`SessionCache.advance` and `.record`, less their reads).
- `encode`: the trace context, headers and JSON of each event appended. `EventStore`.
- `append`: publishing each appended event and waiting for JetStream's ack. `EventStore`.
- `decide`: the handler's time less `read`, `fold`, `encode` and `append`: its decision,
  and whatever other I/O it does itself (a tool call in the gateway, a command in the
  sandbox, a model call in the planner). The runtime cannot see inside it without each
  service timing its own code.
- `ack`: acknowledging the delivery; nats-py sends an ack without waiting for an answer,
  so this is the time to hand it to the connection, not to reach the server.

The store and the session cache add to the hop being handled through a context variable that
the consumer sets around the handler, so services need no code of their own; an append or a
fold outside any handler (a sweep, a background task started by one) counts nowhere.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

PHASES = (
    "wait",
    "queue",
    "decode",
    "admit",
    "read",
    "fold",
    "decide",
    "encode",
    "append",
    "ack",
)
"""A hop's phases, in the order they happen (`read`, `fold`, `encode` and `append` may
interleave with `decide`)."""

PHASE_BUCKETS_S = (
    0.0,
    5e-6,
    1e-5,
    2e-5,
    5e-5,
    1e-4,
    2e-4,
    5e-4,
    1e-3,
    2e-3,
    5e-3,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
)
"""Histogram buckets of a phase: microseconds to seconds, three a decade, and one of its
own for a phase that took no time (no log read, nothing appended), so that its median reads
0 rather than the middle of the first bucket."""


class Hop:
    """The nanoseconds one hop spent in each phase so far."""

    __slots__ = (
        "ack",
        "admit",
        "append",
        "decode",
        "encode",
        "fold",
        "handle",
        "queue",
        "read",
        "received_ns",
        "wait",
    )

    def __init__(self, wait_ns: int = 0, received_ns: int = 0) -> None:
        self.wait = wait_ns
        self.received_ns = received_ns
        """When the event was received (`time.perf_counter_ns`)."""
        self.decode = 0
        self.queue = 0
        self.admit = 0
        self.handle = 0
        """The handler's whole time: `decide` is what is left of it."""
        self.read = 0
        self.fold = 0
        self.encode = 0
        self.append = 0
        self.ack = 0

    def charge(self, shared: Hop, queued_until: int, acked_ns: int) -> None:
        """Take on the phases of a handling this hop's event shared with others (gathered),
        having waited until `queued_until` (`time.perf_counter_ns`) for it to begin."""
        self.queue = max(0, queued_until - self.received_ns - self.decode)
        self.admit = shared.admit
        self.handle = shared.handle
        self.read = shared.read
        self.fold = shared.fold
        self.encode = shared.encode
        self.append = shared.append
        self.ack = acked_ns

    def phases_ns(self) -> dict[str, int]:
        """Nanoseconds by phase."""
        decide = max(0, self.handle - self.read - self.fold - self.encode - self.append)
        return {
            "wait": self.wait,
            "queue": self.queue,
            "decode": self.decode,
            "admit": self.admit,
            "read": self.read,
            "fold": self.fold,
            "decide": decide,
            "encode": self.encode,
            "append": self.append,
            "ack": self.ack,
        }


_current: ContextVar[Hop | None] = ContextVar("helmline_hop", default=None)


def current_hop() -> Hop | None:
    """The hop whose handler is running in this task, if any."""
    return _current.get()


class handling:
    """While the handler runs: the hop the store and the session cache add to."""

    __slots__ = ("_hop", "_token")

    def __init__(self, hop: Hop) -> None:
        self._hop = hop

    def __enter__(self) -> Hop:
        self._token = _current.set(self._hop)
        return self._hop

    def __exit__(self, *_: object) -> None:
        _current.reset(self._token)


def waited_ns(stored_ns: int) -> int:
    """Nanoseconds since JetStream stored a message (never negative: the clocks may differ)."""
    return max(0, time.time_ns() - stored_ns)
