"""The tool gateway's own overhead per MCP call: an `echo` of server-everything over stdio
(unconfined, and in its bubblewrap sandbox) and over Streamable HTTP, called directly with
the MCP client and through the gateway's handler (validation, rate limit, breaker, the
started and completed events appended to JetStream, output safety). The overhead is each
call's time in the handler less the time of its MCP call inside it. Calls are held to a
rate limit by their risk, as by default, but over a window of 50 ms rather than a minute, so
that the bench's calls stay within it while its key holds as many call times as a busy
default window does.

Direct and gateway calls take turns in blocks rather than one by one: the MCP SDK finishes
a Streamable HTTP call after `call_tool` has returned (it closes the response, its TCP
connection and its async generators in the event loop), and a direct call's leftovers would
run inside the next gateway call and be counted as the gateway's overhead (so each block of
gateway calls begins with one that is not counted). A gateway call's own leftovers still
count: they delay its `tool.call.completed`."""

from __future__ import annotations

import base64
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from helmline.contracts import TOOL_OUTPUTS_BUCKET, ToolCallAuthorized, new_event
from helmline.runtime import (
    Delivery,
    EventStore,
    InjectionClassifier,
    RegisteredSecrets,
    classified,
    ensure_topology,
    make_safe,
    register_secrets,
)
from helmline.runtime.testing import NatsServer, ScriptedClassifier
from helmline.tool_gateway._config import RateLimit, ServerConfig
from helmline.tool_gateway._federation import Federation
from helmline.tool_gateway._handlers import GatewayHandler
from helmline.tool_gateway._launcher import ServerLauncher
from helmline.tool_gateway._mcp import McpServer
from helmline.tool_gateway._ratelimit import RateLimiter
from helmline.tool_gateway.testing import EVERYTHING_SCRIPT, NODE, server_everything

CALLS = 300
STARTS = 5
WARM_UP = 20
BLOCK = 20
ROOT = Path(__file__).resolve().parents[1]


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _figure(name: str, samples: list[float], target: str, **extra: Any) -> dict[str, Any]:
    return {
        "figure": name,
        "calls": len(samples),
        "value": round(statistics.median(samples), 3),
        "p99": round(_percentile(samples, 0.99), 3),
        "target": target,
        **extra,
    }


class _TimedServer:
    """Measures the MCP call inside the gateway's handling of each call."""

    def __init__(self, server: McpServer) -> None:
        self.last_ms = 0.0
        call = server.call

        async def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                self.last_ms = (time.perf_counter() - began) * 1000

        server.call = timed  # type: ignore[method-assign]


@dataclass
class _Samples:
    """Per call: wall times direct and through the gateway, the gateway's overhead, and the
    CPU time of this process (all in ms)."""

    direct: list[float] = field(default_factory=list[float])
    through: list[float] = field(default_factory=list[float])
    overhead: list[float] = field(default_factory=list[float])
    direct_cpu: list[float] = field(default_factory=list[float])
    through_cpu: list[float] = field(default_factory=list[float])


async def _measure(federation: Federation, handler: GatewayHandler, server_id: str) -> _Samples:
    server = federation.servers[server_id]
    assert await server.wait_connected(30), server.view.error
    timed = _TimedServer(server)
    client = server._client  # the gateway's own connection, for the direct figure
    assert client is not None
    samples = _Samples()
    session = uuid.uuid4().hex
    for block in range(0, CALLS + WARM_UP, BLOCK):
        for i in range(block, block + BLOCK):
            began, began_cpu = time.perf_counter(), time.thread_time()
            await client.call_tool("echo", {"message": f"m{i}"})
            if i >= WARM_UP:
                samples.direct.append((time.perf_counter() - began) * 1000)
                samples.direct_cpu.append((time.thread_time() - began_cpu) * 1000)
        # The block's first gateway call runs the last direct call's leftovers: not counted.
        for i in [-block - 1, *range(block, block + BLOCK)]:
            event = new_event(
                ToolCallAuthorized(
                    call_id=f"c{i}",
                    step_id="s",
                    tool=f"{server_id}__echo",
                    arguments={"message": f"m{i}"},
                    risk="low",
                ),
                tenant="bench",
                session_id=session,
                source="bench",
            )
            began, began_cpu = time.perf_counter(), time.thread_time()
            await handler(Delivery(event, 0, 1))
            total = (time.perf_counter() - began) * 1000
            if i >= WARM_UP:
                samples.through.append(total)
                samples.overhead.append(total - timed.last_ms)
                samples.through_cpu.append((time.thread_time() - began_cpu) * 1000)
    return samples


