"""Dead letters: messages a consumer gave up on, parked with the reason."""

from __future__ import annotations

from pydantic import AwareDatetime

from helmline.contracts._values import Contract


class DeadLetter(Contract):
    """A message a consumer could not process, kept so that nobody loses it."""

    consumer: str
    """The durable consumer that gave up."""
    stream: str
    """The stream the message came from."""
    stream_seq: int
    """Its sequence in that stream."""
    subject: str
    """The subject it was published on."""
    reason: str
    """Why it was dead-lettered: undecodable, a permanent handler error, or too many deliveries."""
    deliveries: int
    """How many times it was delivered."""
    payload: str
    """The message body as text (undecodable bytes replaced)."""
    headers: dict[str, str]
    """The message headers."""
    at: AwareDatetime
    """When it was dead-lettered."""
