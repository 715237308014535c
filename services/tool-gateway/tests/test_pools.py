"""A shared server's pool: the calls in flight on its one instance, its queue and the wait in
it (no call is sent here: the pool only hands out places)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from helmline.runtime.testing import eventually
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._forwarding import PoolFull
from helmline.tool_gateway._instances import PoolMetrics, ServerPool
from helmline.tool_gateway._mcp import McpServer


def shared_pool(registry: CollectorRegistry, **pool: Any) -> ServerPool:
    config = ServerConfig.model_validate(
        {"id": "notes", "stdio": {"command": "true"}, "pool": pool}
    )

    async def nowhere(*_: Any) -> None:
        return None

    return ServerPool(
        McpServer(config, lambda: None), nowhere, PoolMetrics(registry), "here", nowhere, {}, None
    )


async def test_a_call_beyond_a_full_queue_is_refused_at_once() -> None:
    registry = CollectorRegistry()
    pool = shared_pool(registry, calls_per_instance=1, max_calls=1, queue=0)
    async with pool.lease("acme", "s1"):
        began = time.monotonic()
        with pytest.raises(PoolFull) as refused:
            async with pool.lease("acme", "s2"):
                pass
        assert time.monotonic() - began < 1.0
    assert refused.value.error.kind == "rate_limited"
    assert "its queue is full" in refused.value.error.message
    assert "1 of 1 calls in flight" in refused.value.error.message
    labels = {"server": "notes", "why": "queue_full"}
    assert registry.get_sample_value("helmline_mcp_calls_refused_total", labels) == 1
    # The place is free again.
    async with pool.lease("acme", "s2"):
        pass


async def test_a_queued_call_takes_the_place_freed_within_its_wait_else_is_refused() -> None:
    registry = CollectorRegistry()
    pool = shared_pool(registry, calls_per_instance=1, max_calls=1, queue_timeout_s=5)
    held = pool.lease("acme", "s1")
    await held.__aenter__()
    waiting = asyncio.create_task(_leased(pool))
    queued = {"server": "notes"}
    await eventually(
        lambda: registry.get_sample_value("helmline_mcp_calls_queued", queued) == 1,
        timeout_s=5,
        what="the second call queued",
    )
    await held.__aexit__(None, None, None)
    assert await asyncio.wait_for(waiting, 5) == "leased"

    pool = shared_pool(CollectorRegistry(), calls_per_instance=1, max_calls=1, queue_timeout_s=0.2)
    async with pool.lease("acme", "s1"):
        with pytest.raises(PoolFull) as refused:
            await _leased(pool)
    assert f"no place freed within {0.2:g} s" in refused.value.error.message
    assert refused.value.retry_in_s == pytest.approx(0.2)


async def _leased(pool: ServerPool) -> str:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(pool.lease("acme", "s2"))
    return "leased"
