"""`helmline serve tool-gateway`: run the tool gateway until SIGTERM."""

from helmline.contracts import TOOL_GATEWAY_CONSUMER, ConsumerSpec
from helmline.runtime import RuntimeSettings, ServiceHost, Setup, run_service
from helmline.tool_gateway._handlers import GatewayHandler


def setup_gateway(consumer: ConsumerSpec = TOOL_GATEWAY_CONSUMER) -> Setup:
    """Wire the gateway onto a started host (tests pass their own consumer)."""

    async def setup(host: ServiceHost) -> None:
        await host.consume(consumer, GatewayHandler(host.store))

    return setup


def main() -> None:
    """Run the tool gateway."""
    run_service("tool-gateway", RuntimeSettings(), setup_gateway())


if __name__ == "__main__":
    main()
