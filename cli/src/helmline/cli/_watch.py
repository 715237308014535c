"""`run --wait`: a live view of a session's steps while it runs."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from helmline.cli._session_view import approvals_table, decide_command, session_panel
from helmline.contracts import SessionState

FINAL_ROWS = 100
"""The most steps the view left when following ends lists (those not succeeded first):
`show` lists every step, and a table of thousands takes seconds to draw."""


class SessionProgress:
    """Redraws the session's steps as the follower hands on states (a few times a second at
    most); off a terminal, prints the last view once."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._seen = -1
        self._state: SessionState | None = None

    def __enter__(self) -> SessionProgress:
        self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._state is not None:
            # Drawn once more, off a terminal the only time: while live, the steps listed
            # were only as many as the screen has lines.
            self._live.update(_view(self._state, rows=FINAL_ROWS))
        self._live.stop()

    def update(self, state: SessionState) -> None:
        if state.event_count == self._seen:
            return
        self._seen = state.event_count
        self._state = state
        if not self._console.is_terminal or self._console.is_dumb_terminal:
            return  # Nothing is drawn until the end: building a view would be wasted.
        # A live view is cut to the screen's height, so steps past it would be built,
        # rendered and cut again at every redraw, a long plan's thousands of them.
        self._live.update(_view(state, rows=self._console.height), refresh=True)


def _view(state: SessionState, *, rows: int) -> RenderableType:
    parts = [session_panel(state, full=False, rows=rows)]
    if state.pending_approvals:
        parts.append(approvals_table(state.pending_approvals))
        parts.append(Text(f"decide with: {decide_command(state)}", style="bold yellow"))
    return Group(*parts)
