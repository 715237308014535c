"""The state service's edge: a checkpoint after every completed step, off the critical path."""

from __future__ import annotations

from helmline.contracts import ToolCallCompleted
from helmline.runtime import Delivery, EventStore
from helmline.state._checkpoints import checkpoint_after

SOURCE = "helmline/state"


class CheckpointHandler:
    """Records a checkpoint for each completed tool call."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    async def __call__(self, delivery: Delivery) -> None:
        completed = delivery.event.data
        if isinstance(completed, ToolCallCompleted):
            checkpoint = checkpoint_after(completed, delivery.seq)
            await self._store.append(
                delivery.event.derive(
                    checkpoint, source=SOURCE, identity=f"checkpoint/{completed.call_id}"
                )
            )
