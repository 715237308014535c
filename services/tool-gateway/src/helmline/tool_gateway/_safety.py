"""Output safety: what a tool returned, made fit for a model to read. Pure.

Secrets are redacted, text that tries to instruct a model is neutralised (kept readable, but
marked as data, and hidden characters removed), and the whole is cut to a size cap with a
marker. The caller keeps the raw output for people allowed to see it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import JsonValue

REDACTED = "[REDACTED]"


def _luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


# Each pattern's secret is the whole match, or the group named `secret` where the context
# around it (a key name, a URL's user) is worth keeping.
_SECRETS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",
        r"\bgithub_pat_[A-Za-z0-9_]{22,}\b",
        r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}",
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
        r"\bAIza[0-9A-Za-z_-]{35}\b",
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        r"(?i)\bbearer\s+(?P<secret>(?!\[REDACTED\])[A-Za-z0-9._~+/-]{12,}=*)",
        r"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|"
        r"access[_-]?token|client[_-]?secret)[\"']?\s*[:=]\s*[\"']?"
        r"(?P<secret>(?!\[REDACTED\])[^\s\"',;&]{4,})",
        r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?P<secret>[^/\s@]+)@",
    )
)
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")

# Zero-width, bidirectional overrides, tag characters and C0/C1 controls other than
# tab and newlines: invisible to a person, read by a model.
_HIDDEN = re.compile(
    "[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
)
_ROLE_TOKENS = re.compile(
    r"<\|[A-Za-z_]{2,24}\|>|\[/?INST\]|<</?SYS>>|</?s>|<\|?(?:system|assistant|user)\|?>",
    re.IGNORECASE,
)
_INSTRUCTIONS = re.compile(
    r"(?im)(?:^[ \t#>*]*(?:system|assistant|developer)\s*(?:prompt)?\s*:)"
    r"|\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+)?"
    r"(?:previous|prior|above|earlier|preceding|system)\s+(?:instructions?|prompts?|messages?|"
    r"rules?|directions?)"
    r"|\byou\s+are\s+now\s+(?:a|an|in)\b"
    r"|\bnew\s+(?:system\s+)?instructions?\s*:"
)


@dataclass(frozen=True, slots=True)
class SafeOutput:
    """An output fit for a model, and what was done to it."""

    output: JsonValue
    redactions: int = 0
    neutralised: int = 0
    truncated: bool = False

    @property
    def changed(self) -> bool:
        """Whether the output differs from what the tool returned."""
        return bool(self.redactions or self.neutralised or self.truncated)


def make_safe(output: JsonValue, *, max_bytes: int) -> SafeOutput:
    """Redact secrets, neutralise instructions to models, then cut to `max_bytes` of JSON."""
    counts = [0, 0]

    def clean(text: str) -> str:
        text, redacted = redact_secrets(text)
        text, neutralised = neutralise_instructions(text)
        counts[0] += redacted
        counts[1] += neutralised
        return text

    cleaned = _map_strings(output, clean)
    capped, truncated = _cap(cleaned, max_bytes)
    return SafeOutput(capped, counts[0], counts[1], truncated)


def redact_secrets(text: str) -> tuple[str, int]:
    """The text with keys, tokens, credentials and card numbers replaced; how many."""
    count = 0

    def secret(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole_start = match.start()
            return (
                match.group(0)[: start - whole_start]
                + REDACTED
                + match.group(0)[end - whole_start :]
            )
        return REDACTED

    for pattern in _SECRETS:
        text = pattern.sub(secret, text)

    def card(match: re.Match[str]) -> str:
        nonlocal count
        digits = re.sub(r"\D", "", match.group(0))
        if 13 <= len(digits) <= 19 and _luhn_valid(digits):
            count += 1
            return REDACTED
        return match.group(0)

    return _CARD.sub(card, text), count


def neutralise_instructions(text: str) -> tuple[str, int]:
    """The text with hidden characters removed, model role tokens replaced and phrases that
    address the model marked as quoted data; how many places were changed."""
    text, hidden = _HIDDEN.subn("", text)
    text, tokens = _ROLE_TOKENS.subn("[role marker removed]", text)
    text, phrases = _INSTRUCTIONS.subn(
        lambda match: f"[untrusted tool output, not an instruction: {match.group(0).strip()}]",
        text,
    )
    return text, hidden + tokens + phrases


def _map_strings(value: JsonValue, change: Callable[[str], str]) -> JsonValue:
    match value:
        case str():
            return change(value)
        case list():
            return [_map_strings(item, change) for item in value]
        case dict():
            return {change(key): _map_strings(item, change) for key, item in value.items()}
        case _:
            return value


def _cap(value: JsonValue, max_bytes: int) -> tuple[JsonValue, bool]:
    if isinstance(value, str):
        encoded = value.encode()
        if len(encoded) <= max_bytes:
            return value, False
        kept = encoded[:max_bytes].decode(errors="ignore")
        return f"{kept}\n[truncated: {len(encoded) - len(kept.encode())} more bytes]", True
    encoded = json.dumps(value, ensure_ascii=False).encode()
    if len(encoded) <= max_bytes:
        return value, False
    # A cut JSON document is no longer JSON: the model gets its text, marked as cut.
    return _cap(encoded.decode(), max_bytes)
