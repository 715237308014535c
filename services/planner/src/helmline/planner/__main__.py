"""`helmline serve planner`: run the planner service until SIGTERM."""

import logging
from collections.abc import Callable, Sequence

from helmline.contracts import PLANNER_CONSUMER, ConsumerSpec, ToolSpec
from helmline.planner._circuits import CircuitWatch
from helmline.planner._engine import GoalEngine
from helmline.planner._handlers import PlannerHandler
from helmline.planner._providers import model_client
from helmline.planner._settings import PlannerSettings
from helmline.runtime import ServiceHost, Setup, ToolCatalogue, run_service


def setup_planner(
    consumer: ConsumerSpec = PLANNER_CONSUMER,
    settings: PlannerSettings | None = None,
    registry: Callable[[], Sequence[ToolSpec]] | None = None,
) -> Setup:
    """Wire the planner onto a started host (tests pass their own consumer and settings).

    Goal sessions are offered the tools of the newest registry the tool gateway published
    (built-in and federated), unless `registry` says otherwise.
    """
    settings = settings or PlannerSettings()

    async def setup(host: ServiceHost) -> None:
        missing = settings.missing_credentials()
        if missing is not None:
            logging.getLogger(__name__).warning("goal sessions will fail: %s", missing)
        model = model_client(settings)
        host.on_shutdown(model.aclose)
        catalogue = ToolCatalogue()
        if registry is None:
            await catalogue.follow(host.nc, host.js)
            host.on_shutdown(catalogue.close)

        def newest_registry() -> Sequence[ToolSpec]:
            return tuple(catalogue.values())

        goals = GoalEngine(settings, model, registry or newest_registry)
        # A step whose server's circuit is open is retried when a probe may pass.
        circuits = CircuitWatch()
        await circuits.follow(host.js)
        host.on_shutdown(circuits.close)
        handler = PlannerHandler(host.store, host.states, goals, catalogue, circuits)
        await host.consume(consumer, handler)

    return setup


def main() -> None:
    """Run the planner service."""
    settings = PlannerSettings()
    run_service("planner", settings, setup_planner(settings=settings))


if __name__ == "__main__":
    main()
