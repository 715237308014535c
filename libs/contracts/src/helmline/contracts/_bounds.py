"""Bounded input: how much of a value it refuses an error may quote back.

An error names what was wrong and shows enough of the value to recognise it, never the whole
of it: the input may be large (an answer the size of the request is a cost paid twice), or
secret (a key pasted where a name was due), and errors reach logs and terminals.
"""

from __future__ import annotations

QUOTED_BYTES = 200
"""The most of a refused value an error quotes."""


def cut(text: str, limit: int = QUOTED_BYTES) -> str:
    """The text as an error may show it: its first `limit` bytes, and how many more it has."""
    raw = text.encode(errors="replace")
    if len(raw) <= limit:
        return text
    head = raw[:limit].decode(errors="ignore")  # Not half a character.
    return f"{head}… ({len(raw) - len(head.encode())} more bytes)"


def quoted(value: str | bytes, limit: int = QUOTED_BYTES) -> str:
    """The start of a value, quoted as Python writes a string: at most `limit` bytes of it,
    and how many more bytes it has."""
    raw = value.encode(errors="replace") if isinstance(value, str) else value
    head = raw[:limit].decode(errors="replace")
    more = len(raw) - limit
    return repr(head) + (f" (and {more} more bytes)" if more > 0 else "")


def bounded_message(message: str, value: object) -> str:
    """A validator's message with the value it quotes (as is or as its repr) cut to
    `QUOTED_BYTES`: validators quote what they refuse whole, however long."""
    for shown in dict.fromkeys((repr(value), str(value))):
        if len(shown.encode(errors="replace")) > QUOTED_BYTES and shown in message:
            return message.replace(shown, cut(shown))
    return message
