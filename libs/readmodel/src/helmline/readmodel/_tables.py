"""The read model's tables: each one's name, columns and key, declared once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Table:
    """One table of the read model, as the migrations create it."""

    name: str
    columns: tuple[str, ...]
    """Every column, in the order the state service writes a row's values."""
    key: tuple[str, ...]
    """The primary key: tenant and session id, then the column naming a row within its
    session (none for `sessions`). The first columns, so a row's key is its first values."""
    json_columns: frozenset[str] = frozenset()
    """Columns of type jsonb (a query returns them as JSON text)."""

    def __post_init__(self) -> None:
        if self.columns[: len(self.key)] != self.key:
            raise ValueError(f"{self.name}: the key {self.key} must be its first columns")
        if not self.json_columns <= set(self.columns):
            raise ValueError(f"{self.name}: jsonb columns {self.json_columns} not all columns")

    @property
    def row_key(self) -> str:
        """The column naming a row within its session (a session's own row: its id)."""
        return self.key[-1]

    def listing(self, columns: tuple[str, ...]) -> str:
        """`columns` as a SELECT list; a name that is not a column of the table fails (at
        import, where a module builds its queries), not the query in production."""
        unknown = [column for column in columns if column not in self.columns]
        if unknown:
            raise ValueError(f"{self.name} has no column {', '.join(unknown)}")
        return ", ".join(columns)


SESSIONS = Table(
    "sessions",
    (
        "tenant",
        "session_id",
        "status",
        "goal",
        "mode",
        "requested_by",
        "started_at",
        "ended_at",
        "updated_at",
        "steps_total",
        "steps_succeeded",
        "steps_failed",
        "pending_approvals",
        "checkpoints",
        "outcome",
        "model_calls",
        "tokens_used",
        "cost_usd",
        "event_count",
        "last_seq",
    ),
    key=("tenant", "session_id"),
)
STEPS = Table(
    "steps",
    (
        "tenant",
        "session_id",
        "step_id",
        "position",
        "tool",
        "status",
        "risk",
        "attempts",
        "call_id",
        "output",
        "error",
        "reason",
        "scheduled_at",
        "finished_at",
        "duration_ms",
        "retry_at",
    ),
    key=("tenant", "session_id", "step_id"),
    json_columns=frozenset({"output", "error"}),
)
APPROVALS = Table(
    "approvals",
    (
        "tenant",
        "session_id",
        "request_id",
        "step_id",
        "tool",
        "risk",
        "status",
        "reason",
        "expires_at",
        "decided_by",
        "decided_at",
        "requested_at",
    ),
    key=("tenant", "session_id", "request_id"),
    json_columns=frozenset({"decided_by"}),
)
CHECKPOINTS = Table(
    "checkpoints",
    (
        "tenant",
        "session_id",
        "checkpoint_id",
        "step_id",
        "at_seq",
        "reversible",
        "compensation",
        "created_at",
    ),
    key=("tenant", "session_id", "checkpoint_id"),
)

TABLES: tuple[Table, ...] = (SESSIONS, STEPS, APPROVALS, CHECKPOINTS)
"""The projected tables (not `schema_migrations`), a session's own row first."""
