"""Retries with backoff and a circuit breaker per server: pure decisions, the clock passed in."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]


LONGEST_PAUSE_S = 5.0
"""The longest pause between two tries of one call: the backoff's cap, and the longest
Retry-After the gateway waits out itself (a longer wait is the planner's, which defers the
step durably where the gateway would hold the call in memory)."""


def backoff_s(retry: int, *, base_s: float = 0.05, cap_s: float = LONGEST_PAUSE_S) -> float:
    """The pause before retry number `retry` (1 for the first): exponential with full jitter,
    so replicas that failed together do not come back together."""
    return random.uniform(0.0, min(cap_s, base_s * 2 ** (retry - 1)))


@dataclass(frozen=True, slots=True)
class CircuitChange:
    """A breaker moved from one state to another."""

    previous: CircuitState
    state: CircuitState
    failures: int
    reason: str
    retry_at: float | None
    """When an open breaker lets a probe through, on the clock the breaker is given
    (`time.monotonic()` in the gateway)."""


@dataclass(slots=True)
class CircuitBreaker:
    """Closed → open after `threshold` consecutive failures → half-open after `reset_s`, when
    one probe call is let through → closed on its success, open again on its failure."""

    threshold: int
    reset_s: float
    state: CircuitState = "closed"
    failures: int = 0
    opened_at: float = 0.0
    probing: bool = field(default=False)

    def admit(self, now: float) -> tuple[bool, CircuitChange | None]:
        """Whether a call may go to the server now (and the change that letting it made)."""
        match self.state:
            case "closed":
                return True, None
            case "open" if now - self.opened_at >= self.reset_s:
                self.probing = True
                return True, self._move("half_open", "reset window over: probing", None)
            case "half_open" if not self.probing:
                self.probing = True
                return True, None
            case _:
                return False, None

    def retry_at(self) -> float:
        """When an open breaker lets the next probe through."""
        return self.opened_at + self.reset_s

    def succeeded(self) -> CircuitChange | None:
        """Record a call that reached the server and came back."""
        self.failures = 0
        self.probing = False
        if self.state != "closed":
            return self._move("closed", "a probe call succeeded", None)
        return None

    def failed(self, now: float, reason: str) -> CircuitChange | None:
        """Record a call that failed in a way that counts against the server."""
        self.failures += 1
        self.probing = False
        if self.state == "half_open" or (
            self.state == "closed" and self.failures >= self.threshold
        ):
            self.opened_at = now
            return self._move("open", reason, self.retry_at())
        return None

    def _move(self, state: CircuitState, reason: str, retry_at: float | None) -> CircuitChange:
        change = CircuitChange(self.state, state, self.failures, reason, retry_at)
        self.state = state
        return change
