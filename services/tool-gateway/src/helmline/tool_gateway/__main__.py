"""`helmline serve tool-gateway`: run the tool gateway until SIGTERM."""

import logging

from helmline.confinement import BubblewrapUnavailable, find_bubblewrap
from helmline.contracts import TOOL_GATEWAY_CONSUMER, ConsumerSpec
from helmline.runtime import (
    FoldedStates,
    InjectionClassifier,
    SealingError,
    SealingKey,
    ServiceHost,
    Setup,
    run_service,
    sealing_key,
)
from helmline.tool_gateway._config import ServersFile, load_servers
from helmline.tool_gateway._federation import SOURCE, Federation
from helmline.tool_gateway._handlers import GatewayHandler
from helmline.tool_gateway._instances import Instances
from helmline.tool_gateway._launcher import ServerLauncher
from helmline.tool_gateway._ratelimit import RateLimiter
from helmline.tool_gateway._raw_outputs import RawOutputs, sweep_raw_outputs
from helmline.tool_gateway._results import PureResults
from helmline.tool_gateway._settings import GatewaySettings
from helmline.yamlfile import YamlFileError

logger = logging.getLogger(__name__)


def setup_gateway(
    settings: GatewaySettings | None = None,
    servers: ServersFile | None = None,
    consumer: ConsumerSpec = TOOL_GATEWAY_CONSUMER,
) -> Setup:
    """Wire the gateway onto a started host (tests pass their own servers and consumer)."""
    settings = settings or GatewaySettings()

    async def setup(host: ServiceHost) -> None:
        configs = servers.servers if servers is not None else ()
        tenant = settings.mcp_secrets_tenant
        launcher = ServerLauncher(
            sandboxed=settings.mcp_sandbox == "bubblewrap",
            bwrap=settings.bwrap,
            secret_value=lambda name: host.secrets.value(tenant, name),
        )
        if not launcher.sandboxed and any(config.stdio for config in configs):
            logger.warning("HELMLINE_MCP_SANDBOX=none: stdio MCP servers run unconfined")
        federation = Federation(host.store, configs, about=host.about, launcher=launcher)
        host.on_shutdown(federation.stop)
        await federation.start()
        instances = Instances(
            host.store,
            federation.servers,
            source=SOURCE,
            gateway=federation.gateway,
            registry=host.metrics.registry,
            about=host.about,
            nc=host.nc,
        )
        host.on_shutdown(instances.stop)
        key = _sealing_key(settings)
        if key is None:
            logger.warning(
                "no HELMLINE_SEALING_KEY or HELMLINE_SEALING_KEY_FILE: outputs that output "
                "safety changed are not kept raw"
            )
        raw_outputs = await RawOutputs.open(host.js, key) if key is not None else None
        classifier = InjectionClassifier.from_settings(settings)
        if classifier is not None:
            host.on_shutdown(classifier.aclose)
            logger.info("injection classifier: %s", classifier.endpoint)
        handler = GatewayHandler(
            host.store,
            federation,
            limiter=await RateLimiter.open(host.js),
            results=await PureResults.open(host.js, host.store),
            raw_outputs=raw_outputs,
            max_output_bytes=settings.max_output_bytes,
            limits_by_risk=settings.rate_limits_by_risk,
            secrets=host.secrets,
            classifier=classifier,
            states=FoldedStates(host.js, host.store),
            instances=instances,
        )
        await host.consume(consumer, handler)
        host.sweep_regularly("tool outputs", lambda: sweep_raw_outputs(host.js, host.store))

    return setup


def _sealing_key(settings: GatewaySettings) -> SealingKey | None:
    secret = settings.sealing_key.get_secret_value() if settings.sealing_key else None
    return sealing_key(secret, settings.sealing_key_file)


def main() -> None:
    """Run the tool gateway (refusing to start with an invalid MCP servers file, or a
    sealing key it cannot use)."""
    settings = GatewaySettings()
    try:
        servers = load_servers(settings.mcp_servers) if settings.mcp_servers else None
        _sealing_key(settings)
        stdio = servers is not None and any(config.stdio for config in servers.servers)
        if stdio and settings.mcp_sandbox == "bubblewrap":
            settings.bwrap = find_bubblewrap(settings.bwrap).path
    except (YamlFileError, SealingError, BubblewrapUnavailable) as error:
        raise SystemExit(f"tool-gateway: {error}") from error
    run_service("tool-gateway", settings, setup_gateway(settings, servers))


if __name__ == "__main__":
    main()
