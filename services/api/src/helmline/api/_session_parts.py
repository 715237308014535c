"""A session in parts, for views of long sessions: its overview, its line of the session list,
its steps (runs of succeeded ones folded when asked) and calls by range (filtered by status,
tool, or a search of ids and tools), its checkpoints by range with what a rollback to each
would undo, its thoughts by range, its log by sequence, and what changed since a sequence.

Each is cut from the session folded from its log (as `GET /sessions/{id}`), so a page of a
10,000-step session moves the rows it shows, not megabytes; "changes since N" reads only the
events after N to learn which steps they touched.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, SerializeAsAny

from helmline.api._auth import Viewer
from helmline.api._problems import (
    PROBLEM_RESPONSES,
    FieldProblem,
    ProblemDetails,
    invalid,
    not_found,
)
from helmline.api._reads import SessionSummary, load_session, summary_of
from helmline.api._routes import NOT_FOUND, SessionPath
from helmline.contracts import (
    BUILTIN_SERVER,
    IN_FLIGHT_STEPS,
    MCP_NAME_SEPARATOR,
    CheckpointState,
    Event,
    SessionState,
    StepState,
    StepStatus,
    Table,
    ThoughtState,
    touched,
)
from helmline.runtime import EventStore, FoldedStates, SessionSnapshot

router = APIRouter(tags=["sessions"], responses={**PROBLEM_RESPONSES, **NOT_FOUND})

LATEST = 100
"""Checkpoints and thoughts an overview carries: the latest ones."""
MOST_CHANGES = 2_000
"""Events after which "changes since" answers `reset` rather than the steps they touched."""
NAMED = 10
"""Steps a checkpoint's rollback reach names, the latest ones; the rest it counts."""

Offset = Annotated[int, Query(ge=0, le=1_000_000, description="The first item's index")]
Limit = Annotated[int, Query(ge=1, le=500, description="How many items at most")]
StatusFilter = Annotated[list[StepStatus], Query(description="Only steps in one of these statuses")]
ToolFilter = Annotated[list[str], Query(description="Only steps calling one of these tools")]
Search = Annotated[
    str,
    Query(max_length=128, description="Only steps whose id or tool has this in it, in any case"),
]


class LatestStates:
    """The latest folded state of the sessions whose parts were read most recently.

    A view of a long session reads it in parts, again every few hundred milliseconds while
    it runs: each read folds only the events since the state kept (one request when there
    are none), where a load from the stored states would decode the whole session each time.
    """

    def __init__(self, states: FoldedStates, capacity: int = 32) -> None:
        self._states = states
        self._capacity = capacity
        self._kept: OrderedDict[tuple[str, str], SessionSnapshot] = OrderedDict()

    @property
    def store(self) -> EventStore:
        return self._states.store

    async def load(self, tenant: str, session_id: str) -> SessionSnapshot:
        """The session now; 404 when it has no events."""
        key = (tenant, session_id)
        kept = self._kept.get(key)
        if kept is None:
            snapshot = await self._states.load(tenant, session_id)
        else:
            snapshot = await self._states.store.load(tenant, session_id, start=kept)
        if snapshot.last_seq == 0:
            raise not_found(f"no session {session_id}")
        # Requests overlap: the one that read furthest is kept.
        latest = self._kept.get(key)
        if latest is None or latest.last_seq < snapshot.last_seq:
            self._kept[key] = snapshot
        self._kept.move_to_end(key)
        while len(self._kept) > self._capacity:
            self._kept.popitem(last=False)
        return snapshot


def _latest(request: Request) -> LatestStates:
    latest: LatestStates = request.app.state.latest_states
    return latest


@dataclasses.dataclass(frozen=True)
class Part:
    """Which items of a list: a range, of those whose step matches a filter."""

    offset: int
    limit: int
    status: list[StepStatus]
    tool: list[str]
    q: str

    def matches(self, step: StepState) -> bool:
        search = self.q.casefold()
        return (
            (not self.status or step.status in self.status)
            and (not self.tool or step.tool in self.tool)
            and (search in step.id.casefold() or search in step.tool.casefold())
        )


def _part(
    offset: Offset = 0,
    limit: Limit = 100,
    status: StatusFilter = [],  # noqa: B006 - FastAPI copies it
    tool: ToolFilter = [],  # noqa: B006
    q: Search = "",
) -> Part:
    return Part(offset, limit, status, tool, q)


