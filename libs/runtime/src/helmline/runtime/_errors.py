"""Errors of the runtime, and those that decide what happens to a message."""

from __future__ import annotations

from datetime import datetime


class HelmlineRuntimeError(Exception):
    """Root of every error raised by `helmline.runtime`."""


class ConcurrencyConflict(HelmlineRuntimeError):
    """Another writer appended to the session first (an event of `event_type`, when the
    append expected the last of that type); refold and decide again."""

    def __init__(
        self, tenant: str, session_id: str, expected_last_seq: int, event_type: str | None = None
    ) -> None:
        events = f"'s {event_type} events" if event_type is not None else ""
        super().__init__(
            f"session {tenant}/{session_id}{events} moved past sequence {expected_last_seq}"
        )
        self.tenant = tenant
        self.session_id = session_id
        self.expected_last_seq = expected_last_seq
        self.event_type = event_type


class RetryableError(HelmlineRuntimeError):
    """Handling failed for a passing reason; the message is delivered again after a delay."""


class PermanentError(HelmlineRuntimeError):
    """Handling can never succeed; the message is dead-lettered with this error as reason."""


class EventTooLarge(PermanentError):
    """An event larger than the log takes: appending it again can never succeed, so nothing
    is sent (a handler's message is dead-lettered at once, naming the event)."""

    def __init__(self, event_type: str, size: int, limit: int) -> None:
        super().__init__(
            f"a {event_type} event of {size:,} bytes is larger than the log takes ({limit:,} bytes)"
        )
        self.event_type = event_type
        self.size = size
        self.limit = limit


class Deferred(HelmlineRuntimeError):
    """Not a failure: the message cannot be acted on before `until`, so JetStream delivers it
    again then (durably, whatever happens to this process meanwhile). It spends one
    delivery: a handler defers a message on its first delivery only."""

    def __init__(self, until: datetime, reason: str) -> None:
        super().__init__(f"until {until.isoformat()}: {reason}")
        self.until = until


class RoutingError(HelmlineRuntimeError):
    """A service's handlers and the consumer that feeds them disagree on the event types
    handled: raised on import, or before the consumer takes its first message."""


class NotHandled(HelmlineRuntimeError):
    """The handler has no method for an event's type: the consumer acknowledges and skips
    the event (see `EventConsumer`)."""

    def __init__(self, event_type: str) -> None:
        super().__init__(f"no handler for {event_type} events")
        self.event_type = event_type
