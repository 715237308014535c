"""`helmline serve tool-gateway`: run the tool gateway until SIGTERM."""

from helmline.contracts import TOOL_GATEWAY_CONSUMER, TOOL_OUTPUTS_BUCKET, ConsumerSpec
from helmline.runtime import ServiceHost, Setup, run_service
from helmline.tool_gateway._config import ServersFile, load_servers
from helmline.tool_gateway._federation import Federation
from helmline.tool_gateway._handlers import GatewayHandler
from helmline.tool_gateway._ratelimit import RateLimiter
from helmline.tool_gateway._raw_outputs import sweep_raw_outputs
from helmline.tool_gateway._results import PureResults
from helmline.tool_gateway._settings import GatewaySettings
from helmline.yamlfile import YamlFileError


def setup_gateway(
    settings: GatewaySettings | None = None,
    servers: ServersFile | None = None,
    consumer: ConsumerSpec = TOOL_GATEWAY_CONSUMER,
) -> Setup:
    """Wire the gateway onto a started host (tests pass their own servers and consumer)."""
    settings = settings or GatewaySettings()

    async def setup(host: ServiceHost) -> None:
        federation = Federation(host.store, servers.servers if servers is not None else ())
        host.on_shutdown(federation.stop)
        await federation.start()
        raw_outputs = await host.js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
        handler = GatewayHandler(
            host.store,
            federation,
            limiter=await RateLimiter.open(host.js),
            results=await PureResults.open(host.js, host.store),
            raw_outputs=raw_outputs,
            max_output_bytes=settings.max_output_bytes,
            limits_by_risk=settings.rate_limits_by_risk,
        )
        await host.consume(consumer, handler)
        host.sweep_regularly("tool outputs", lambda: sweep_raw_outputs(host.js, host.store))

    return setup


def main() -> None:
    """Run the tool gateway (refusing to start with an invalid MCP servers file)."""
    settings = GatewaySettings()
    try:
        servers = load_servers(settings.mcp_servers) if settings.mcp_servers else None
    except YamlFileError as error:
        raise SystemExit(f"tool-gateway: {error}") from error
    run_service("tool-gateway", settings, setup_gateway(settings, servers))


if __name__ == "__main__":
    main()
