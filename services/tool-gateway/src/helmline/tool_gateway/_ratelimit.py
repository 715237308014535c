"""Rate limits per tool and tenant whose counters live in JetStream key-value, so that every
gateway replica counts against the same budget."""

from __future__ import annotations

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
    """Fixed windows: a counter per tenant, tool and window, raised by compare-and-set."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> RateLimiter:
        """The limiter over the shared bucket (provisioned from the contracts)."""
        return cls(await js.key_value(RATE_LIMITS_BUCKET.bucket))

    async def admit(self, tenant: str, tool: str, limit: RateLimit) -> float | None:
        """Count one call; None if it is within the limit, else seconds until the window ends
        (the call is not counted)."""
        now = time.time()
        window = int(now // limit.per_s)
        key = f"{tenant}.{_KEY_UNSAFE.sub('_', tool)}.{int(limit.per_s)}.{window}"
        for _ in range(_CONTENDED_TRIES):
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                try:
                    await self._kv.create(key, b"1")
                    return None
                except KeyWrongLastSequenceError:
                    continue  # Another replica counted first: read its value.
            count = int(entry.value or b"0")
            if count >= limit.calls:
                return (window + 1) * limit.per_s - now
            try:
                await self._kv.update(key, str(count + 1).encode(), last=entry.revision)
                return None
            except KeyWrongLastSequenceError:
                continue
        # Never reached in practice: a hundred lost races in a row. Refusing is the safe side.
        return limit.per_s
