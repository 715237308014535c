"""`helmline workspace SESSION ls|cat|export`: what an agent's workspace held, now or at any
checkpoint, read from the snapshots in the object store (never from the sandbox's disk)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant
from helmline.cli._running import attempt, run_async

if TYPE_CHECKING:
    from helmline.cli._workspace_view import Chosen
    from helmline.sandbox import Manifest, WorkspaceSnapshots

app = typer.Typer(
    help="A session's workspace, now or at a checkpoint: ls, cat, export.",
    no_args_is_help=True,
)

At = Annotated[
    str | None,
    typer.Option(
        "--at", help="A checkpoint id (or snapshot id) of the session; default: its latest state."
    ),
]


@dataclass(frozen=True, slots=True)
class _Session:
    data_dir: Path | None
    tenant: str
    session_id: str


@app.callback()
def workspace(ctx: typer.Context, session: SessionId) -> None:
    """Read a session's workspace as the sandbox snapshotted it."""
    ctx.obj = session


def _session(ctx: typer.Context, tenant: str, data_dir: Path | None) -> _Session:
    from helmline.cli._intents import check_identifiers

    session_id: str = ctx.obj
    attempt(lambda: check_identifiers(tenant, session_id))
    return _Session(data_dir, tenant, session_id)


@app.command()
def ls(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(help="A folder or file in the workspace.")] = ".",
    at: At = None,
    as_json: Json = False,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """List a folder of the workspace (mode, size, path)."""
    from helmline.cli._workspace_view import entry_line, listed, normal_path

    relative = attempt(lambda: normal_path(path))
    session = _session(ctx, tenant, data_dir)

    async def read() -> tuple[Chosen, Manifest]:
        async with _workspace(session, at) as (chosen, manifest, _):
            return chosen, manifest

    chosen, manifest = run_async(read())
    entries = attempt(lambda: listed(manifest, relative))
    if as_json:
        found = [asdict(entry) for entry in entries]
        typer.echo(json.dumps({"snapshot_id": chosen.snapshot_id, "entries": found}))
        return
    for entry in entries:
        typer.echo(entry_line(entry))


@app.command()
def cat(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(help="A file in the workspace.")],
    at: At = None,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Print a file of the workspace, byte for byte."""
    from helmline.cli._workspace_view import file_entry, normal_path

    relative = attempt(lambda: normal_path(path))
    session = _session(ctx, tenant, data_dir)

    async def read() -> bytes:
        async with _workspace(session, at) as (_, manifest, snapshots):
            return await snapshots.blob(file_entry(manifest, relative).sha256)

    typer.echo(run_async(read()), nl=False)


@app.command()
def export(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="Where to write it: a new or empty folder.")],
    at: At = None,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Write the workspace into a folder: files, folders, links and modes as they were."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        attempt(lambda: _refuse(f"{directory} is not an empty folder: export needs one"))
    session = _session(ctx, tenant, data_dir)

    async def write() -> tuple[Chosen, Manifest]:
        async with _workspace(session, at) as (chosen, _, snapshots):
            restored = await snapshots.restore(
                directory, session.tenant, session.session_id, chosen.snapshot_id
            )
            return chosen, restored

    chosen, manifest = run_async(write())
    files = [entry for entry in manifest if entry.kind == "file"]
    typer.echo(
        f"exported the workspace {chosen.point} ({len(files)} files, "
        f"{sum(entry.size for entry in files)} bytes; {chosen.snapshot_id}) to {directory}"
    )


def _refuse(message: str) -> None:
    raise CliError(message, exit_code=2)


@asynccontextmanager
async def _workspace(
    session: _Session, at: str | None
) -> AsyncIterator[tuple[Chosen, Manifest, WorkspaceSnapshots]]:
    """The snapshot chosen for `at`, its manifest, and the store to read its files from."""
    from helmline.cli._connection import connect, stack_nats_url
    from helmline.cli._settings import load_settings
    from helmline.cli._workspace_view import choose_snapshot
    from helmline.sandbox import SnapshotMissing, WorkspaceSnapshots

    url = stack_nats_url(load_settings(data_dir=session.data_dir))
    async with connect(url) as log:
        events = await log.store.read_all(session.tenant, session.session_id)
        if not events:
            raise CliError(f"no session {session.session_id} in tenant {session.tenant!r}")
        chosen = choose_snapshot(events, at)
        # Only reads: the size cap applies to taking snapshots.
        snapshots = WorkspaceSnapshots(log.js, max_bytes=0)
        try:
            manifest = await snapshots.manifest(
                session.tenant, session.session_id, chosen.snapshot_id
            )
            yield chosen, manifest, snapshots
        except SnapshotMissing as error:
            raise CliError(f"the workspace {chosen.point} cannot be read: {error}") from error
