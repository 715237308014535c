"""Folded states kept beside the log, so that time travel does not replay a whole session.

The state at sequence N is the nearest folded state stored at or before N plus a fold of the
events after it. Stored states are a cache: the log stays the truth, a state folded by another
version of the fold is ignored, and the bucket can be dropped at any time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections import OrderedDict
from functools import cache

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import TypeAdapter, ValidationError

from helmline.contracts import FOLD_VERSION, SESSION_STATES_BUCKET, SessionState
from helmline.runtime._store import EventStore, SessionSnapshot

logger = logging.getLogger(__name__)

EVERY = 100
"""Stream sequences between two stored states of a session (fewer events when other
sessions' events lie between): the longest tail a time travel folds."""

_REMEMBERED = 1_000
"""Sessions whose latest stored state a writer keeps in memory, to fold on from it."""


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
    """Sessions' states at some of their sequences, in a JetStream key-value bucket."""

    def __init__(self, js: JetStreamContext, store: EventStore, *, every: int = EVERY) -> None:
        self._js = js
        self._store = store
        self._every = every
        self._bucket: KeyValue | None = None
        self._latest: OrderedDict[tuple[str, str], SessionSnapshot] = OrderedDict()

    async def load(
        self, tenant: str, session_id: str, *, up_to_seq: int | None = None
    ) -> SessionSnapshot:
        """The session's state after `up_to_seq` (or now): the same as folding its log."""
        nearest = await self._nearest(tenant, session_id, up_to_seq)
        return await self._store.load(tenant, session_id, up_to_seq=up_to_seq, start=nearest)

    async def keep_up(self, tenant: str, session_id: str, seq: int) -> bool:
        """Store the session's state at `seq` if `every` sequences passed since the last one
        stored; whether it did. Calls for one session must not overlap.

        Only a cache of the log: when NATS does not answer, nothing is stored and a later
        call tries again.
        """
        try:
            return await self._keep_up(tenant, session_id, seq)
        except (NatsError, TimeoutError) as error:
            logger.warning("could not store the state of %s/%s: %s", tenant, session_id, error)
            return False

    async def _keep_up(self, tenant: str, session_id: str, seq: int) -> bool:
        stored = await self._stored_seqs(tenant, session_id)
        last = max(stored, default=0)
        if seq - last < self._every:
            return False
        known = self._latest.pop((tenant, session_id), None)
        if known is None or known.last_seq != last:
            known = await self._nearest(tenant, session_id, seq)
        snapshot = await self._store.load(tenant, session_id, up_to_seq=seq, start=known)
        if snapshot.last_seq in stored or snapshot.last_seq == 0:
            return False
        bucket = await self._kv()
        encoded = zlib.compress(_states().dump_json(snapshot.state), 1)
        # The state first, then the index that points to it: a crash between leaves an
        # unreferenced state, never a reference to nothing.
        await bucket.put(self._key(tenant, session_id, str(snapshot.last_seq)), encoded)
        index = sorted({*stored, snapshot.last_seq})
        await bucket.put(self._key(tenant, session_id, "index"), json.dumps(index).encode())
        self._latest[(tenant, session_id)] = snapshot
        while len(self._latest) > _REMEMBERED:
            self._latest.popitem(last=False)
        return True

    async def _nearest(
        self, tenant: str, session_id: str, up_to_seq: int | None
    ) -> SessionSnapshot | None:
        stored = await self._stored_seqs(tenant, session_id)
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

    async def _stored_seqs(self, tenant: str, session_id: str) -> list[int]:
        try:
            entry = await (await self._kv()).get(self._key(tenant, session_id, "index"))
        except (KeyNotFoundError, BucketNotFoundError):
            return []  # Nothing stored yet, or a stack provisioned before states were kept.
        try:
            seqs = json.loads(entry.value or b"[]")
        except ValueError:
            return []
        return [seq for seq in seqs if isinstance(seq, int)]

    async def _kv(self) -> KeyValue:
        if self._bucket is None:
            self._bucket = await self._js.key_value(SESSION_STATES_BUCKET.bucket)
        return self._bucket

    @staticmethod
    def _key(tenant: str, session_id: str, name: str) -> str:
        return f"{_version()}.{tenant}.{session_id}.{name}"
