"""How long an HTTP server asks its clients to wait before trying again."""

from __future__ import annotations

import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait: `retry-after-ms` (model providers send it), else
    `Retry-After` in seconds or as an HTTP date; None when it asks nothing readable.

    `headers` must look names up case-insensitively, as httpx's do.
    """
    if "retry-after-ms" in headers:
        try:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