PartQuery = Annotated[Part, Depends(_part)]


class SessionOverview(BaseModel):
    """A session without its steps: what a view shows above and around them."""

    state: SessionState
    """The folded state with no steps, and only its latest checkpoints and thoughts (the
    others by range: `rollback-points`, `thoughts`)."""
    last_seq: int
    """Stream sequence of the last event it reflects: ask for changes since this one."""
    steps_total: int
    steps_by_status: dict[str, int]
    """How many steps are in each status (those in none left out)."""
    tools: dict[str, int]
    """How many steps call each tool."""
    calls_total: int
    """Tool calls ever scheduled, retries of a step included."""
    steps_underway: bool
    """Some step is pending, scheduled, authorized, running or waits to be tried again."""
    checkpoints_total: int
    thoughts_total: int


class StepAt(BaseModel):
    """A step with where it is in the plan and in the call list."""

    position: int
    """Its index in plan order."""
    call_index: int | None
    """The index of its latest call in the order calls were scheduled; None: never called."""
    server: str
    """What serves its tool: `builtin`, or the MCP server the tool is federated from."""
    approval_wait_ms: float | None = None
    """How long its approval request waited for a person (so far, while it is pending);
    None: it asked nobody."""
    step: StepState


class StepRun(BaseModel):
    """Succeeded steps one after another in plan order (of those matching the filter), in
    one row of the list."""

    first: str
    last: str
    steps: int
    position: int
    """Its first step's index in plan order."""


class StepPage(BaseModel):
    """Rows from `offset` on: the steps matching the filter, runs of succeeded steps folded
    into one row each when asked."""

    total: int
    """Rows: steps matching the filter, each run folded counting one."""
    offset: int
    items: list[StepAt | StepRun]


class CallAt(BaseModel):
    """A tool call with its step as it is now."""

    index: int
    """Its index in the order calls were scheduled."""
    call_id: str
    latest: bool
    """Whether it is its step's latest call (the step's result, error and timing are its)."""
    step: StepAt


class CallPage(BaseModel):
    """Calls from `offset` on, of those whose step matches the filter."""

    total: int
    offset: int
    items: list[CallAt]


class LoggedEvent(BaseModel):
    seq: int
    """Its stream sequence."""
    event: SerializeAsAny[Event]
    """The event as stored: CloudEvents JSON, its payload under `data`."""


class EventPage(BaseModel):
    """The session's events after a sequence, oldest first."""

    items: list[LoggedEvent]
    last_seq: int
    """The session's last event when read: more follow while the last item is before it."""
    more: bool
    """More events were stored after the last item when it was read: page on from it."""


class SessionChanges(BaseModel):
    """What changed in a session since a sequence."""

    since: int
    overview: SessionOverview
    reset: bool
    """Too much changed (a new plan, a rollback, an end, or many events) to name it step by
    step: read the steps shown again."""
    steps: list[StepAt]
    """The steps the events touched, as they are now (empty with `reset`)."""


class UndoneStep(BaseModel):
    """A step a rollback would undo, as its checkpoint says."""

    step_id: str
    compensation: str | None
    """How it is undone, or why it cannot be."""


class RollbackReach(BaseModel):
    """What a rollback to a checkpoint would undo: the steps of the checkpoints after it,
    those not undone already; its `undoes` and `blocking` name the latest ones only."""

    later: int
    """Checkpoints after it: with none, a rollback here has nothing to go back over."""
    steps: int
    """Steps a rollback here would undo."""
    undoes: list[UndoneStep]
    """The latest of them, newest first (the order they are undone in), at most ten."""
    file_changes: int
    """Files those steps created, modified or deleted (counted per step)."""
    blocking: int
    """Irreversible steps after it: a rollback here cannot pass them."""
    blocking_steps: list[str]
    """The latest of them, newest first, at most ten."""


class CheckpointAt(BaseModel):
    """A checkpoint with where it is in the session's list and what a rollback to it does."""

    index: int
    """Its index in the order checkpoints were made."""
    checkpoint: CheckpointState
    step_status: StepStatus | None
    """The status of the step it was made after, now (undone, say); None: no such step."""
    workspace_lost: str | None
    """Why its workspace snapshot cannot be restored; None: it can be, or it has none."""
    rollback: RollbackReach


