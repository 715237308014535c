"""Rate limits per tool and tenant whose counters live in JetStream key-value, so that every
gateway replica counts against the same budget."""

from __future__ import annotations

import json
import re
import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from helmline.contracts import RATE_LIMITS_BUCKET
from helmline.tool_gateway._config import RateLimit

_KEY_UNSAFE = re.compile(r"[^-A-Za-z0-9_=]")
_CONTENDED_TRIES = 100


class RateLimiter:
    """A sliding window per tenant and tool: the times of the calls let through in the last
    `per_s` seconds, kept in one key and changed by compare-and-set, so that replicas racing
    for the last slot cannot both take it, and no burst slips through at a window's edge."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> RateLimiter:
        """The limiter over the shared bucket (provisioned from the contracts)."""
        return cls(await js.key_value(RATE_LIMITS_BUCKET.bucket))

    async def admit(self, tenant: str, tool: str, limit: RateLimit) -> float | None:
        """Count one call; None if it is within the limit, else seconds until a slot frees
        (the call is not counted)."""
        key = f"{tenant}.{_KEY_UNSAFE.sub('_', tool)}"
        for _ in range(_CONTENDED_TRIES):
            now = time.time()
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                try:
                    await self._kv.create(key, json.dumps([now]).encode())
                    return None
                except KeyWrongLastSequenceError:
                    continue  # Another replica counted first: read its value.
            recent: list[float] = [
                t for t in json.loads(entry.value or b"[]") if t > now - limit.per_s
            ]
            if len(recent) >= limit.calls:
                return min(recent) + limit.per_s - now
            try:
                await self._kv.update(key, json.dumps([*recent, now]).encode(), last=entry.revision)
                return None
            except KeyWrongLastSequenceError:
                continue
        # Never reached in practice: a hundred lost races in a row. Refusing is the safe side.
        return limit.per_s
