"""`helmline serve approval`: run the approval service until SIGTERM."""

from helmline.approval._handlers import ApprovalHandler
from helmline.contracts import APPROVAL_CONSUMER, ConsumerSpec
from helmline.runtime import RuntimeSettings, ServiceHost, Setup, run_service


def setup_approval(consumer: ConsumerSpec = APPROVAL_CONSUMER) -> Setup:
    """Wire the approval service onto a started host (tests pass their own consumer)."""

    async def setup(host: ServiceHost) -> None:
        handler = ApprovalHandler(host.store)
        host.on_shutdown(handler.close)
        await handler.recover()
        await host.consume(consumer, handler)

    return setup


def main() -> None:
    """Run the approval service."""
    run_service("approval", RuntimeSettings(), setup_approval())


if __name__ == "__main__":
    main()
