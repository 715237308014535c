"""How bytes a tool produced become text of bounded size."""

from __future__ import annotations

import codecs


def cut_text(data: bytes, limit: int) -> tuple[str, bool]:
    """At most `limit` bytes of `data` as UTF-8 text, and whether anything was cut.

    Invalid bytes become U+FFFD; a character split by the cut is dropped rather than
    mangled.
    """
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data[:limit], final=False), True


def cut_marker(limit: int, total: int) -> str:
    """The note appended to output that was cut."""
    return f"\n[output cut: {total} bytes, the first {limit} kept]"
