"""The read model's schema, version by version: what creates the tables in `_tables`."""

from __future__ import annotations

OPEN = "status NOT IN ('completed', 'failed', 'cancelled')"
"""A session that has not ended (written out as the partial index's predicate, which a
query must repeat to use it)."""

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        tenant text NOT NULL,
        session_id text NOT NULL,
        status text NOT NULL,
        goal text NOT NULL,
        mode text NOT NULL,
        requested_by text,
        started_at timestamptz,
        ended_at timestamptz,
        updated_at timestamptz,
        steps_total integer NOT NULL,
        steps_succeeded integer NOT NULL,
        steps_failed integer NOT NULL,
        pending_approvals integer NOT NULL,
        checkpoints integer NOT NULL,
        outcome text NOT NULL,
        event_count integer NOT NULL,
        last_seq bigint NOT NULL,
        PRIMARY KEY (tenant, session_id)
    );
    CREATE INDEX sessions_by_status ON sessions (tenant, status, started_at);
    CREATE TABLE steps (
        tenant text NOT NULL,
        session_id text NOT NULL,
        step_id text NOT NULL,
        position integer NOT NULL,
        tool text NOT NULL,
        status text NOT NULL,
        risk text,
        attempts integer NOT NULL,
        call_id text,
        output jsonb,
        error jsonb,
        reason text,
        scheduled_at timestamptz,
        finished_at timestamptz,
        duration_ms double precision,
        PRIMARY KEY (tenant, session_id, step_id)
    );
    CREATE TABLE approvals (
        tenant text NOT NULL,
        session_id text NOT NULL,
        request_id text NOT NULL,
        step_id text,
        tool text,
        risk text NOT NULL,
        status text NOT NULL,
        reason text NOT NULL,
        expires_at timestamptz NOT NULL,
        decided_by jsonb NOT NULL,
        decided_at timestamptz,
        PRIMARY KEY (tenant, session_id, request_id)
    );
    CREATE INDEX approvals_pending ON approvals (tenant, status, expires_at);
    CREATE TABLE checkpoints (
        tenant text NOT NULL,
        session_id text NOT NULL,
        checkpoint_id text NOT NULL,
        step_id text NOT NULL,
        at_seq bigint NOT NULL,
        reversible boolean NOT NULL,
        compensation text,
        created_at timestamptz NOT NULL,
        PRIMARY KEY (tenant, session_id, checkpoint_id)
    );
    """,
    # 2: what a session's model calls cost.
    """
    ALTER TABLE sessions
        ADD COLUMN model_calls integer NOT NULL DEFAULT 0,
        ADD COLUMN tokens_used bigint NOT NULL DEFAULT 0,
        ADD COLUMN cost_usd double precision NOT NULL DEFAULT 0;
    """,
    # 3: when a step whose call failed is tried again, if not at once.
    """
    ALTER TABLE steps ADD COLUMN retry_at timestamptz;
    """,
    # 4: the sessions not ended yet, counted every few seconds across tenants.
    f"""
    CREATE INDEX sessions_open ON sessions (status) WHERE {OPEN};
    """,
    # 5: the requests waiting for a person, counted likewise, with the oldest's age (a
    # request's time asked is filled at its session's next event).
    """
    ALTER TABLE approvals ADD COLUMN requested_at timestamptz;
    CREATE INDEX approvals_waiting ON approvals (requested_at) WHERE status = 'pending';
    """,
)
"""Schema versions in order; version N is MIGRATIONS[N - 1]. Never edit one that shipped."""
