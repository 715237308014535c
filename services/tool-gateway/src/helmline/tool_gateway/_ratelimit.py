"""Rate limits per tool and tenant whose counters live in JetStream key-value, so that every
gateway replica counts against the same budget."""

from __future__ import annotations

import json
import re
import time

from cachetools import LRUCache
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from helmline.contracts import RATE_LIMITS_BUCKET
from helmline.tool_gateway._config import Rate

_KEY_UNSAFE = re.compile(r"[^-A-Za-z0-9_=]")
_CONTENDED_TRIES = 100
_KNOWN_KEYS = 10_000


class RateLimiter:
    """A sliding window per tenant and tool: the times of the calls let through in the last
    `per_s` seconds, kept in one key and changed by compare-and-set, so that replicas racing
    for the last slot cannot both take it, and no burst slips through at a window's edge.

    Each key's value as this process last wrote or read it is kept, and the next count is
    written against that revision straight away: one round trip per call while no other
    replica counted meanwhile, and a read only when one did (the write then fails). A
    refusal may rest on the kept value: others only add calls to it, so it counts no more
    calls than the stored one."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._known: LRUCache[str, tuple[int, list[float]]] = LRUCache(_KNOWN_KEYS)

    @classmethod
    async def open(cls, js: JetStreamContext) -> RateLimiter:
        """The limiter over the shared bucket (provisioned from the contracts)."""
        return cls(await js.key_value(RATE_LIMITS_BUCKET.bucket))

    async def admit(self, tenant: str, tool: str, limit: Rate) -> float | None:
        """Count one call; None if it is within the limit, else seconds until a slot frees
        (the call is not counted)."""
        key = f"{tenant}.{_KEY_UNSAFE.sub('_', tool)}"
        for _ in range(_CONTENDED_TRIES):
            revision, times = self._known.get(key) or await self._read(key)
            now = time.time()
            recent = [t for t in times if t > now - limit.per_s]
            if len(recent) >= limit.calls:
                return min(recent) + limit.per_s - now
            counted = [*recent, now]
            value = json.dumps(counted).encode()
            try:
                if revision == 0:
                    revision = await self._kv.create(key, value)
                else:
                    revision = await self._kv.update(key, value, last=revision)
            except KeyWrongLastSequenceError:
                self._known.pop(key, None)  # Another replica counted since: read its value.
                continue
            self._known[key] = (revision, counted)
            return None
        # Never reached in practice: a hundred lost races in a row. Refusing is the safe side.
        return limit.per_s

    async def _read(self, key: str) -> tuple[int, list[float]]:
        """The key's revision and times as stored; revision 0 when there is none."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return 0, []
        return entry.revision or 0, json.loads(entry.value or b"[]")