def output_safety_us_per_kib(rounds: int = 50, secrets: int = 0) -> dict[str, Any]:
    """The shared output safety on 64 KiB of command output, a key id and a password line in
    it: what every tool result, model text and error message pays on its way to the log.
    With `secrets` registered (one of them printed plain and in base64 in the output), what
    a stack whose tenants set that many pays."""
    rng = random.Random(1)
    words = [
        *("the", "build", "finished", "in", "12.3", "s", "with", "4", "warnings;", "see"),
        *("logs/app.log", "line", "88", "for", "details;", "user", "alice", "requested"),
        *("rollback", "of", "step", "3"),
    ]
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < 64 * 1024:
        lines.append(" ".join(rng.choice(words) for _ in range(12)))
    lines[10] = "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE"
    lines[200] = "password=hunter2hunter2"
    values = [(f"SECRET_{n}", rng.randbytes(24).hex()) for n in range(secrets)]
    if values:
        lines[300] = f"deploying with {values[0][1]}"
        lines[400] = base64.b64encode(values[0][1].encode()).decode()
    text = "\n".join(lines)
    kib = len(text.encode()) / 1024
    samples = []
    register_secrets(RegisteredSecrets(values))
    try:
        for _ in range(rounds):
            began = time.perf_counter()
            safe = make_safe(text, max_bytes=1 << 20)
            samples.append((time.perf_counter() - began) * 1e6 / kib)
    finally:
        register_secrets(RegisteredSecrets(()))
    if values:
        assert safe.redacted_by.get("secret:SECRET_0") == 2, safe.redacted_by
    name = f"output_safety_{secrets}_secrets_us_per_kib" if secrets else "output_safety_us_per_kib"
    return {
        "figure": name,
        "calls": rounds,
        "value": round(statistics.median(samples), 1),
        "p99": round(_percentile(samples, 0.99), 1),
        "target": "p50 <= 50 us per KiB",
    }


async def classifier_round_trip_ms(calls: int = 200) -> dict[str, Any]:
    """What the optional injection classifier adds to a result: output safety's text sent
    to a local scripted classifier (the `generic` protocol, over loopback HTTP) and its
    verdict read, for a 4 KiB result. The floor a classifier service sets under it (its
    own inference) is the service's to measure; this is Helmline's part of it."""
    text = "the build finished in 12.3 s with 4 warnings; see logs/app.log line 88\n" * 57
    safe = make_safe(text, max_bytes=1 << 20)
    samples: list[float] = []
    with ScriptedClassifier() as server:
        async with InjectionClassifier(server.url(), timeout_s=5) as classifier:
            for i in range(WARM_UP + calls):
                began = time.perf_counter()
                judged = await classified(safe, classifier)
                if i >= WARM_UP:
                    samples.append((time.perf_counter() - began) * 1000)
                assert judged.classifier is not None, "no verdict"
                assert judged.classifier.verdict == "clean", judged.classifier
    return _figure(
        "classifier_round_trip_ms",
        samples,
        "for comparison",
        includes="a 4 KiB text to a local scripted classifier and its verdict back",
    )


