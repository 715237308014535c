"""Live sessions' folded state, kept in memory and advanced one event at a time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cachetools import LRUCache

from helmline.contracts import Event, SessionStarted, SessionState, fold
from helmline.runtime._consumer import Delivery
from helmline.runtime._folded_states import FoldedStates
from helmline.runtime._phases import current_hop
from helmline.runtime._store import EventStore, SessionSnapshot, StoredEvent

ENDED_KEPT = 1_000
"""How many ended sessions a cache keeps (those met last). Events follow a session's end:
its last checkpoints, made off the steps' path, come later, the later the further the state
service is behind. Catching up on a backlog of many sessions that ran at once, the read
model meets those checkpoints session after session in turn: with fewer ended sessions kept
than that, every one of them missed and was read again from the log (300 sessions of 50
events took 21 s to project with 100 kept, 10 s with 1,000)."""


class SessionCache:
    """The state of each live session as a service sees it.

    On a miss (after a restart, or a session met after its start) the session is folded
    from the log, a long one from its nearest stored state on; a session met at its start
    needs no read. Afterwards:

    - A replica alone on its consumer is handed every event of the types it consumes, and
      appends every decision of its own: folding those (one `evolve` each) keeps the state
      it decides on, the log's fold up to the first event it saw, then of those events.
    - Replicas sharing a consumer split its messages whatever their session, so each would
      miss what the others were handed and appended: a delivery then folds on the session's
      events since the last one folded, read from the log in one request.
    """

    def __init__(
        self,
        states: FoldedStates,
        capacity: int = 10_000,
        *,
        on_load: Callable[[str, str, SessionSnapshot], None] | None = None,
    ) -> None:
        """`on_load` is told of each state folded from the log on a miss: the only state
        held here that is the log's own (later ones add only the events the service
        consumes and appends)."""
        self._states = states
        self._on_load = on_load
        # A session evicted (used longest ago) is rebuilt from the log if it comes back.
        self._sessions: LRUCache[tuple[str, str], _Entry] = LRUCache(capacity)
        # Events may follow a session's end (its last checkpoint, made off the steps' path):
        # the latest ended sessions are kept, so that such an event costs no replay.
        self._ended: LRUCache[tuple[str, str], _Entry] = LRUCache(ENDED_KEPT)

    async def advance(self, delivery: Delivery) -> SessionState:
        """The session's state up to the delivered event (applied exactly once).

        A redelivery means an earlier attempt may have appended its decisions already,
        possibly longer ago than JetStream remembers message ids; so the state is then
        rebuilt from the whole log, and a decision already taken shows in it.
        """
        return await self.advance_through([delivery])

    async def advance_through(self, deliveries: Sequence[Delivery]) -> SessionState:
        """The state of one session up to the last of its delivered events, given in stream
        order: as `advance` would leave it after each, in one read and one fold (a fold
        copies the state's tables once, not once an event).

        Its time shows in the hop being handled as `fold`, less its reads of the log, which
        show as `read` (see `helmline.runtime._phases`)."""
        hop = current_hop()
        began = time.perf_counter_ns()
        read_ns = 0
        first, last = deliveries[0].event, deliveries[-1]
        key = (first.tenant, first.session_id)
        entry = self._held(key)
        if any(delivery.maybe_handled for delivery in deliveries):
            reading = time.perf_counter_ns()
            entry = await self._load(first, up_to_seq=None, known_seq=last.seq)
            read_ns += time.perf_counter_ns() - reading
        elif entry is None and isinstance(first.data, SessionStarted):
            # Met at its start, the session has nothing before it to read (a session starts
            # expecting an empty log). Reading cost a direct get of every event it has by
            # now: in a backlog of sessions that ran together, its whole span of the log.
            # What was delivered with the start is caught up on below, as any later
            # delivery: another replica may have been handed the events in between.
            entry = _Entry(fold([first]), deliveries[0].seq)
        elif entry is None:
            reading = time.perf_counter_ns()
            entry = await self._load(first, up_to_seq=last.seq, known_seq=last.seq)
            read_ns += time.perf_counter_ns() - reading
        if last.seq > entry.seen:
            met: Iterable[Delivery | StoredEvent] = deliveries
            if any(delivery.shared for delivery in deliveries):
                # Whichever replica of the stream answers must hold what was delivered.
                reading = time.perf_counter_ns()
                met = await self._states.store.read_all(
                    first.tenant,
                    first.session_id,
                    after_seq=entry.seen,
                    up_to_seq=last.seq,
                    known_seq=last.seq,
                )
                read_ns += time.perf_counter_ns() - reading
            events = []
            for item in met:
                if item.event.id in entry.own:
                    entry.own.discard(item.event.id)  # Appended here: applied already.
                elif item.seq > entry.seen:
                    events.append(item.event)
            entry.state, entry.seen = fold(events, entry.state), last.seq
        self._remember(key, entry)
        if hop is not None:
            hop.read += read_ns
            hop.fold += time.perf_counter_ns() - began - read_ns
        return entry.state

    async def _load(self, event: Event, up_to_seq: int | None, known_seq: int) -> _Entry:
        snapshot = await self._states.load(
            event.tenant, event.session_id, up_to_seq=up_to_seq, log_first=True, known_seq=known_seq
        )
        if self._on_load is not None:
            self._on_load(event.tenant, event.session_id, snapshot)
        return _Entry(snapshot.state, snapshot.last_seq)

    def record(self, state: SessionState, appended: Iterable[Event]) -> SessionState:
        """Apply events the service appended itself (to `state`, as `advance` returned it),
        and keep the result; they are not folded again when later read from the log.

        Its time shows in the hop being handled as `fold`."""
        hop = current_hop()
        began = time.perf_counter_ns()
        key = (state.tenant, state.session_id)
        appended = list(appended)
        state = fold(appended, state)
        entry = self._held(key)
        if entry is not None:
            entry.own.update(event.id for event in appended)
            entry.state = state
            self._remember(key, entry)
        # Else forgotten meanwhile: met again, the session is read from the log.
        if hop is not None:
            hop.fold += time.perf_counter_ns() - began
        return state

    def holds(self, tenant: str, session_id: str) -> bool:
        """Whether the session's state is in memory (an event for it costs no replay)."""
        return self._held((tenant, session_id)) is not None

    def forget(self, tenant: str, session_id: str) -> None:
        """Drop a session (its state must be rebuilt from the log)."""
        self._sessions.pop((tenant, session_id), None)
        self._ended.pop((tenant, session_id), None)

    def _held(self, key: tuple[str, str]) -> _Entry | None:
        return self._sessions.get(key) or self._ended.get(key)

    def _remember(self, key: tuple[str, str], entry: _Entry) -> None:
        if entry.state.is_terminal:
            self._sessions.pop(key, None)
            self._ended[key] = entry
        else:
            self._sessions[key] = entry


@dataclass(slots=True)
class _Entry:
    state: SessionState
    seen: int
    """Sequence of the session's last event folded."""
    own: set[uuid.UUID] = field(default_factory=set)
    """Events this service appended and applied, not yet met in the log (folding them
    again there would count them twice)."""


class LogStates:
    """Sessions' states as their whole logs fold now, for a service handed an event that it
    may have handled before (a redelivery): whether a call already started or finished is
    read from the state (`SessionState.call_progress`), never by scanning the log.

    A session met again is folded on from the state held here, by the events appended
    since (one read of those alone); one not held is loaded from its nearest stored state
    and the events after it. So a redelivery costs the same in a long session as in a short
    one, once the session is held. Unlike `SessionCache`, whose states fold only what the
    service consumes and appends, each state here is the log's own.
    """

    def __init__(
        self, store: EventStore, states: FoldedStates | None = None, capacity: int = 1_000
    ) -> None:
        """`states`: where stored states are read (without, a session not held is folded
        from its whole log)."""
        self._store = store
        self._states = states
        self._held: LRUCache[tuple[str, str], _Entry] = LRUCache(capacity)

    async def now(self, delivery: Delivery) -> SessionState:
        """The state of the delivered event's session after every event of its log now."""
        event, known_seq = delivery.event, delivery.seq
        key = (event.tenant, event.session_id)
        entry = self._held.get(key)
        if entry is None:
            snapshot = await self._load(event.tenant, event.session_id, known_seq)
            entry = _Entry(snapshot.state, snapshot.last_seq)
        else:
            since = await self._store.read_all(
                event.tenant, event.session_id, after_seq=entry.seen, known_seq=known_seq
            )
            if since:
                entry = _Entry(fold((item.event for item in since), entry.state), since[-1].seq)
        held = self._held.get(key)
        if held is None or held.seen <= entry.seen:
            self._held[key] = entry  # Two redeliveries at once: the later fold stays.
        return entry.state

    async def _load(self, tenant: str, session_id: str, known_seq: int) -> SessionSnapshot:
        if self._states is not None:
            return await self._states.load(tenant, session_id, log_first=True, known_seq=known_seq)
        return await self._store.load(tenant, session_id, known_seq=known_seq)
