"""Dead letters for operators: list them, read one, handle it again, or discard it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as RequestTimeout
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from helmline.contracts import DEAD_LETTER_STREAM, DeadLetter, dead_letter_subject, retry_subject
from helmline.runtime._errors import HelmlineRuntimeError


@dataclass(frozen=True, slots=True)
class ParkedLetter:
    """A dead letter and where it is parked."""

    seq: int
    """Its sequence in the dead-letter stream: how operators name it."""
    letter: DeadLetter
    """What was parked and why."""


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    """What handling a dead letter again did."""

    ok: bool
    """Handled this time; the letter was removed."""
    reason: str
    """Why not, when it failed again (the letter stays)."""


class DeadLetterBox:
    """The dead-letter stream, as operators work with it."""

    def __init__(self, nc: NATS, js: JetStreamContext) -> None:
        self._nc = nc
        self._js = js
        self._stream = DEAD_LETTER_STREAM.name

    async def letters(self, consumer: str | None = None) -> list[ParkedLetter]:
        """Every parked letter (of one consumer), oldest first."""
        subject = dead_letter_subject(consumer or "*")
        parked: list[ParkedLetter] = []
        seq = 1
        while True:
            try:
                message = await self._js.get_msg(self._stream, seq, subject=subject, next=True)
            except NotFoundError:
                return parked
            assert message.seq is not None
            parked.append(
                ParkedLetter(message.seq, DeadLetter.model_validate_json(message.data or b""))
            )
            seq = message.seq + 1

    async def letter(self, seq: int) -> ParkedLetter:
        """One parked letter."""
        try:
            message = await self._js.get_msg(self._stream, seq)
        except NotFoundError as error:
            raise HelmlineRuntimeError(f"no dead letter {seq}") from error
        return ParkedLetter(seq, DeadLetter.model_validate_json(message.data or b""))

    async def discard(self, seq: int) -> None:
        """Remove a letter for good (its event stays in the log)."""
        await self.letter(seq)
        await self._js.delete_msg(self._stream, seq)

    async def retry(self, seq: int, timeout_s: float = 30.0) -> RetryOutcome:
        """Ask the consumer that gave up to handle the message again; on success, discard it."""
        parked = await self.letter(seq)
        request = json.dumps(
            {"stream_seq": parked.letter.stream_seq, "deliveries": parked.letter.deliveries}
        ).encode()
        try:
            reply = await self._nc.request(
                retry_subject(parked.letter.consumer), request, timeout=timeout_s
            )
        except (NoRespondersError, RequestTimeout) as error:
            raise HelmlineRuntimeError(
                f"no replica of {parked.letter.consumer} answered: is the service running?"
            ) from error
        answer = json.loads(reply.data)
        outcome = RetryOutcome(ok=bool(answer["ok"]), reason=str(answer["reason"]))
        if outcome.ok:
            await self._js.delete_msg(self._stream, seq)
        return outcome
