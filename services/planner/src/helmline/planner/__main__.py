"""`helmline serve planner`: run the planner service until SIGTERM."""

from collections.abc import Callable, Sequence

from helmline.contracts import BUILTIN_TOOLS, PLANNER_CONSUMER, ConsumerSpec, ToolSpec
from helmline.planner._engine import GoalEngine
from helmline.planner._handlers import PlannerHandler
from helmline.planner._providers import model_client
from helmline.planner._settings import PlannerSettings
from helmline.runtime import ServiceHost, Setup, run_service


def setup_planner(
    consumer: ConsumerSpec = PLANNER_CONSUMER,
    settings: PlannerSettings | None = None,
    registry: Callable[[], Sequence[ToolSpec]] = lambda: BUILTIN_TOOLS,
) -> Setup:
    """Wire the planner onto a started host (tests pass their own consumer, settings and
    tool registry)."""
    settings = settings or PlannerSettings()

    async def setup(host: ServiceHost) -> None:
        model = model_client(settings)
        host.on_shutdown(model.aclose)
        goals = GoalEngine(settings, model, registry)
        await host.consume(consumer, PlannerHandler(host.store, goals))

    return setup


def main() -> None:
    """Run the planner service."""
    settings = PlannerSettings()
    run_service("planner", settings, setup_planner(settings=settings))


if __name__ == "__main__":
    main()