class CheckpointPage(BaseModel):
    """Checkpoints from `offset` on, oldest first."""

    total: int
    offset: int
    items: list[CheckpointAt]


class ThoughtPage(BaseModel):
    """Thoughts from `offset` on, in the order they were recorded."""

    total: int
    offset: int
    items: list[ThoughtState]


class _Indexed:
    """A state's steps and calls with their indexes, worked out once per request."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.positions = {step_id: index for index, step_id in enumerate(state.steps)}
        self.calls = {call_id: index for index, call_id in enumerate(state.calls)}
        self.now = datetime.now(UTC)

    def at(self, step: StepState) -> StepAt:
        call = self.calls.get(step.call_id) if step.call_id else None
        return StepAt(
            position=self.positions[step.id],
            call_index=call,
            server=server_of(step.tool),
            approval_wait_ms=self._waited(step),
            step=step,
        )

    def _waited(self, step: StepState) -> float | None:
        request = step.approval_request_id
        approval = self.state.approvals.get(request) if request else None
        if approval is None:
            return None
        until = approval.decided_at or self.now
        return max(0.0, (until - approval.requested_at).total_seconds() * 1000)


def server_of(tool: str) -> str:
    """The server of a tool by its registry name (`<server>__<name>` for an MCP server's)."""
    server, separator, _ = tool.partition(MCP_NAME_SEPARATOR)
    return server if separator and server else BUILTIN_SERVER


def overview_of(snapshot: SessionSnapshot) -> SessionOverview:
    state = snapshot.state
    steps = state.steps.values()
    light = dataclasses.replace(
        state,
        steps=Table(),
        calls=Table(),
        checkpoints=state.checkpoints[-LATEST:],
        thoughts=state.thoughts[-LATEST:],
    )
    return SessionOverview(
        state=light,
        last_seq=snapshot.last_seq,
        steps_total=len(state.steps),
        steps_by_status=dict(Counter(step.status for step in steps)),
        tools=dict(Counter(step.tool for step in steps)),
        calls_total=len(state.calls),
        steps_underway=any(
            step.status in IN_FLIGHT_STEPS or step.status == "pending" or step.retry_at
            for step in steps
        ),
        checkpoints_total=len(state.checkpoints),
        thoughts_total=len(state.thoughts),
    )


def checkpoints_from(state: SessionState, offset: int, limit: int) -> list[CheckpointAt]:
    """Checkpoints `offset` to `offset + limit`, each with what a rollback to it would undo:
    worked out from the newest checkpoint back to `offset` in one pass, so a page costs the
    checkpoints after it, never the whole state."""
    checkpoints = state.checkpoints
    end = min(len(checkpoints), offset + limit)
    reach = _Reach()
    page: list[CheckpointAt] = []
    indexes = range(len(checkpoints) - 1, offset - 1, -1)
    for index, checkpoint in zip(indexes, reversed(checkpoints[offset:]), strict=True):
        step = state.steps.get(checkpoint.step_id)
        if index < end:
            snapshot = checkpoint.snapshot_id
            page.append(
                CheckpointAt(
                    index=index,
                    checkpoint=checkpoint,
                    step_status=step.status if step else None,
                    workspace_lost=state.unrestorable_snapshots.get(snapshot) if snapshot else None,
                    rollback=reach.model(),
                )
            )
        reach.back_over(checkpoint, undone=step is not None and step.status == "undone")
    page.reverse()
    return page


@dataclasses.dataclass
class _Reach:
    """A rollback's reach, added to as it goes back over one checkpoint after another."""

    later: int = 0
    steps: int = 0
    undoes: list[UndoneStep] = dataclasses.field(default_factory=list[UndoneStep])
    file_changes: int = 0
    blocking: int = 0
    blocking_steps: list[str] = dataclasses.field(default_factory=list[str])

    def back_over(self, checkpoint: CheckpointState, *, undone: bool) -> None:
        self.later += 1
        if not undone:
            self.steps += 1
            if len(self.undoes) < NAMED:
                step = UndoneStep(step_id=checkpoint.step_id, compensation=checkpoint.compensation)
                self.undoes.append(step)
            if changes := checkpoint.changes:
                self.file_changes += (
                    len(changes.created)
                    + len(changes.modified)
                    + len(changes.deleted)
                    + changes.unlisted
                )
        if not checkpoint.reversible:
            self.blocking += 1
            if len(self.blocking_steps) < NAMED:
                self.blocking_steps.append(checkpoint.step_id)

    def model(self) -> RollbackReach:
        return RollbackReach(
            later=self.later,
            steps=self.steps,
            undoes=list(self.undoes),
            file_changes=self.file_changes,
            blocking=self.blocking,
            blocking_steps=list(self.blocking_steps),
        )


AtSeq = Annotated[
    int | None, Query(ge=1, description="The session as it was after this stream sequence")
]


async def snapshot_at(
    request: Request, tenant: str, session_id: str, at_seq: int | None
) -> SessionSnapshot:
    """The session now (kept for the next read), or folded up to `at_seq` (time travel)."""
    if at_seq is None:
        return await _latest(request).load(tenant, session_id)
    return await load_session(request.app.state.states, tenant, session_id, at_seq=at_seq)


@router.get("/sessions/{session_id}/overview")
async def session_overview(
    session_id: SessionPath, principal: Viewer, request: Request, at_seq: AtSeq = None
) -> SessionOverview:
    """The session without its steps: status, plan facts, approvals, rollbacks, counts of
    steps by status and tool, its latest checkpoints and thoughts; as it was after `at_seq`
    when given."""
    return overview_of(await snapshot_at(request, principal.tenant, session_id, at_seq))


@router.get("/sessions/{session_id}/summary")
async def session_summary(
    session_id: SessionPath, principal: Viewer, request: Request
) -> SessionSummary:
    """The session's line of the list, from its log now: where the list (read from a
    projection that trails the stream) is behind an event heard, the line as it is."""
    snapshot = await _latest(request).load(principal.tenant, session_id)
    return summary_of(snapshot.state, snapshot.last_seq)


def rows_of(
    steps: list[StepState], positions: dict[str, int], fold: int, unfolded: set[str]
) -> list[StepState | StepRun]:
    """The steps as rows: each run of at least `fold` succeeded steps (0: none) in one row,
    unless the run's first step is `unfolded`."""
    rows: list[StepState | StepRun] = []
    run: list[StepState] = []

    def close_run() -> None:
        if fold and len(run) >= fold and run[0].id not in unfolded:
            first = run[0].id
            rows.append(
                StepRun(first=first, last=run[-1].id, steps=len(run), position=positions[first])
            )
        else:
            rows.extend(run)
        run.clear()

    for step in steps:
        if step.status == "succeeded":
            run.append(step)
            continue
        close_run()
        rows.append(step)
    close_run()
    return rows


@router.get("/sessions/{session_id}/steps")
async def session_steps(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    part: PartQuery,
    fold: Annotated[
        int,
        Query(ge=0, le=1_000_000, description="Fold runs of this many succeeded steps or more"),
    ] = 0,
    unfold: Annotated[
        list[str], Query(description="Runs (named by their first step) to leave unfolded")
    ] = [],  # noqa: B006 - FastAPI copies it
) -> StepPage:
    """The session's steps in plan order, from `offset`, of those matching the filter; with
    `fold`, each run of succeeded steps at least that long counts as one row."""
    state = (await _latest(request).load(principal.tenant, session_id)).state
    indexed = _Indexed(state)
    chosen = [step for step in state.steps.values() if part.matches(step)]
    rows = rows_of(chosen, indexed.positions, fold, set(unfold))
    items = [
        row if isinstance(row, StepRun) else indexed.at(row)
        for row in rows[part.offset : part.offset + part.limit]
    ]
    return StepPage(total=len(rows), offset=part.offset, items=items)


@router.get(
    "/sessions/{session_id}/steps/{step_id}",
    responses={404: {"model": ProblemDetails, "description": "No such session or step"}},
)
async def session_step(
    session_id: SessionPath, step_id: str, principal: Viewer, request: Request
) -> StepAt:
    """One step, with its position in the plan (to jump to it)."""
    state = (await _latest(request).load(principal.tenant, session_id)).state
    step = state.steps.get(step_id)
    if step is None:
        raise not_found(f"session {session_id} has no step {step_id[:128]}")
    return _Indexed(state).at(step)


@router.get("/sessions/{session_id}/calls")
async def session_calls(
    session_id: SessionPath, principal: Viewer, request: Request, part: PartQuery
) -> CallPage:
    """The session's tool calls in the order they were scheduled, from `offset`, of those
    whose step matches the filter; each with its step as it is now."""
    state = (await _latest(request).load(principal.tenant, session_id)).state
    indexed = _Indexed(state)
    chosen = [
        (index, call_id, state.steps[step_id])
        for index, (call_id, step_id) in enumerate(state.calls.items())
        if step_id in state.steps and part.matches(state.steps[step_id])
    ]
    items = [
        CallAt(index=index, call_id=call_id, latest=step.call_id == call_id, step=indexed.at(step))
        for index, call_id, step in chosen[part.offset : part.offset + part.limit]
    ]
    return CallPage(total=len(chosen), offset=part.offset, items=items)


@router.get("/sessions/{session_id}/rollback-points")
async def session_rollback_points(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    offset: Offset = 0,
    limit: Limit = 100,
) -> CheckpointPage:
    """The session's checkpoints in the order they were made, from `offset`, each with
    what a rollback to it would undo now (the steps after it, the latest named): a page of
    `GET /sessions/{id}/checkpoints`, for a view of a long session."""
    state = (await _latest(request).load(principal.tenant, session_id)).state
    items = checkpoints_from(state, offset, limit)
    return CheckpointPage(total=len(state.checkpoints), offset=offset, items=items)


@router.get("/sessions/{session_id}/thoughts")
async def session_thoughts(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    offset: Offset = 0,
    limit: Limit = 100,
) -> ThoughtPage:
    """The planner's thoughts in the order they were recorded, from `offset` (the overview
    carries only the latest)."""
    thoughts = (await _latest(request).load(principal.tenant, session_id)).state.thoughts
    items = list(thoughts[offset : offset + limit])
    return ThoughtPage(total=len(thoughts), offset=offset, items=items)


@router.get("/sessions/{session_id}/log")
async def session_log(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    after_seq: Annotated[int, Query(ge=0, description="Events after this stream sequence")] = 0,
    limit: Limit = 100,
) -> EventPage:
    """The session's events after a sequence, oldest first, at most `limit`: page on with
    the last item's `seq` while `more`. A page reads only what it holds, however long the
    session."""
    store = _latest(request).store
    last_seq = await store.last_seq(principal.tenant, session_id)
    if last_seq == 0:
        raise not_found(f"no session {session_id}")
    if after_seq > last_seq:
        raise _past_the_end("after_seq", after_seq, last_seq)
    stored, more = await store.read_page(
        principal.tenant, session_id, after_seq=after_seq, limit=limit, known_seq=last_seq
    )
    items = [LoggedEvent(seq=s.seq, event=s.event) for s in stored]
    # Events stored since the session's end was looked up are in the page all the same.
    last = max(last_seq, items[-1].seq) if items else last_seq
    return EventPage(items=items, last_seq=last, more=more)


@router.get("/sessions/{session_id}/changes")
async def session_changes(
    session_id: SessionPath,
    principal: Viewer,
    request: Request,
    since: Annotated[int, Query(ge=0, description="A stream sequence an earlier answer reflected")],
) -> SessionChanges:
    """The overview now and the steps the events after `since` touched, as they are now;
    `reset` when too much changed to say step by step."""
    latest = _latest(request)
    snapshot = await latest.load(principal.tenant, session_id)
    if since > snapshot.last_seq:
        raise _past_the_end("since", since, snapshot.last_seq)
    overview = overview_of(snapshot)
    events = await latest.store.read_all(
        principal.tenant, session_id, after_seq=since, up_to_seq=snapshot.last_seq
    )
    changed = [touched(stored.event.data) for stored in events]
    if len(events) > MOST_CHANGES or any(rows.every_row for rows in changed):
        return SessionChanges(since=since, overview=overview, reset=True, steps=[])
    state = snapshot.state
    indexed = _Indexed(state)
    ids = dict.fromkeys(step_id for rows in changed for step_id in rows.steps)
    steps = [indexed.at(state.steps[step_id]) for step_id in ids if step_id in state.steps]
    return SessionChanges(since=since, overview=overview, reset=False, steps=steps)


def _past_the_end(name: str, seq: int, last_seq: int) -> Exception:
    message = f"{seq} is past the session's last event ({last_seq})"
    return invalid([FieldProblem(field=f"query.{name}", message=message)])
