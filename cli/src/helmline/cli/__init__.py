"""The `helmline` command: run the stack on one machine, serve one service, export contracts."""

from helmline.cli._app import app
from helmline.cli._errors import CliError, StartupError

__all__ = ["CliError", "StartupError", "app"]
