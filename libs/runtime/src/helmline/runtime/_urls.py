"""Server addresses as they may be shown: without the credentials they may carry."""

from __future__ import annotations

import re

_CREDENTIALS = re.compile(r"(?<=://)[^/@\s,]*@")


def without_credentials(url: str) -> str:
    """`url` (or a comma-separated list of them, as NATS takes) without `user:password@`.

    Stack records keep the NATS admin's and PostgreSQL's passwords in their URLs; anything
    printed (status, errors, logs) shows the address only.
    """
    return _CREDENTIALS.sub("", url)
