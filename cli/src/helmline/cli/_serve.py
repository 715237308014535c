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
    module = importlib.import_module(entry)
    main = getattr(module, "main", None)
    if not callable(main):
        raise CliError(f"{entry} has no main() to run")
    result = cast(Callable[[], object], main)()
    return result if isinstance(result, int) else 0
