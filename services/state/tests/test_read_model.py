"""The PostgreSQL read model equals the fold of every session's log, even across an outage."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    EXAMPLE_PAYLOADS,
    OPEN_STATUSES,
    READ_MODEL_CONSUMER,
    STATE_CONSUMER,
    Actor,
    ApprovalGranted,
    ApprovalRequested,
    CheckpointCreated,
    CompensationCompleted,
    CompensationScheduled,
    ConsumerSpec,
    Event,
    ModelExchangeRecorded,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    RollbackFailed,
    RollbackRequested,
    SessionCompleted,
    SessionStarted,
    SessionState,
    StepRetryDeferred,
    StepScheduled,
    ThoughtRecorded,
    ToolCallCompleted,
    ToolCallFailed,
    ToolError,
    event_type_filter,
    fold,
    new_event,
    tenant_filter,
)
from helmline.runtime import (
    Delivery,
    EventStore,
    FoldedStates,
    ServiceHost,
    ServiceMetrics,
    SessionCache,
)
from helmline.runtime.testing import eventually
from helmline.state import (
    RebuildError,
    caught_up,
    read_model_differences,
    rebuild_read_model,
)
from helmline.state.__main__ import setup_state
from helmline.state._projection import ProjectionHandler, ReadModel
from helmline.state._settings import StateSettings
from helmline.state._waiting import WaitingCount

ANA = Actor(id="ana", roles=("approver",))
# A model's answer, with what it cost: the sessions row adds it up.
(THINKING,) = (p for p in EXAMPLE_PAYLOADS if isinstance(p, ModelExchangeRecorded))


RETRY_AT = datetime(2030, 1, 1, tzinfo=UTC)


def _session(tenant: str, number: int) -> list[Event]:
    """A session with steps that succeed and fail, an approval and checkpoints."""
    steps = (PlanStep(id="a", tool="echo"), PlanStep(id="b", tool="run_command", depends_on=("a",)))
    started = new_event(
        SessionStarted(goal=f"goal {number}", requested_by=ANA),
        tenant=tenant,
        session_id=f"s{number}",
        source="test",
    )
    events = [
        started,
        started.derive(THINKING, source="test"),
        started.derive(PlanProposed(revision=1, steps=steps), source="test"),
        started.derive(PlanApproved(revision=1, approved_by=ANA), source="test"),
        started.derive(StepScheduled(step_id="a", call_id="a.1", tool="echo"), source="test"),
        started.derive(
            ToolCallCompleted(
                step_id="a", call_id="a.1", tool="echo", output={"n": number}, duration_ms=1.5
            ),
            source="test",
        ),
        started.derive(
            CheckpointCreated(checkpoint_id="cp-a", step_id="a", at_seq=5), source="test"
        ),
    ]
    if number % 2:
        events += [
            started.derive(
                StepScheduled(step_id="b", call_id="b.1", tool="run_command"), source="test"
            ),
            started.derive(
                ApprovalRequested(
                    request_id="b.1",
                    scope="step",
                    step_id="b",
                    call_id="b.1",
                    tool="run_command",
                    risk="high",
                    reason="ask",
                    expires_at=datetime.now(UTC) + timedelta(minutes=10),
                ),
                source="test",
            ),
        ]
    if number % 3 == 0:
        events += [
            started.derive(ApprovalGranted(request_id="b.1", decided_by=(ANA,)), source="test"),
            started.derive(
                ToolCallFailed(
                    step_id="b",
                    call_id="b.1",
                    tool="run_command",
                    error=ToolError(kind="execution", message="no"),
                ),
                source="test",
            ),
            started.derive(
                StepRetryDeferred(
                    step_id="b", call_id="b.1", retry_at=RETRY_AT, reason="the server is busy"
                ),
                source="test",
            ),
        ]
    if number % 5 == 0:
        events.append(started.derive(SessionCompleted(summary="done"), source="test"))
    return events


def _consumers(tenant: str) -> tuple[ConsumerSpec, ConsumerSpec]:
    checkpoints = STATE_CONSUMER.model_copy(
        update={
            "durable": f"checkpoints-{tenant}",
            "filter_subjects": (event_type_filter(ToolCallCompleted.TYPE, tenant),),
        }
    )
    read_model = READ_MODEL_CONSUMER.model_copy(
        update={
            "durable": f"read-model-{tenant}",
            "filter_subjects": (tenant_filter(tenant),),
        }
    )
    return checkpoints, read_model


@asynccontextmanager
async def state_service(nats_url: str, database_url: str, tenant: str) -> AsyncIterator[None]:
    settings = StateSettings(nats_url=nats_url, database_url=database_url, shutdown_grace_s=1)
    async with ServiceHost("state", settings) as host:
        await setup_state(settings, *_consumers(tenant))(host)
        yield


async def _rows(database_url: str, table: str, tenant: str) -> list[dict[str, Any]]:
    connection = await asyncpg.connect(database_url)
    try:
        records = await connection.fetch(
            f"SELECT * FROM {table} WHERE tenant = $1",
            tenant,
        )
    finally:
        await connection.close()
    return [dict(record) for record in records]


async def _append_and_project(
    store: EventStore, database_url: str, tenant: str, numbers: range
) -> None:
    """Append sessions `numbers` and wait until the read model has every session so far."""
    for number in numbers:
        await store.append_all(_session(tenant, number))
    await eventually(
        lambda: caught_up(store, database_url, tenant, numbers.stop),
        timeout_s=60,
        what=f"the read model to catch up with {numbers.stop} sessions",
    )


async def _assert_rows_equal_the_fold(store: EventStore, database_url: str, tenant: str) -> None:
    sessions = {row["session_id"]: row for row in await _rows(database_url, "sessions", tenant)}
    steps = await _rows(database_url, "steps", tenant)
    approvals = await _rows(database_url, "approvals", tenant)
    checkpoints = await _rows(database_url, "checkpoints", tenant)
    for session_id, row in sessions.items():
        state: SessionState = fold(i.event for i in await store.read_all(tenant, session_id))
        assert row["status"] == state.status
        assert row["goal"] == state.goal
        assert row["started_at"] == state.started_at
        assert row["ended_at"] == state.ended_at
        assert row["event_count"] == state.event_count
        assert row["steps_total"] == len(state.steps)
        assert row["pending_approvals"] == len(state.pending_approvals)
        assert row["outcome"] == state.outcome
        assert (row["model_calls"], row["tokens_used"], row["cost_usd"]) == (
            state.model_calls,
            state.tokens_used,
            state.cost_usd,
        )
        assert row["cost_usd"] > 0
        mine = {s["step_id"]: s for s in steps if s["session_id"] == session_id}
        assert list(mine) == list(state.steps)
        for step_id, step in state.steps.items():
            assert mine[step_id]["status"] == step.status
            assert mine[step_id]["attempts"] == step.attempts
            assert mine[step_id]["retry_at"] == step.retry_at
            output = mine[step_id]["output"]
            assert (json.loads(output) if output else None) == step.output
            error = mine[step_id]["error"]
            assert (json.loads(error)["message"] if error else None) == (
                step.error.message if step.error else None
            )
        assert {
            a["request_id"]: a["status"] for a in approvals if a["session_id"] == session_id
        } == {key: value.status for key, value in state.approvals.items()}
        assert {c["checkpoint_id"] for c in checkpoints if c["session_id"] == session_id} == {
            c.checkpoint_id for c in state.checkpoints
        }


async def test_the_read_model_equals_the_fold_of_every_session(
    nats_url: str, database_url: str, store: EventStore, tenant: str
) -> None:
    async with state_service(nats_url, database_url, tenant):
        await _append_and_project(store, database_url, tenant, range(30))
    await _assert_rows_equal_the_fold(store, database_url, tenant)

    # What `helmline replay` reports: nothing, until a row is changed behind the log's back.
    state = fold(item.event for item in await store.read_all(tenant, "s3"))
    assert await read_model_differences(database_url, state) == []
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE steps SET status = 'pending' WHERE tenant = $1 AND session_id = 's3'"
            " AND step_id = 'a'",
            tenant,
        )
    finally:
        await connection.close()
    assert await read_model_differences(database_url, state) == [
        "steps.a.status: read model 'pending', log 'succeeded'"
    ]


ROLLBACK = {"rollback_id": "rb", "checkpoint_id": "cp-a"}
UNDO = {"rollback_id": "rb", "compensation_id": "rb.undo1", "step_id": "b"}
CHANGING_ROWS_THEY_DO_NOT_NAME: dict[str, list[Payload]] = {
    # The end withdraws the request still pending.
    "session end": [SessionCompleted(summary="done")],
    # The restore undoes both steps; the failed rollback after it rewrites no rows.
    "compensation of two steps": [
        RollbackRequested(**ROLLBACK, requested_by=ANA),
        CompensationScheduled(**UNDO, kind="restore_workspace", steps=("b", "a")),
        CompensationCompleted(**UNDO, steps=("b", "a")),
        RollbackFailed(**ROLLBACK, reason="an undo call was denied", undone_steps=("b", "a")),
    ],
}


@pytest.mark.parametrize("later", CHANGING_ROWS_THEY_DO_NOT_NAME, ids=str)
async def test_rows_changed_by_an_event_that_does_not_name_them_are_projected_again(
    nats_url: str, database_url: str, store: EventStore, tenant: str, later: str
) -> None:
    first = _session(tenant, 1)
    async with state_service(nats_url, database_url, tenant):
        await store.append_all(first)
        await eventually(
            lambda: caught_up(store, database_url, tenant, 1), timeout_s=60, what="the session"
        )
        before = (
            await _rows(database_url, "approvals", tenant),
            await _rows(database_url, "steps", tenant),
        )
        await store.append_all(
            [
                first[0].derive(payload, source="test", key=str(index))
                for index, payload in enumerate(CHANGING_ROWS_THEY_DO_NOT_NAME[later])
            ]
        )
        await eventually(
            lambda: caught_up(store, database_url, tenant, 1), timeout_s=60, what=later
        )
    after = (
        await _rows(database_url, "approvals", tenant),
        await _rows(database_url, "steps", tenant),
    )
    assert after != before
    await _assert_rows_equal_the_fold(store, database_url, tenant)


async def test_postgres_down_mid_run_loses_nothing(
    nats_url: str, store: EventStore, tenant: str, own_postgres: Any
) -> None:
    postgres = own_postgres
    async with state_service(nats_url, postgres.url, tenant):
        for number in range(5):
            await store.append_all(_session(tenant, number))
        await eventually(
            lambda: caught_up(store, postgres.url, tenant, 5),
            timeout_s=60,
            what="the first sessions projected",
        )
        postgres.stop()
        for number in range(5, 12):
            await store.append_all(_session(tenant, number))
        postgres.start()
        await eventually(
            lambda: caught_up(store, postgres.url, tenant, 12),
            timeout_s=90,
            what="the read model to catch up after the outage",
        )
    await _assert_rows_equal_the_fold(store, postgres.url, tenant)


async def _long_session(store: EventStore, tenant: str, thoughts: int) -> None:
    started = new_event(
        SessionStarted(goal="think a lot", requested_by=ANA),
        tenant=tenant,
        session_id="long",
        source="test",
    )
    await store.append(started)
    await asyncio.gather(
        *(
            store.append(
                started.derive(
                    ThoughtRecorded(kind="reasoning", text=f"{n}"), source="test", key=str(n)
                )
            )
            for n in range(thoughts)
        )
    )


async def test_rebuild_switches_to_the_fold_of_the_log_while_queries_keep_answering(
    own_log: tuple[str, EventStore], own_postgres: Any, tenant: str
) -> None:
    nats_url, store = own_log
    database_url = own_postgres.url
    async with state_service(nats_url, database_url, tenant):
        await _append_and_project(store, database_url, tenant, range(30))
        # Another tenant's events, which the (tenant-filtered) live consumer never sees, give
        # the rebuild enough to fold that queries can run while it does.
        await _long_session(store, f"{tenant}x", 3_000)
        reader = await asyncpg.connect(database_url)
        try:
            await reader.execute("CREATE ROLE api_reader")
            await reader.execute("GRANT SELECT ON sessions, steps, approvals TO api_reader")
            await reader.execute("UPDATE sessions SET goal = 'tampered' WHERE session_id = 's1'")

            progress: list[int] = []
            rebuilding = asyncio.create_task(
                rebuild_read_model(
                    store, database_url, progress=lambda done, end: progress.append(done)
                )
            )
            answers: list[tuple[int, int]] = []
            while not rebuilding.done():
                count = await reader.fetchval(
                    "SELECT count(*) FROM sessions WHERE tenant = $1", tenant
                )
                answers.append((len(progress), count))
            report = await rebuilding
            # The live service writes on into the new tables.
            await _append_and_project(store, database_url, tenant, range(30, 35))
            long_session = await reader.fetchval(
                "SELECT event_count FROM sessions WHERE tenant = $1", f"{tenant}x"
            )
            reader_may_select = await reader.fetchval(
                "SELECT has_table_privilege('api_reader', 'steps', 'SELECT')"
            )
            indexes = {
                r["indexname"]
                for r in await reader.fetch(
                    "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
                )
            }
            schemas = {r["nspname"] for r in await reader.fetch("SELECT nspname FROM pg_namespace")}
        finally:
            await reader.close()

    assert all(count == 30 for _, count in answers)
    assert any(0 < seen < len(progress) for seen, _ in answers), "no query during the build"
    assert report.events == report.last_seq > 3_001
    assert report.sessions == 31
    assert long_session == 3_001
    assert reader_may_select
    assert {"sessions_by_status", "approvals_pending"} <= indexes
    assert not {"helmline_rebuild", "helmline_retired"} & schemas
    await _assert_rows_equal_the_fold(store, database_url, tenant)
    state = fold(item.event for item in await store.read_all(tenant, "s1"))
    assert await read_model_differences(database_url, state) == []


async def test_one_rebuild_at_a_time(store: EventStore, database_url: str) -> None:
    other = await asyncpg.connect(database_url)
    try:
        await other.execute("SELECT pg_advisory_lock(7240532)")
        with pytest.raises(RebuildError, match="another rebuild"):
            await rebuild_read_model(store, database_url)
    finally:
        await other.close()


async def test_a_redelivery_gathered_after_newer_events_leaves_the_rows_at_the_newest(
    js: JetStreamContext, store: EventStore, database_url: str, tenant: str
) -> None:
    events = _session(tenant, 3)
    seqs = [(await store.append(event)).seq for event in events]
    model = ReadModel(database_url)
    projection = ProjectionHandler(SessionCache(FoldedStates(js, store)), model)
    try:
        first = [Delivery(e, seq, deliveries=1) for e, seq in zip(events, seqs, strict=True)]
        await projection.handle_gathered(first[:5])
        # The fifth event failed once and comes back after the newer ones, in one gathering.
        await projection.handle_gathered([*first[5:], Delivery(events[4], seqs[4], deliveries=2)])
    finally:
        await model.close()
    assert await caught_up(store, database_url, tenant, 1)
    await _assert_rows_equal_the_fold(store, database_url, tenant)


async def test_sessions_not_ended_and_approvals_waiting_are_counted_for_the_metrics(
    nats_url: str, database_url: str, store: EventStore, tenant: str
) -> None:
    model = ReadModel(database_url)
    metrics = ServiceMetrics("state")
    try:
        before = await model.waiting()  # Other tests' sessions share the database.
        async with state_service(nats_url, database_url, tenant):
            await _append_and_project(store, database_url, tenant, range(10))
        await WaitingCount(model, metrics, interval_s=60).count()
    finally:
        await model.close()
    states = [fold(_session(tenant, number)) for number in range(10)]
    added = Counter(state.status for state in states if not state.is_terminal)
    assert len(added) >= 2  # Several statuses,
    assert sum(added.values()) < 10  # and some sessions ended.
    samples = {
        (sample.name, sample.labels.get("status")): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
    }
    for status in OPEN_STATUSES:
        expected = before.sessions.get(status, 0) + added[status]
        assert samples["helmline_sessions_open", status] == expected, status
    asked = [a for state in states for a in state.approvals.values() if a.status == "pending"]
    assert asked
    waiting = before.approvals + len(asked)
    assert samples["helmline_approvals_waiting", None] == waiting
    oldest = min(a.requested_at for a in asked)
    if before.oldest_approval_at is not None:
        oldest = min(oldest, before.oldest_approval_at)
    age = samples["helmline_approval_oldest_waiting_seconds", None]
    assert age == pytest.approx((datetime.now(UTC) - oldest).total_seconds(), abs=5)
