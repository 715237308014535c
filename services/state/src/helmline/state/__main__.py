"""`helmline serve state`: run the state service until SIGTERM."""

from helmline.contracts import STATE_CONSUMER, ConsumerSpec
from helmline.runtime import RuntimeSettings, ServiceHost, Setup, run_service
from helmline.state._handlers import CheckpointHandler


def setup_state(consumer: ConsumerSpec = STATE_CONSUMER) -> Setup:
    """Wire the state service onto a started host (tests pass their own consumer)."""

    async def setup(host: ServiceHost) -> None:
        await host.consume(consumer, CheckpointHandler(host.store))

    return setup


def main() -> None:
    """Run the state service."""
    run_service("state", RuntimeSettings(), setup_state())


if __name__ == "__main__":
    main()
