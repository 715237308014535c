"""`helmline events`: one session's events (`events SESSION`), or every session's, live
(`events tail`)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from helmline.cli._errors import CliError
from helmline.cli._options import DataDir, Json
from helmline.cli._running import attempt, nats_url, run_async
from helmline.cli._session_commands import events as session_events


class _SessionOrSubcommand(TyperGroup):
    """Reads `helmline events SESSION ...` as `helmline events session SESSION ...`, so the
    command of one session keeps its short form beside `tail`."""

    # `ctx` is Typer's own (vendored) click Context, which it does not export under a name.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] != "--help":
            args = ["session", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_SessionOrSubcommand,
    help="Events of the log: `events SESSION` (one session), `events tail` (every session, live).",
    no_args_is_help=True,
)
app.command("session")(session_events)


@app.command()
def tail(
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's sessions.")
    ] = None,
    event_type: Annotated[
        str | None,
        typer.Option(
            "--type", help="Only these event types: a type, or a pattern such as 'tool.call.*'."
        ),
    ] = None,
    from_seq: Annotated[
        int | None,
        typer.Option(
            "--from-seq",
            min=1,
            help="Start at this stream sequence (default: the next event appended).",
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many events.")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Print events of every session as they are appended, until Ctrl-C (or --count)."""
    from helmline.cli._connection import connect
    from helmline.cli._follow import tailing
    from helmline.cli._intents import check_identifiers
    from helmline.cli._session_view import event_json, event_line
    from helmline.contracts import event_type_filter, tenant_filter

    if tenant is not None:
        # Any valid session id: only the tenant is being checked.
        attempt(lambda: check_identifiers(tenant, "any"))
    if event_type is not None:
        attempt(lambda: check_type_pattern(event_type))
        subject = event_type_filter(event_type, tenant or "*")
    else:
        subject = tenant_filter(tenant or "*")
    url = nats_url(data_dir)

    async def follow() -> None:
        printed = 0
        async with connect(url) as log:
            start = from_seq or await log.store.log_end() + 1
            async with tailing(log.js, subject, from_seq=start) as feed:
                async for stored in feed:
                    event = stored.event
                    line = (
                        event_json(event)
                        if as_json
                        else f"{event.tenant}/{event.session_id}  {event_line(stored)}"
                    )
                    # Flushed per event: a pipe into another program sees each as it comes.
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                    printed += 1
                    if printed == count:
                        return

    run_async(follow(), interrupted="")


def check_type_pattern(pattern: str) -> None:
    """Refuse a type pattern that is not a subject pattern or that no event type matches."""
    from helmline.contracts import PAYLOAD_CLASSES

    tokens = pattern.split(".")
    malformed = any(
        not token or (("*" in token or ">" in token) and token not in ("*", ">"))
        for token in tokens
    ) or (">" in tokens[:-1])
    if malformed:
        raise CliError(
            f"invalid --type {pattern!r}: dot-separated words, '*' for one word,"
            " '>' (last) for the rest",
            exit_code=2,
        )
    if not any(_matches(tokens, payload.TYPE.split(".")) for payload in PAYLOAD_CLASSES):
        raise CliError(
            f"--type {pattern!r} matches no event type (see `libs/contracts/schema/index.json`)",
            exit_code=2,
        )


def _matches(pattern: list[str], words: list[Any]) -> bool:
    for position, token in enumerate(pattern):
        if token == ">":
            return len(words) > position
        if position >= len(words) or token not in ("*", words[position]):
            return False
    return len(pattern) == len(words)
