"""`helmline serve planner`: run the planner service until SIGTERM."""

from helmline.contracts import PLANNER_CONSUMER, ConsumerSpec
from helmline.planner._handlers import PlannerHandler
from helmline.runtime import RuntimeSettings, ServiceHost, Setup, run_service


def setup_planner(consumer: ConsumerSpec = PLANNER_CONSUMER) -> Setup:
    """Wire the planner onto a started host (tests pass their own consumer)."""

    async def setup(host: ServiceHost) -> None:
        await host.consume(consumer, PlannerHandler(host.store))

    return setup


def main() -> None:
    """Run the planner service."""
    run_service("planner", RuntimeSettings(), setup_planner())


if __name__ == "__main__":
    main()
