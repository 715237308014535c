"""`helmline serve <name>`: one service in the foreground, as deployments run it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from helmline.cli._catalogue import ServiceName
from helmline.cli._errors import CliError


def serve(service: ServiceName) -> int:
    """Run the service's `main()` and return its exit status."""
    entry = f"{service.module}.__main__"
    try:
        module = importlib.import_module(entry)
    except ModuleNotFoundError as error:
        # Only a missing entry point is the person's problem; a missing import inside the
        # service is a bug, and its traceback is the useful report.
        if error.name not in (entry, service.module):
            raise
        raise CliError(f"{service.value}: there is no {entry} to run ({error})") from error
    main = getattr(module, "main", None)
    if not callable(main):
        raise CliError(f"{entry} has no main() to run")
    result = cast(Callable[[], object], main)()
    return result if isinstance(result, int) else 0