async def stdio_start_ms(
    config: ServerConfig, launcher: ServerLauncher, name: str
) -> dict[str, Any]:
    """From starting a stdio server to its tools listed (spawn, handshake, `tools/list`)."""
    samples: list[float] = []
    for _ in range(STARTS):
        server = McpServer(config, lambda: None, launcher)
        began = time.perf_counter()
        server.start()
        try:
            assert await server.wait_connected(30), server.view.error
            samples.append((time.perf_counter() - began) * 1000)
        finally:
            await server.stop()
    return _figure(name, samples, "for comparison")


async def run() -> list[dict[str, Any]]:
    script = ROOT / EVERYTHING_SCRIPT
    figures = [output_safety_us_per_kib(), output_safety_us_per_kib(secrets=50)]
    figures.append(await classifier_round_trip_ms())
    with (
        tempfile.TemporaryDirectory() as folder,
        NatsServer(Path(folder)) as nats_server,
        server_everything(script, Path(folder)) as url,
    ):
        connection = await nats.connect(nats_server.url)
        js = connection.jetstream()
        await ensure_topology(js)
        node_modules = str(ROOT / "tests/mcp-servers")
        stdio = {"command": NODE, "args": [str(script), "stdio"]}
        unconfined = [
            ServerConfig.model_validate({"id": "stdio", "stdio": stdio}),
            ServerConfig.model_validate({"id": "http", "http": {"url": url}}),
        ]
        # The same server in its sandbox (bubblewrap, no network), in a federation of its own:
        # a gateway sandboxes all of its stdio servers or none.
        sandboxed = [
            ServerConfig.model_validate(
                {"id": "stdio-sandboxed", "stdio": stdio, "sandbox": {"read": [node_modules]}}
            )
        ]
        figures += [
            await stdio_start_ms(
                unconfined[0], ServerLauncher(sandboxed=False), "mcp_stdio_start_ms"
            ),
            await stdio_start_ms(sandboxed[0], ServerLauncher(), "mcp_stdio-sandboxed_start_ms"),
        ]
        gateways = []
        for configs, launcher in (
            (unconfined, ServerLauncher(sandboxed=False)),
            (sandboxed, ServerLauncher()),
        ):
            federation = Federation(EventStore(js), configs, launcher=launcher)
            await federation.start()
            handler = GatewayHandler(
                EventStore(js),
                federation,
                limiter=await RateLimiter.open(js),
                raw_outputs=await js.object_store(TOOL_OUTPUTS_BUCKET.bucket),
                limits_by_risk={"low": RateLimit(calls=100, per_s=0.05)},
            )
            gateways += [(config.id, federation, handler) for config in configs]
        try:
            # The two stdio servers one after the other: what else loads the machine then
            # weighs on both alike.
            order = ("stdio", "stdio-sandboxed", "http")
            for transport, federation, handler in sorted(gateways, key=lambda g: order.index(g[0])):
                samples = await _measure(federation, handler, transport)
                figures += [
                    _figure(f"mcp_echo_{transport}_direct_ms", samples.direct, "for comparison"),
                    _figure(
                        f"mcp_echo_{transport}_through_gateway_ms",
                        samples.through,
                        "for comparison",
                    ),
                    _figure(
                        f"gateway_overhead_{transport}_ms",
                        samples.overhead,
                        "p50 <= 1 ms",
                        includes="validation, rate limit, breaker, two JetStream appends, "
                        "output safety",
                    ),
                    {
                        "figure": f"gateway_cpu_{transport}_ms",
                        "calls": len(samples.through_cpu),
                        "value": round(
                            statistics.mean(samples.through_cpu)
                            - statistics.mean(samples.direct_cpu),
                            3,
                        ),
                        "target": "for comparison",
                        "means": "CPU time of the gateway's process per call through it, less "
                        "per direct call (the MCP client's work, wherever it runs, cancels out)",
                    },
                ]
        finally:
            for federation in {id(f): f for _, f, _ in gateways}.values():
                await federation.stop()
            await connection.close()
    return figures
