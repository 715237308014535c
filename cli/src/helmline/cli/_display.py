"""What the terminal shows: startup progress and tables of the stack."""

from __future__ import annotations

import json
import time
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn
from rich.table import Table

from helmline.cli._record import LOGS_DIR, ComponentRecord, StackRecord
from helmline.cli._stack import ComponentStatus, Health, StackStatus
from helmline.runtime import RELAXED_RISK, without_credentials


def stdout() -> Console:
    return _console(stderr=False)


def stderr() -> Console:
    return _console(stderr=True)


def _console(*, stderr: bool) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        # Rich assumes 80 columns off a terminal, which folds every URL in a log or CI.
        console.width = 160
    return console


_HEALTH_STYLE: dict[Health, str] = {
    "healthy": "green",
    "unhealthy": "yellow",
    "stopped": "red",
}


class StartupProgress:
    """A live line per component while `up` works; a plain log when output is not a terminal."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓[/]"),
            TextColumn("[bold]{task.fields[step]:<14}[/]"),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, tuple[TaskID, float]] = {}

    def __enter__(self) -> StartupProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            for task in self._progress.tasks:
                if not task.finished:
                    self._progress.remove_task(task.id)
                    # Whatever had not finished is torn down with the rest.
                    self._console.print(f"[red]✗[/] [bold]{task.fields['step']:<14}[/] stopped")
        self._progress.stop()

    def begin(self, step: str, detail: str = "") -> None:
        task = self._progress.add_task(detail or "starting", step=step, total=1)
        self._tasks[step] = (task, time.monotonic())

    def done(self, step: str, detail: str = "") -> None:
        if step not in self._tasks:
            self.begin(step)
        task, began = self._tasks[step]
        elapsed = time.monotonic() - began
        self._progress.update(task, completed=1, description=f"{detail} [dim]({elapsed:.1f} s)[/]")

    def note(self, message: str) -> None:
        self._progress.console.print(f"[dim]{message}[/]")


def render_status(console: Console, status: StackStatus, *, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("component", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("restarts", justify="right", no_wrap=True)
    # Addresses are copied from here: wrapped whole, never cut short with an ellipsis.
    table.add_column("address", overflow="fold")
    for item in status.components:
        component = item.component
        table.add_row(
            component.name,
            f"[{_HEALTH_STYLE[item.health]}]{item.health}[/]",
            str(component.process.pid) if component.process else "external",
            _restarts(component),
            escape(without_credentials(component.address)),
        )
    console.print(table)
    for item in status.components:
        for topic, fact in item.about.items():
            # `sandbox: ...`, or with replicas `sandbox-2: ...`; other topics named as well.
            said = item.component.name + ("" if topic == item.component.service else f" {topic}")
            console.print(f"{said}: [{_about_style(fact)}]{escape(fact)}[/]")
    if status.record is not None:
        console.print(f"data folder: {status.data_dir}  (logs in {status.data_dir / LOGS_DIR})")
        render_durability(console, status.record)
        if status.record.api_url:
            console.print(f"API: [bold]{status.record.api_url}[/]")


def _restarts(component: ComponentRecord) -> str:
    if component.restarts == 0:
        return ""
    last = f", last exit {component.last_exit_code}" if component.last_exit_code is not None else ""
    when = component.last_start.astimezone().strftime("%H:%M:%S") if component.last_start else "?"
    return f"{component.restarts} (at {when}{last})"


def render_durability(console: Console, record: StackRecord) -> None:
    """What an acknowledged event means in this stack; relaxed is a warning that says what
    it risks."""
    match record.durability:
        case "durable":
            console.print("durability: durable (every event is on disk before it is acknowledged)")
        case "relaxed":
            console.print(
                f"[yellow]durability: relaxed. Warning: {RELAXED_RISK}. "
                "Start with `--durability durable` (the default) for work you keep.[/]",
                highlight=False,
                soft_wrap=True,
            )
        case None:
            console.print(
                "durability: as the external NATS is configured (durable only with "
                "`jetstream { sync_interval: always }`)"
            )


def _about_style(fact: str) -> str:
    # An unconfined sandbox and a dead MCP server (the gateway puts each server's health
    # first) must not read like the other facts.
    if fact.startswith(("UNSANDBOXED", "dead")):
        return "bold red"
    if fact.startswith(("unresponsive", "degraded")):
        return "yellow"
    return "dim"


def status_json(status: StackStatus) -> str:
    return json.dumps(
        {
            "data_dir": str(status.data_dir),
            "running": status.running,
            "healthy": status.healthy,
            "api_url": status.record.api_url if status.record else None,
            "nats_url": without_credentials(status.record.nats_url) if status.record else None,
            "database_url": without_credentials(status.record.database_url)
            if status.record
            else None,
            "durability": status.record.durability if status.record else None,
            "components": [_component_json(item) for item in status.components],
        },
        indent=2,
    )


def _component_json(item: ComponentStatus) -> dict[str, object]:
    component = item.component
    return {
        "name": component.name,
        "kind": component.kind,
        "state": item.health,
        "pid": component.process.pid if component.process else None,
        "address": without_credentials(component.address),
        "health_port": component.health_port,
        "log": str(component.log) if component.log else None,
        "restarts": component.restarts,
        "last_exit_code": component.last_exit_code,
        "last_start": component.last_start.isoformat() if component.last_start else None,
        "about": dict(item.about),
    }
