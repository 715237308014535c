"""The shared rate limiter: slots that count until their end is a window old, kept small
whatever the rate, against a real JetStream key-value bucket."""

from __future__ import annotations

import json
import time

from nats.js import JetStreamContext

from helmline.contracts import RATE_LIMITS_BUCKET
from helmline.tool_gateway._config import Rate
from helmline.tool_gateway._ratelimit import SLOTS, RateLimiter, reslotted, within_window


def test_a_slot_counts_until_its_end_is_a_window_old() -> None:
    slot_s = 0.6  # A minute's window.
    counts = {100: 2, 150: 1, 199: 4}
    # At 120.0 s the window reaches back to 60.0 s: slot 100 ends at 60.6 s, still inside.
    assert within_window(counts, slot_s, 120.0) == counts
    # At 120.6 s slot 100 ends exactly a window ago: it no longer counts.
    assert within_window(counts, slot_s, 120.6 + 1e-9) == {150: 1, 199: 4}


def test_counts_move_to_the_slot_their_last_instant_falls_in() -> None:
    assert reslotted({10: 3}, 0.6, 0.6) == {10: 3}
    # Slot 10 of 0.5 s (5.0-5.5 s) ends in slot 5 of 1 s; slot 12 (6.0-6.5 s) in slot 6.
    assert reslotted({10: 3, 11: 1, 12: 1}, 0.5, 1.0) == {5: 4, 6: 1}
    # Slot 5 of 1 s (5-6 s) goes to its last half-second: never to an earlier slot.
    assert reslotted({5: 2}, 1.0, 0.5) == {11: 2}


async def test_a_high_rate_keeps_one_small_value_and_holds_its_limit(
    js: JetStreamContext, tenant: str
) -> None:
    limiter = await RateLimiter.open(js)
    rate = Rate(calls=1_000, per_s=2.0)
    admitted = 0
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        if await limiter.admit(tenant, "lookup", rate) is None:
            admitted += 1
    assert 0 < admitted <= 1_000
    kv = await js.key_value(RATE_LIMITS_BUCKET.bucket)
    stored = json.loads((await kv.get(f"{tenant}.lookup.slots")).value or b"{}")
    # One count per slot of the window, not one time per call.
    assert len(stored["counts"]) <= SLOTS + 1 < admitted
    assert sum(calls for _, calls in stored["counts"]) == admitted


async def test_a_refusal_says_when_the_first_counted_slot_leaves_the_window(
    js: JetStreamContext, tenant: str
) -> None:
    limiter = await RateLimiter.open(js)
    rate = Rate(calls=2, per_s=60)
    first = time.time()
    assert await limiter.admit(tenant, "t", rate) is None
    assert await limiter.admit(tenant, "t", rate) is None
    # A second limiter (another replica) sees the same counts.
    wait_s = await (await RateLimiter.open(js)).admit(tenant, "t", rate)
    assert wait_s is not None
    retry_at = time.time() + wait_s
    assert first + 60 <= retry_at <= first + 60 + 60 / SLOTS
