"""Retries, the circuit breaker, shared rate limits and unknown outcomes, against a real
MCP server that misbehaves on purpose (mcp_test_server.py) behind a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    ToolCallAttemptFailed,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolCircuitChanged,
    circuit_subject,
    decode_event,
    fold,
)
from helmline.runtime import EventStore, latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually
from helmline.tool_gateway._ratelimit import SLOTS

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    calls_received,
    federated,
    gateway_in_process,
    server_pid,
    start_replica,
    write_servers_file,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")


async def test_a_call_that_fails_twice_then_succeeds_completes_with_two_recorded_retries(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir, retries=3)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        call_id = await calls.authorise(f"{server_id}__flaky", key="k1")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallCompleted), outcome
        assert outcome.output == {"result": "done k1"}
        assert outcome.attempts == 3
        retries = [e for e in await calls.events(call_id) if isinstance(e, ToolCallAttemptFailed)]
        assert [r.attempt for r in retries] == [1, 2]
        assert all(r.error.retryable and r.error.kind == "unavailable" for r in retries)
        assert calls_received(state_dir, "flaky") == 3
        log = await calls.store.read_all(tenant, calls.session_id)
        assert fold(stored.event for stored in log).steps["s1"].retries == 2


async def test_a_server_that_always_times_out_opens_the_breaker_which_a_later_probe_closes(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    (state_dir / "hang").touch()
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        retries=0,
        timeout_s=0.3,
        circuit={"failures": 3, "reset_s": 2.0},
        # A timeout of a tool that may be sent again stays a timeout, and retryable.
        tools={"hang": {"idempotent": True}},
    )
    changes: list[ToolCircuitChanged] = []

    async def circuit(message: object) -> None:
        event = decode_event(message.data)  # type: ignore[attr-defined]
        assert isinstance(event.data, ToolCircuitChanged)
        changes.append(event.data)

    subscription = await js._nc.subscribe(circuit_subject(server_id), cb=circuit)
    try:
        async with gateway_in_process(nats_url, servers, tenant) as host:
            await federated(js, server_id)
            tool = f"{server_id}__hang"
            for _ in range(3):
                outcome = await calls.outcome(await calls.authorise(tool))
                assert isinstance(outcome, ToolCallFailed)
                assert outcome.error.kind == "timeout"
                assert outcome.error.retryable
            await eventually(lambda: [c.state for c in changes] == ["open"], what="breaker open")
            # Other processes read when a probe may pass as a time of day.
            reopens = changes[0].retry_at
            assert reopens is not None
            assert timedelta(0) < reopens - datetime.now(UTC) <= timedelta(seconds=2.0)
            reached = calls_received(state_dir, "hang")
            assert reached == 3
            # Open: later calls fail at once without reaching the server.
            fast = await calls.outcome(await calls.authorise(tool))
            assert isinstance(fast, ToolCallFailed)
            assert fast.error.kind == "unavailable"
            assert "circuit is open" in fast.error.message
            assert fast.error.suggestion
            assert fast.error.retryable
            assert calls_received(state_dir, "hang") == reached
            # After the reset window, one probe goes through; the server answers again.
            (state_dir / "hang").unlink()

            async def probe_answered() -> bool:
                outcome = await calls.outcome(await calls.authorise(tool))
                return isinstance(outcome, ToolCallCompleted)

            await eventually(probe_answered, timeout_s=30, what="a probe after the reset window")
            assert calls_received(state_dir, "hang") == reached + 1
            await eventually(
                lambda: [c.state for c in changes] == ["open", "half_open", "closed"],
                what="breaker closed",
            )

            async def closed_in_the_registry() -> bool:
                registry = await latest_tool_registry(js)
                assert registry is not None
                return any(
                    s.server == server_id and s.circuit == "closed" for s in registry.servers
                )

            await eventually(closed_in_the_registry, what="the registry showing it closed")
            # The service's metrics saw every change, though they skip the event store.
            sample = host.metrics.registry.get_sample_value
            opened = {"server": server_id, "state": "open"}
            assert sample("helmline_circuit_breaker_changes_total", opened) == 1
            assert sample("helmline_circuit_breaker_state", {"server": server_id}) == 0  # closed
    finally:
        await subscription.unsubscribe()


def breaking_at_first_failure(
    tmp_path: Path, server_id: str, state_dir: Path, http_server: str
) -> Path:
    """The test server over HTTP with two retries, whose breaker opens at the first failure
    counted against it: a retry after such a failure would fail fast, and the next call too."""
    servers: Path = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        http=http_server,
        retries=2,
        circuit={"failures": 1, "reset_s": 60},
    )
    return servers


async def test_health_follows_failing_calls_and_missed_heartbeats_and_a_stale_server_is_replaced(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        retries=0,
        heartbeat={"interval_s": 0.2, "timeout_s": 0.5, "misses": 2},
    )

    async def health_is(health: str, failures: int = 0) -> None:
        async def listed() -> bool:
            registry = await latest_tool_registry(js)
            return registry is not None and any(
                (s.server, s.health, s.failures) == (server_id, health, failures)
                for s in registry.servers
            )

        await eventually(listed, timeout_s=30, what=f"{server_id} {health}, {failures} failures")

    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        await health_is("healthy")
        # `flaky` fails the first two calls of a key as a server error, which counts.
        for failures in (1, 2):
            outcome = await calls.outcome(await calls.authorise(f"{server_id}__flaky", key="k"))
            assert isinstance(outcome, ToolCallFailed), outcome
            await health_is("degraded", failures)
        outcome = await calls.outcome(await calls.authorise(f"{server_id}__flaky", key="k"))
        assert isinstance(outcome, ToolCallCompleted), outcome
        await health_is("healthy")

        # A server process that stops answering: its heartbeats go unanswered, then the gateway
        # drops the stale connection and starts the server anew.
        stopped = server_pid(state_dir)
        os.kill(stopped, signal.SIGSTOP)
        try:
            await health_is("unresponsive", 1)
            await eventually(
                lambda: server_pid(state_dir) not in (0, stopped),
                timeout_s=30,
                what="a new server process",
            )
            await health_is("healthy")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        outcome = await calls.outcome(await calls.authorise(f"{server_id}__note", message="up"))
        assert isinstance(outcome, ToolCallCompleted), outcome


async def test_a_server_answering_429_is_tried_again_after_its_retry_after_not_counted_as_down(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    http_server: str,
) -> None:
    servers = breaking_at_first_failure(tmp_path, server_id, state_dir, http_server)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        (state_dir / "http-answer").write_text("429 1")
        call_id = await calls.authorise(f"{server_id}__note", message="soon")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallCompleted), outcome
        (refused,) = [
            e for e in await calls.events(call_id) if isinstance(e, ToolCallAttemptFailed)
        ]
        assert (refused.error.kind, refused.error.retryable) == ("rate_limited", True)
        assert refused.retry_in_s >= 1.0  # The server's Retry-After, not the backoff's 50 ms.
        assert (calls_received(state_dir, "refused"), calls_received(state_dir, "note")) == (1, 1)

        # A longer wait is not held in the gateway: the call fails, saying when to try again.
        (state_dir / "http-answer").write_text("429 30")
        call_id = await calls.authorise(f"{server_id}__note", message="later")
        asked = datetime.now(UTC)
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallFailed), outcome
        assert outcome.error.kind == "rate_limited"
        assert outcome.retry_at is not None
        assert asked + timedelta(seconds=25) < outcome.retry_at < asked + timedelta(seconds=35)
        assert calls_received(state_dir, "note") == 1


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_fail_the_call_at_once_without_counting_the_server_down(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    http_server: str,
    status: int,
) -> None:
    servers = breaking_at_first_failure(tmp_path, server_id, state_dir, http_server)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        (state_dir / "http-answer").write_text(str(status))
        call_id = await calls.authorise(f"{server_id}__note", message="denied")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallFailed), outcome
        assert (outcome.error.kind, outcome.error.retryable) == ("permission", False)
        assert f"answered {status}" in outcome.error.message
        assert "credentials" in (outcome.error.suggestion or "")
        assert outcome.retry_at is None
        assert (calls_received(state_dir, "refused"), calls_received(state_dir, "note")) == (1, 0)

        # Sent once, and the server's breaker is still closed: the next call runs.
        call_id = await calls.authorise(f"{server_id}__note", message="allowed")
        assert isinstance(await calls.outcome(call_id), ToolCallCompleted)


async def test_a_server_refusing_credentials_as_it_connects_fails_calls_as_refused_until_mended(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    http_server: str,
) -> None:
    refuse = state_dir / "http-refuse-all"
    refuse.write_text("401")
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir, http=http_server)
    async with gateway_in_process(nats_url, servers, tenant):
        call_id = await calls.authorise(f"{server_id}__note", message="refused")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallFailed), outcome
        assert (outcome.error.kind, outcome.error.retryable) == ("permission", False)
        assert "answered 401" in outcome.error.message
        assert "credentials" in (outcome.error.suggestion or "")

        async def listed_as_refusing() -> bool:
            registry = await latest_tool_registry(js)
            return registry is not None and any(
                s.server == server_id
                and not s.available
                and "refused the gateway's credentials" in (s.error or "")
                for s in registry.servers
            )

        await eventually(listed_as_refusing, what="the server listed as refusing credentials")

        # Credentials mended on the server's side: the gateway connects again by itself.
        refuse.unlink()
        await federated(js, server_id)
        call_id = await calls.authorise(f"{server_id}__note", message="allowed")
        assert isinstance(await calls.outcome(call_id), ToolCallCompleted)
        assert calls_received(state_dir, "note") == 1


async def test_a_503_is_tried_again_but_a_proxys_504_after_the_call_ran_is_not(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    http_server: str,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml", server_id, state_dir, http=http_server, retries=2
    )
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        # 503: the call was not handled, so even a tool not declared idempotent is sent
        # again, once the server's Retry-After has passed.
        (state_dir / "http-answer").write_text("503 1")
        call_id = await calls.authorise(f"{server_id}__note", message="again")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallCompleted), outcome
        (refused,) = [
            e for e in await calls.events(call_id) if isinstance(e, ToolCallAttemptFailed)
        ]
        assert (refused.error.kind, refused.retry_in_s >= 1.0) == ("unavailable", True)
        assert (calls_received(state_dir, "refused"), calls_received(state_dir, "note")) == (1, 1)

        # 504 from the proxy after the server ran the call: it may have taken effect, so it
        # is not sent again, and the failure tells the planner not to try it again either.
        (state_dir / "http-answer").write_text("504 after 7")
        call_id = await calls.authorise(f"{server_id}__note", message="once")
        outcome = await calls.outcome(call_id)
        assert isinstance(outcome, ToolCallFailed), outcome
        assert (outcome.error.kind, outcome.error.retryable) == ("unknown_outcome", False)
        assert "504" in outcome.error.message
        assert outcome.error.suggestion
        assert outcome.retry_at is None  # Not to be tried again, whatever the proxy asked.
        assert (calls_received(state_dir, "refused"), calls_received(state_dir, "note")) == (2, 2)


async def test_a_timeout_of_a_tool_not_declared_idempotent_ends_as_an_unknown_outcome(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    (state_dir / "hang").touch()
    servers = write_servers_file(
        tmp_path / "servers.yaml", server_id, state_dir, retries=2, timeout_s=0.3
    )
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        outcome = await calls.outcome(await calls.authorise(f"{server_id}__hang"))
        assert isinstance(outcome, ToolCallFailed), outcome
        assert (outcome.error.kind, outcome.error.retryable) == ("unknown_outcome", False)
        assert "did not answer within 0.3 s" in outcome.error.message
        assert (outcome.attempts, calls_received(state_dir, "hang")) == (1, 1)


async def test_two_gateway_replicas_share_one_rate_limit(
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    replicas: ServiceProcesses,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        rate_limit={"calls": 5, "per_s": 60},
    )
    # Each replica takes the calls of a session of its own, so both surely meet the limit:
    # replicas sharing one consumer may be handed every call by a single fetch.
    sessions = [Calls(store, tenant), Calls(store, tenant)]
    for name, session in zip(("gateway-a", "gateway-b"), sessions, strict=True):
        start_replica(replicas, name, servers, tenant, ack_wait_s=30, session_id=session.session_id)
    await federated(js, server_id)

    async def call(session: Calls, i: int) -> ToolCallCompleted | ToolCallFailed:
        call_id = await session.authorise(f"{server_id}__note", message=f"m{i}")
        outcome: ToolCallCompleted | ToolCallFailed = await session.outcome(call_id)
        return outcome

    outcomes = await asyncio.gather(*(call(session, i) for session in sessions for i in range(10)))
    through = [o for o in outcomes if isinstance(o, ToolCallCompleted)]
    limited = [o for o in outcomes if isinstance(o, ToolCallFailed)]
    assert len(through) == 5, [o.error for o in limited]
    assert len(limited) == 15, [o.error for o in limited]
    assert all(o.error.kind == "rate_limited" and o.error.retryable for o in limited)
    # Each refusal says when a place frees: a window (and at most one of its slots) after
    # the first call let in.
    now = datetime.now(UTC)
    latest = now + timedelta(seconds=60 + 60 / SLOTS)
    assert all(o.retry_at is not None and now < o.retry_at <= latest for o in limited)
    assert calls_received(state_dir, "note") == 5
    # Both replicas refused calls: the limit held across processes, not within one.
    for name in ("gateway-a", "gateway-b"):
        log = (replicas.data_dir / f"{name}.log").read_text()
        assert "rate limit: call" in log, (name, log[-3000:])


async def test_tools_without_a_configured_limit_are_limited_by_the_risk_of_each_call(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir)
    by_risk = {"high": {"calls": 2, "per_s": 60}, "low": {"calls": 3, "per_s": 60}}
    async with gateway_in_process(nats_url, servers, tenant, rate_limits_by_risk=by_risk):
        await federated(js, server_id)
        note = f"{server_id}__note"
        high = [await calls.authorise(note, risk="high", message=f"h{i}") for i in range(3)]
        outcomes = [await calls.outcome(call_id) for call_id in high]
        assert [type(o) for o in outcomes] == [ToolCallCompleted, ToolCallCompleted, ToolCallFailed]
        refused = outcomes[2]
        assert isinstance(refused, ToolCallFailed)
        assert (refused.error.kind, refused.error.retryable) == ("rate_limited", True)
        assert "limited to 2 calls per 60 s" in refused.error.message
        # A low-risk call is held to the low-risk limit (the count is the tool's, at any risk).
        low = await calls.outcome(await calls.authorise(note, risk="low", message="l"))
        assert isinstance(low, ToolCallCompleted), low
        assert calls_received(state_dir, "note") == 3


async def test_a_tenant_named_in_a_limit_is_held_to_its_own_rate(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    rate_limit = {"calls": 1, "per_s": 60, "tenants": {tenant: {"calls": 3, "per_s": 60}}}
    servers = write_servers_file(
        tmp_path / "servers.yaml", server_id, state_dir, rate_limit=rate_limit
    )
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        note = f"{server_id}__note"
        sent = [await calls.authorise(note, message=f"m{i}") for i in range(4)]
        outcomes = [await calls.outcome(call_id) for call_id in sent]
    assert [type(o) for o in outcomes] == [ToolCallCompleted] * 3 + [ToolCallFailed]
    refused = outcomes[3]
    assert isinstance(refused, ToolCallFailed)
    assert "limited to 3 calls per 60 s for this tenant" in refused.error.message
    assert calls_received(state_dir, "note") == 3


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_call_in_flight_when_the_gateway_is_killed_is_sent_again_only_if_idempotent(
    js: JetStreamContext,
    store: EventStore,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
    replicas: ServiceProcesses,
    idempotent: bool,
) -> None:
    servers = write_servers_file(
        tmp_path / "servers.yaml",
        server_id,
        state_dir,
        tools={"slow": {"idempotent": idempotent}},
    )
    start_replica(replicas, "gateway", servers, tenant, ack_wait_s=3)
    await federated(js, server_id)
    call_id = await calls.authorise(f"{server_id}__slow", seconds=6)

    async def in_flight() -> bool:
        sent = calls_received(state_dir, "slow") == 1
        return sent and any(isinstance(e, ToolCallStarted) for e in await calls.events(call_id))

    await eventually(in_flight, timeout_s=30, what="the slow call in flight")
    replicas.kill("gateway")
    await asyncio.to_thread(start_replica, replicas, "gateway", servers, tenant, 3)
    outcome = await calls.outcome(call_id, timeout_s=60)
    state = fold(stored.event for stored in await store.read_all(tenant, calls.session_id))
    step = state.steps[state.calls[call_id]]
    if idempotent:
        # Its outcome was unknown, and sending it again is harmless: it was sent again.
        assert isinstance(outcome, ToolCallCompleted), outcome
        assert calls_received(state_dir, "slow") == 2
        assert step.status == "succeeded"
        return
    assert isinstance(outcome, ToolCallFailed), outcome
    assert outcome.error.kind == "unknown_outcome"
    assert not outcome.error.retryable
    assert outcome.error.suggestion
    assert calls_received(state_dir, "slow") == 1
    assert step.status == "failed"
    assert step.error == outcome.error
