"""The read model's PostgreSQL tables, one contract between the state service, which
migrates and writes them (a projection of the log), and the API, which only reads them.

Pure data: names, columns, keys and the migrations that create them; each side brings its
own database client. docs/read-model.md describes the tables and their guarantees.
"""

from helmline.readmodel._migrations import MIGRATIONS, OPEN
from helmline.readmodel._tables import APPROVALS, CHECKPOINTS, SESSIONS, STEPS, TABLES, Table

__all__ = [
    "APPROVALS",
    "CHECKPOINTS",
    "MIGRATIONS",
    "OPEN",
    "SESSIONS",
    "STEPS",
    "TABLES",
    "Table",
]
