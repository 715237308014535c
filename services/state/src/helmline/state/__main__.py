"""`helmline serve state`: run the state service until SIGTERM."""

from helmline.contracts import READ_MODEL_CONSUMER, STATE_CONSUMER, ConsumerSpec
from helmline.runtime import (
    ServiceHost,
    SessionCache,
    Setup,
    ToolCatalogue,
    run_service,
)
from helmline.state._handlers import StateHandler
from helmline.state._projection import ProjectionHandler, ReadModel
from helmline.state._retention import RetentionWatch
from helmline.state._settings import StateSettings
from helmline.state._waiting import WaitingCount


def setup_state(
    settings: StateSettings,
    checkpoints: ConsumerSpec = STATE_CONSUMER,
    read_model: ConsumerSpec = READ_MODEL_CONSUMER,
) -> Setup:
    """Wire the state service onto a started host (tests pass their own consumers)."""

    async def setup(host: ServiceHost) -> None:
        # What each tool changes, as the tool gateway's newest registry describes it.
        tools = ToolCatalogue()
        await tools.follow(host.nc, host.js)
        host.on_shutdown(tools.close)
        states = host.states
        handler = StateHandler(host.store, tools, states, snapshots_kept=settings.snapshots_kept)
        await host.consume(checkpoints, handler)
        host.sweep_regularly("stored states", states.sweep)
        watch = RetentionWatch(
            host.js,
            host.store,
            host.metrics,
            warn_at=settings.retention_warn_at,
            interval_s=settings.retention_check_s,
        )
        host.run_in_background(watch.run())
        if settings.database_url:
            model = ReadModel(settings.database_url)
            host.on_shutdown(model.close)
            await host.consume(read_model, ProjectionHandler(SessionCache(states), model))
            count = WaitingCount(model, host.metrics, interval_s=settings.waiting_check_s)
            host.run_in_background(count.run())

    return setup


def main() -> None:
    """Run the state service."""
    settings = StateSettings()
    run_service("state", settings, setup_state(settings))


if __name__ == "__main__":
    main()
