"""The plan approvals that scheduled calls are checked against.

A step whose approved plan authorised its call (`StepScheduled.authorized_by_plan`) runs when
scheduled, with no `tool.call.authorized` of its own. The gateway runs it only if that
approval, as the log holds it, authorised this step with this tool and these arguments: the
planner says which revision, the approval service's event says what it allowed.
"""

from __future__ import annotations

from cachetools import LRUCache

from helmline.contracts import Event, PlanApproved, StepScheduled, ToolCallAuthorized, event_subject
from helmline.runtime import EventStore

SESSIONS_KEPT = 1024
"""Sessions whose plan approval is kept in memory: read once per session, not per step."""


class PlanApprovals:
    """Each session's plan approval in force, read from the log when first needed."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._approvals: LRUCache[tuple[str, str], PlanApproved] = LRUCache(SESSIONS_KEPT)

    async def authorized_call(
        self, cause: Event, scheduled: StepScheduled
    ) -> ToolCallAuthorized | None:
        """The call `scheduled` makes, as the approval it names authorised it; None when
        that approval is not in the log or did not authorise this call."""
        revision = scheduled.authorized_by_plan
        if revision is None:
            return None
        approval = await self._approval(cause, revision)
        return scheduled.authorized_by(approval) if approval is not None else None

    async def _approval(self, cause: Event, revision: int) -> PlanApproved | None:
        key = (cause.tenant, cause.session_id)
        approval = self._approvals.get(key)
        if approval is not None and approval.revision == revision:
            return approval
        last = await self._store.read_last(cause.tenant, cause.session_id, PlanApproved.TYPE)
        if last is None or not isinstance(last.event.data, PlanApproved):
            return None
        approval = last.event.data
        if approval.revision != revision:
            # A replan was approved after the step was scheduled: its own revision decides.
            subject = event_subject(cause.tenant, cause.session_id, PlanApproved.TYPE)
            earlier = [
                stored.event.data
                for stored in await self._store.read_matching(subject)
                if isinstance(stored.event.data, PlanApproved)
                and stored.event.data.revision == revision
            ]
            return earlier[-1] if earlier else None
        self._approvals[key] = approval
        return approval
