"""`helmline serve approval`: run the approval service until SIGTERM."""

import asyncio
import contextlib

from nats.aio.msg import Msg

from helmline.approval._handlers import ApprovalHandler
from helmline.approval._policy_file import PolicyFileError
from helmline.approval._policy_source import PolicySource
from helmline.approval._settings import ApprovalSettings
from helmline.approval._webhooks import WebhookNotifier
from helmline.contracts import (
    APPROVAL_CONSUMER,
    ApprovalRequested,
    ConsumerSpec,
    PermissionRequested,
    UndecodableEvent,
    decode_event,
    event_type_filter,
)
from helmline.runtime import ServiceHost, Setup, ToolCatalogue, run_service


def setup_approval(
    policies: PolicySource,
    settings: ApprovalSettings,
    consumer: ConsumerSpec = APPROVAL_CONSUMER,
) -> Setup:
    """Wire the approval service onto a started host (tests pass their own consumer)."""

    async def setup(host: ServiceHost) -> None:
        if isinstance(policies.tools, ToolCatalogue):
            await policies.tools.follow(host.nc, host.js)
            host.on_shutdown(policies.tools.close)
        policies.log_in_force()
        handler = ApprovalHandler(
            host.store, host.states, policies, WebhookNotifier(settings.webhook_secrets)
        )
        watcher = asyncio.create_task(policies.watch())

        async def stop_watching() -> None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

        host.on_shutdown(stop_watching)
        host.on_shutdown(handler.close)
        await handler.recover(settings.expiry_lookback)
        await host.consume(consumer, handler)

        async def asked(message: Msg) -> None:
            # The consumer hands a request to one replica; every replica arms its timers.
            with contextlib.suppress(UndecodableEvent):
                handler.arm_timers(decode_event(message.data))

        for kind in (ApprovalRequested, PermissionRequested):
            await host.nc.subscribe(event_type_filter(kind.TYPE), cb=asked)

    return setup


def main() -> None:
    """Run the approval service (refusing to start with an invalid policy file)."""
    settings = ApprovalSettings()
    try:
        # MCP tools are known once a gateway publishes them: the policy follows the registry.
        policies = PolicySource(
            settings.policy, poll_s=settings.policy_poll_s, tools=ToolCatalogue()
        )
    except PolicyFileError as error:
        raise SystemExit(f"approval: {error}") from error
    run_service("approval", settings, setup_approval(policies, settings))


if __name__ == "__main__":
    main()
