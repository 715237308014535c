"""Folded states kept beside the log, so that time travel does not replay a whole session.

The state at sequence N is the nearest folded state stored at or before N plus a fold of the
events after it. Stored states are a cache: the log stays the truth, a state folded by another
version of the fold is ignored, and the bucket can be dropped at any time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from cachetools import LRUCache
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
)
from nats.js.kv import KeyValue
from pydantic import TypeAdapter, ValidationError

from helmline.contracts import FOLD_VERSION, SESSION_STATES_BUCKET, SessionFold, SessionState
from helmline.runtime._store import EventStore, SessionSnapshot
from helmline.runtime._sweeps import sessions_gone

logger = logging.getLogger(__name__)

EVERY = 500
"""The fewest events of a session between two of its stored states. Counted in the session's
own events, not in stream sequences, so that a session among many busy ones is not stored at
every step. Time travel folds at most this many events of the log after the state it loads
(about 12 ms at 23 us an event, within its 50 ms), and a session shorter than this, most of
them, stores none: a 200-step session (1,000 events) stores 2 states, not the 9 it stored at
every 100 events, each a dump of the whole state (1.5 ms at 1,000 events, and the state
service's largest cost per step after the checkpoint itself)."""

GROWTH = 0.05
"""A stored state holding N events is followed by the next one `max(EVERY, GROWTH * N)`
events later. Writing a state costs in proportion to its size, so evenly spaced states made
a session's writing grow with the square of its length (a 2,000-step session's state service
spent 0.77 ms of processor per step, against 0.60 spaced like this); spaced in proportion,
each event pays a constant share. Loading a stored state costs about 2 us per event it holds,
reading and folding an event of the log about 23 us, so the tail that time travel folds after
the state it loads (at most a twentieth of its events) costs no more than loading it."""

INTERVAL_S = 0.5
"""Least time between two reads of one session's new events by a writer."""

_REMEMBERED = 1_000
"""Sessions whose index (and latest folded state, to fold on from) a writer keeps in memory."""

_INDEX_WRITES = 5
"""Attempts to write a session's index while other writers keep changing it."""


@cache
def _states() -> TypeAdapter[SessionState]:
    return TypeAdapter(SessionState)


@cache
def _version() -> str:
    """The fold's version and the state's field layout: a stored state of any other is
    ignored rather than read wrongly."""
    layout = json.dumps(_states().json_schema(), sort_keys=True).encode()
    return f"v{FOLD_VERSION}-{hashlib.sha256(layout).hexdigest()[:12]}"


class FoldedStates:
    """Sessions' states at some of their sequences, in a JetStream key-value bucket.

    A writer (`keep_up`) remembers each session's index as it last read or wrote it, and the
    state it folded last: a call reads only the events since that fold, and only once enough
    of them may have accrued. That memory may lag behind the bucket (another replica stored a
    state of the session, or the bucket was dropped); the only harm is a state stored twice,
    because the index is written only over the revision it was read at, and rebuilt from the
    bucket when that revision is no longer the latest.
    Readers (`load`) always read the bucket's index.
    """

    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        *,
        every: int = EVERY,
        growth: float = GROWTH,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`every` and `growth` space the stored states (see `GROWTH`); `interval_s`: the
        least time between two reads of one session by `keep_up` (`clock` tells the time)."""
        self._js = js
        self._store = store
        self._every = every
        self._growth = growth
        self._interval_s = interval_s
        self._clock = clock
        self._bucket: KeyValue | None = None
        # Per session, for the sessions met most recently.
        self._known: LRUCache[tuple[str, str], _Index] = LRUCache(_REMEMBERED)
        self._folded_elsewhere: LRUCache[tuple[str, str], tuple[SessionSnapshot, float]] = LRUCache(
            _REMEMBERED
        )

    @property
    def store(self) -> EventStore:
        """The log the states are folded from."""
        return self._store

    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        up_to_seq: int | None = None,
        log_first: bool = False,
        known_seq: int = 0,
    ) -> SessionSnapshot:
        """The session's state after `up_to_seq` (or now): the same as folding its log, from
        the nearest stored state on (or from the log when stored states cannot be read now).

        `log_first` reads the log's first events before asking for stored states, and asks
        only when the session is longer than that read: one request for a short session,
        one wasted read for a long one. For a service meeting sessions (most are short);
        time travel, often into long sessions, asks for the stored states first.
        `known_seq`: a sequence known to be stored (see `EventStore.read_all`).
        """
        if log_first:
            return await self._store.load(
                tenant,
                session_id,
                up_to_seq=up_to_seq,
                nearest_stored=lambda: self._nearest_stored(tenant, session_id, up_to_seq),
                known_seq=known_seq,
            )
        nearest = await self._nearest_stored(tenant, session_id, up_to_seq)
        return await self._store.load(
            tenant, session_id, up_to_seq=up_to_seq, start=nearest, known_seq=known_seq
        )

    async def _nearest_stored(
        self, tenant: str, session_id: str, up_to_seq: int | None
    ) -> SessionSnapshot | None:
        try:
            index = await self._read_index(tenant, session_id)
            return await self._nearest(tenant, session_id, index.seqs, up_to_seq)
        except (NatsError, TimeoutError) as error:
            logger.warning("folding %s/%s from its log: %s", tenant, session_id, error)
            return None

    def note_folded(self, tenant: str, session_id: str, snapshot: SessionSnapshot) -> None:
        """Tell `keep_up` of a fold of the session's log read just now elsewhere in the
        process (a cache meeting the session): a session with no state stored yet is then
        folded on from there, not read again from its start, where its largest events are
        (the playbook, the plan); and that read counts as the interval's."""
        self._folded_elsewhere[tenant, session_id] = (snapshot, self._clock())

    async def keep_up(self, tenant: str, session_id: str, seq: int) -> bool:
        """Store the session's states due up to `seq` (spaced as `GROWTH` says; reading the
        session at most once per interval); whether it stored any. Calls for
        one session must not overlap within a process (replicas may overlap: see the class).

        Only a cache of the log: when NATS does not answer, nothing is stored and a later
        call tries again.
        """
        try:
            return await self._keep_up(tenant, session_id, seq)
        except (NatsError, TimeoutError) as error:
            logger.warning("could not store the state of %s/%s: %s", tenant, session_id, error)
            return False

    async def _keep_up(self, tenant: str, session_id: str, seq: int) -> bool:
        session = (tenant, session_id)
        index = self._known.pop(session, None) or await self._read_index(tenant, session_id)
        noted = self._folded_elsewhere.pop(session, None)
        if noted is not None and index.latest is None and not index.seqs:
            elsewhere, read_at = noted
            if elsewhere.last_seq <= seq:
                index = replace(index, latest=elsewhere, folded_at=read_at)
        self._known[session] = index
        folded_to = index.latest.last_seq if index.latest else max(index.seqs, default=0)
        # The session has at most one event per sequence since the last fold: until enough
        # sequences passed for the next state to be due, there is nothing to read. Among
        # busy sessions that says little, so a session is also read at most once per
        # interval: one read then catches up on many steps, storing each state due.
        if seq - folded_to < self._gap_after(index.stored_events) - index.unstored_events:
            return False
        now = self._clock()
        if index.folded_at is not None and now - index.folded_at < self._interval_s:
            return False
        bucket = await self._kv()  # On a stack without the bucket, fails before replaying.
        start = index.latest or await self._nearest(tenant, session_id, index.seqs, seq)
        stored_events = index.stored_events if index.latest else _events_in(start)
        folded, due = await self._fold_on(tenant, session_id, start, seq, stored_events)
        due = [snapshot for snapshot in due if snapshot.last_seq not in index.seqs]
        if not due:
            folded_here = replace(index, latest=folded, stored_events=stored_events, folded_at=now)
            self._known[session] = folded_here
            return False
        # The states first, then the index that points to them: a crash between leaves
        # unreferenced states, never a reference to nothing.
        for snapshot in due:
            encoded = zlib.compress(_states().dump_json(snapshot.state), 1)
            await bucket.put(self._key(tenant, session_id, str(snapshot.last_seq)), encoded)
        for _ in range(_INDEX_WRITES):
            seqs = tuple(sorted({*index.seqs, *(snapshot.last_seq for snapshot in due)}))
            try:
                revision = await bucket.update(
                    self._key(tenant, session_id, "index"),
                    json.dumps(seqs).encode(),
                    last=index.revision,
                )
            except KeyWrongLastSequenceError:
                # Written since it was read here (by another replica): keep what it added.
                index = await self._read_index(tenant, session_id)
                continue
            stored = _events_in(due[-1])
            self._known[session] = _Index(seqs, revision, folded, stored, folded_at=now)
            return True
        logger.warning(
            "could not index the states of %s/%s up to %d: its index kept changing",
            tenant,
            session_id,
            due[-1].last_seq,
        )
        self._known.pop(session, None)
        return False

    async def _fold_on(
        self,
        tenant: str,
        session_id: str,
        start: SessionSnapshot | None,
        up_to_seq: int,
        stored_events: int,
    ) -> tuple[SessionSnapshot, list[SessionSnapshot]]:
        """The session's state at `up_to_seq` folded on from `start`, and the states passed
        on the way that are due to be stored, the first one after the `stored_events`-th
        event."""
        folding = SessionFold(start.state if start is not None else None)
        last_seq = start.last_seq if start is not None else 0
        events = _events_in(start)
        due: list[SessionSnapshot] = []
        after = await self._store.read_all(
            tenant, session_id, after_seq=last_seq, up_to_seq=up_to_seq
        )
        next_due = stored_events + self._gap_after(stored_events)
        for item in after:
            folding.apply(item.event)
            last_seq, events = item.seq, events + 1
            if events >= next_due:
                due.append(SessionSnapshot(folding.state(), last_seq))
                next_due = events + self._gap_after(events)
        if due and due[-1].last_seq == last_seq:
            return due[-1], due
        return SessionSnapshot(folding.state(), last_seq), due

    def _gap_after(self, stored_events: int) -> int:
        """Events between a stored state holding `stored_events` and the next one."""
        return max(self._every, int(self._growth * stored_events))

    async def _nearest(
        self, tenant: str, session_id: str, stored: tuple[int, ...], up_to_seq: int | None
    ) -> SessionSnapshot | None:
        usable = [seq for seq in stored if up_to_seq is None or seq <= up_to_seq]
        if not usable:
            return None
        seq = max(usable)
        try:
            entry = await (await self._kv()).get(self._key(tenant, session_id, str(seq)))
            state = _states().validate_json(zlib.decompress(entry.value or b""))
        except (KeyNotFoundError, zlib.error, ValidationError) as error:
            logger.warning(
                "ignoring the stored state of %s/%s at %d: %s", tenant, session_id, seq, error
            )
            return None
        return SessionSnapshot(state=state, last_seq=seq)

    async def _read_index(self, tenant: str, session_id: str) -> _Index:
        try:
            entry = await (await self._kv()).get(self._key(tenant, session_id, "index"))
        except BucketNotFoundError:
            return _Index((), 0)  # A stack provisioned before states were kept.
        except KeyNotFoundError as error:
            # Nothing stored yet, or the index was deleted (its tombstone's revision is the
            # one to write over).
            tombstone = error.entry.revision if error.entry is not None else None
            return _Index((), tombstone or 0)
        try:
            seqs = json.loads(entry.value or b"[]")
        except ValueError:
            seqs = []
        return _Index(tuple(seq for seq in seqs if isinstance(seq, int)), entry.revision or 0)

    async def sweep(self) -> int:
        """Drop the states stored for sessions the log no longer holds, and those folded by
        another version of the fold (never read again); how many keys went."""
        bucket = await self._kv()
        try:
            keys = await bucket.keys()
        except NoKeysError:
            return 0
        by_session: dict[tuple[str, str], list[str]] = {}
        stale = []
        for key in keys:
            version, _, rest = key.partition(".")
            tenant, session_id, _ = rest.split(".", 2)
            if version == _version():
                by_session.setdefault((tenant, session_id), []).append(key)
            else:
                stale.append(key)
        for session in await sessions_gone(self._store, by_session):
            stale += by_session[session]
            self._known.pop(session, None)
        # Purged from the bucket's stream rather than deleted: a deletion leaves a marker
        # per key, which would then need sweeping too (and the client's sweep of markers
        # reads every stored state).
        stream = KV_STREAM_TEMPLATE.format(bucket=SESSION_STATES_BUCKET.bucket)
        subjects = KV_PRE_TEMPLATE.format(bucket=SESSION_STATES_BUCKET.bucket)
        for key in stale:
            await self._js.purge_stream(stream, subject=subjects + key)
        return len(stale)

    async def _kv(self) -> KeyValue:
        if self._bucket is None:
            self._bucket = await self._js.key_value(SESSION_STATES_BUCKET.bucket)
        return self._bucket

    @staticmethod
    def _key(tenant: str, session_id: str, name: str) -> str:
        return f"{_version()}.{tenant}.{session_id}.{name}"


@dataclass(frozen=True, slots=True)
class _Index:
    """A session's index of stored states, as a writer last read or wrote it."""

    seqs: tuple[int, ...]
    """Sequences at which states are stored, in order."""
    revision: int
    """The index key's revision then; 0 when there was none."""
    latest: SessionSnapshot | None = None
    """The latest fold of the session this writer knows, stored or not, to fold on from:
    its own, or one made elsewhere in the process (`note_folded`)."""
    stored_events: int = 0
    """Events in the newest stored state this writer knows of."""
    folded_at: float | None = None
    """When the session was last read to fold `latest` on (this writer's clock); None:
    never."""

    @property
    def unstored_events(self) -> int:
        """Events folded here since the newest stored state."""
        return _events_in(self.latest) - self.stored_events if self.latest else 0


def _events_in(snapshot: SessionSnapshot | None) -> int:
    return snapshot.state.event_count if snapshot else 0
