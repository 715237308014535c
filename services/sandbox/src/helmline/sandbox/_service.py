"""Wiring: the sandbox consumer, and a fast path that kills commands on cancel."""

from __future__ import annotations

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from helmline.contracts import (
    SANDBOX_CONSUMER,
    ConsumerSpec,
    SessionCancelRequested,
    event_type_filter,
    parse_event_subject,
)
from helmline.runtime import ServiceHost, Setup
from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._settings import SandboxSettings


def sandbox_setup(settings: SandboxSettings, consumer: ConsumerSpec = SANDBOX_CONSUMER) -> Setup:
    """The setup of a sandbox service host, consuming `consumer`."""

    async def setup(host: ServiceHost) -> None:
        handler = SandboxHandler(host.store, settings.workspaces_dir.resolve())
        await watch_cancels(host, handler)
        await host.consume(consumer, handler)

    return setup


async def watch_cancels(host: ServiceHost, handler: SandboxHandler) -> None:
    """Kill running commands as soon as their session's cancel is stored.

    The consumer hands a session's events over in order, so its `session.cancel_requested`
    waits behind the very command it should kill. Every replica therefore also follows the
    stored cancels of all sessions on an ordered consumer of its own, from now on, and
    kills the commands it runs; the durable consumer's copy then finds nothing left to do.
    """

    async def cancel(message: Msg) -> None:
        subject = parse_event_subject(message.subject)
        handler.cancel_session(subject.tenant, subject.session_id)

    await host.js.subscribe(
        event_type_filter(SessionCancelRequested.TYPE),
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
        cb=cancel,
    )
