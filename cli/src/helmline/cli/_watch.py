"""`run --wait`: a live view of a session's steps while it runs."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from helmline.cli._session_view import approvals_table, decide_command, session_panel
from helmline.contracts import SessionState


class SessionProgress:
    """Redraws the session's steps at every event; off a terminal, prints the last view once."""

    def __init__(self, console: Console) -> None:
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._seen = -1

    def __enter__(self) -> SessionProgress:
        self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._live.stop()

    def update(self, state: SessionState) -> None:
        if state.event_count == self._seen:
            return
        self._seen = state.event_count
        parts = [session_panel(state, full=False)]
        if state.pending_approvals:
            parts.append(approvals_table(state.pending_approvals))
            parts.append(Text(f"decide with: {decide_command(state)}", style="bold yellow"))
        self._live.update(Group(*parts), refresh=True)
