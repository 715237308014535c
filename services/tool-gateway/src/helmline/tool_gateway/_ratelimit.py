"""Rate limits per tool and tenant whose counters live in JetStream key-value, so that every
gateway replica counts against the same budget."""

from __future__ import annotations

import json
import math
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
SLOTS = 100
"""Slots a window is counted in: a key holds at most this many counts, whatever the rate."""

Slots = dict[int, int]
"""Calls let through by slot (the slot's start time divided by its length)."""


class RateLimiter:
    """A sliding window per tenant and tool, counted in slots of a hundredth of the window
    and kept in one key changed by compare-and-set, so that replicas racing for the last
    place cannot both take it. A slot counts until its end is a window old: no window ever
    holds more than the limit's calls (no burst slips through at an edge), and a call frees
    its place at most a hundredth of the window late.

    Each key's value as this process last wrote or read it is kept, and the next count is
    written against that revision straight away: one round trip per call while no other
    replica counted meanwhile, and a read only when one did (the write then fails). A
    refusal may rest on the kept value: others only add calls to it, so it counts no more
    calls than the stored one."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._known: LRUCache[str, tuple[int, float, Slots]] = LRUCache(_KNOWN_KEYS)

    @classmethod
    async def open(cls, js: JetStreamContext) -> RateLimiter:
        """The limiter over the shared bucket (provisioned from the contracts)."""
        return cls(await js.key_value(RATE_LIMITS_BUCKET.bucket))

    async def admit(self, tenant: str, tool: str, limit: Rate) -> float | None:
        """Count one call; None if it is within the limit, else seconds until a place frees
        (the call is not counted)."""
        # Its own name: gateways of earlier versions kept a list of call times per key.
        key = f"{tenant}.{_KEY_UNSAFE.sub('_', tool)}.slots"
        slot_s = limit.per_s / SLOTS
        for _ in range(_CONTENDED_TRIES):
            revision, stored_slot_s, stored = self._known.get(key) or await self._read(key)
            now = time.time()
            recent = within_window(reslotted(stored, stored_slot_s, slot_s), slot_s, now)
            if sum(recent.values()) >= limit.calls:
                return (min(recent) + 1) * slot_s + limit.per_s - now
            slot = int(now // slot_s)
            counted = {**recent, slot: recent.get(slot, 0) + 1}
            value = json.dumps({"slot_s": slot_s, "counts": sorted(counted.items())}).encode()
            try:
                if revision == 0:
                    revision = await self._kv.create(key, value)
                else:
                    revision = await self._kv.update(key, value, last=revision)
            except KeyWrongLastSequenceError:
                self._known.pop(key, None)  # Another replica counted since: read its value.
                continue
            self._known[key] = (revision, slot_s, counted)
            return None
        # Never reached in practice: a hundred lost races in a row. Refusing is the safe side.
        return limit.per_s

    async def _read(self, key: str) -> tuple[int, float, Slots]:
        """The key's revision, slot length and counts as stored; revision 0 when there is
        none."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return 0, 1.0, {}
        stored = json.loads(entry.value or b"{}")
        counts = {int(slot): int(calls) for slot, calls in stored.get("counts", ())}
        return entry.revision or 0, float(stored.get("slot_s", 1.0)), counts


def within_window(counts: Slots, slot_s: float, now: float) -> Slots:
    """The slots that still count at `now`: those that end less than a window ago. Pure."""
    window_s = slot_s * SLOTS
    return {slot: calls for slot, calls in counts.items() if (slot + 1) * slot_s > now - window_s}


def reslotted(counts: Slots, from_s: float, to_s: float) -> Slots:
    """Counts kept in slots of `from_s` seconds, in slots of `to_s` (the limit's window
    changed): each slot's calls go to the slot its last instant falls in, so none is
    forgotten sooner than it would have been. Pure."""
    if from_s == to_s:
        return counts
    moved: Slots = {}
    for slot, calls in counts.items():
        into = math.ceil((slot + 1) * from_s / to_s) - 1
        moved[into] = moved.get(into, 0) + calls
    return moved
