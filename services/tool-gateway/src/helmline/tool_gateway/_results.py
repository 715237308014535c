"""Results of pure tools, answered again from the log: a tool declared pure that a session
calls again with the same arguments is not called again; the new call ends with the first
call's result.

The shared bucket holds only where each result was logged (its stream sequence), by session
and by a digest of the tool and its arguments, so that every gateway replica finds it and a
result is never stored twice. An entry whose event the log no longer holds, or that points
at anything but that tool's result in that session, is a miss: the tool is called.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from helmline.contracts import (
    TOOL_RESULTS_BUCKET,
    Event,
    ToolCallAuthorized,
    ToolCallCompleted,
    call_digest,
)
from helmline.runtime import EventStore


class PureResults:
    """Each session's logged results of pure tools, by tool and arguments."""

    def __init__(self, kv: KeyValue, store: EventStore) -> None:
        self._kv = kv
        self._store = store

    @classmethod
    async def open(cls, js: JetStreamContext, store: EventStore) -> PureResults:
        """The results over the shared bucket (provisioned from the contracts)."""
        return cls(await js.key_value(TOOL_RESULTS_BUCKET.bucket), store)

    async def recall(self, cause: Event, call: ToolCallAuthorized) -> ToolCallCompleted | None:
        """The call's outcome made of the session's earlier result of the same call, if the
        log holds one."""
        try:
            entry = await self._kv.get(_key(cause, call))
        except KeyNotFoundError:
            return None
        if not entry.value or not entry.value.isdigit():
            return None
        stored = await self._store.read_at(cause.tenant, cause.session_id, int(entry.value))
        earlier = stored.event.data if stored is not None else None
        if not isinstance(earlier, ToolCallCompleted) or earlier.tool != call.tool:
            return None
        return earlier.model_copy(
            update={
                "call_id": call.call_id,
                "step_id": call.step_id,
                "duration_ms": 0.0,
                "attempts": 1,
                "cached_from": earlier.call_id,
            }
        )

    async def remember(self, cause: Event, call: ToolCallAuthorized, seq: int) -> None:
        """Note where the call's result was logged, for the session's next same call."""
        await self._kv.put(_key(cause, call), str(seq).encode())


def _key(cause: Event, call: ToolCallAuthorized) -> str:
    # The digest sorts the arguments: {"a": 1, "b": 2} and {"b": 2, "a": 1} are one call.
    return f"{cause.tenant}.{cause.session_id}.{call_digest(call.tool, call.arguments)}"
