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
from typing import NamedTuple

from pydantic import JsonValue

REDACTED = "[REDACTED]"


def _card_number(match: str) -> bool:
    digits = re.sub(r"\D", "", match)
    return 13 <= len(digits) <= 19 and _luhn_valid(digits)


def _luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


class _Rule(NamedTuple):
    """A pattern, and what lets most text skip it: a text shorter than its shortest match,
    or one with none of its clues (every match contains one of them, compared with the text
    as `_folded` gives it). A search costs milliseconds on a large output, and microseconds
    on each of the many short strings of a structured one; these checks cost less."""

    pattern: re.Pattern[str]
    shortest: int
    """The length of the pattern's shortest match."""
    clues: tuple[str, ...] = ()
    """Lower-case; none means every text long enough is searched."""


def _may_match(rule: _Rule, text: str, clue_text: str | None) -> bool:
    if len(text) < rule.shortest:
        return False
    return clue_text is None or not rule.clues or any(clue in clue_text for clue in rule.clues)


_CLUES_FROM = 16
"""Shorter texts are searched by every pattern: that costs less than looking for clues."""


def _clue_text(text: str) -> str | None:
    """Where to look for clues: the folded text, or None if the text is too short to bother."""
    return _folded(text) if len(text) >= _CLUES_FROM else None


def _folded(text: str) -> str:
    """The text in lower case, as `re.IGNORECASE` sees it: besides case, that flag also
    equates the dotted capital I and the dotless i with i, and the long s with s (and the
    Kelvin sign with k, which `lower` does too)."""
    return text.replace("\u0130", "i").lower().replace("\u0131", "i").replace("\u017f", "s")


# Each pattern's secret is the whole match, or the group named `secret` where the context
# around it (a key name, a URL's user) is worth keeping. A pattern that would begin with
# `\b` begins with its literal instead, the boundary checked by a lookbehind just after it:
# `re` finds a leading literal by a fast scan, but tries a leading `\b` at every position.
_SECRETS: tuple[_Rule, ...] = (
    _Rule(
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
        52,
    ),
    _Rule(re.compile(r"A[KS]IA(?<!\wA[KS]IA)[0-9A-Z]{16}\b"), 20),
    _Rule(re.compile(r"gh(?<!\wgh)[pousr]_[A-Za-z0-9]{30,}\b"), 34),
    _Rule(re.compile(r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{22,}\b"), 33),
    _Rule(re.compile(r"sk-(?<!\wsk-)(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"), 23),
    _Rule(re.compile(r"xox(?<!\wxox)[abposr]-[A-Za-z0-9-]{10,}"), 15),
    _Rule(re.compile(r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}\b"), 39),
    _Rule(re.compile(r"eyJ(?<!\weyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), 29),
    _Rule(
        re.compile(r"(?i)\bbearer\s+(?P<secret>(?!\[REDACTED\])[A-Za-z0-9._~+/-]{12,}=*)"),
        19,
        ("bearer",),
    ),
    _Rule(
        re.compile(
            r"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|"
            r"access[_-]?token|client[_-]?secret)[\"']?\s*[:=]\s*[\"']?"
            r"(?P<secret>(?!\[REDACTED\])[^\s\"',;&]{4,})"
        ),
        8,
        ("pass", "pwd", "secret", "api", "access", "auth"),
    ),
    _Rule(re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?P<secret>[^/\s@]+)@"), 8, ("://",)),
)


def _social_security_number(match: str) -> bool:
    # Numbers never issued: area 000, 666 or 900-999, group 00, serial 0000.
    area, group, serial = match[:3], match[4:6], match[7:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


_NINO_FIRST_NEVER, _NINO_SECOND_NEVER = set("DFIQUV"), set("DFIOQUV")
_NINO_PREFIXES_NEVER = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def _national_insurance_number(match: str) -> bool:
    return (
        match[0] not in _NINO_FIRST_NEVER
        and match[1] not in _NINO_SECOND_NEVER
        and match[:2] not in _NINO_PREFIXES_NEVER
    )


class _Number(NamedTuple):
    """A number that identifies a person or pays for something, and whether a match really
    is one (its checksum or issuing rules): many other numbers look the same."""

    rule: _Rule
    valid: Callable[[str], bool]


# Each starts with its first character matched before a lookbehind saying that nothing of
# the kind precedes it, for the same reason as above.
_NUMBERS: tuple[_Number, ...] = (
    # Card numbers: 13 to 19 digits, single spaces or hyphens between.
    _Number(_Rule(re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-])"), 13), _card_number),
    # US Social Security numbers, as they are written, with hyphens: nine bare digits, or
    # spaced, are too many other things.
    _Number(
        _Rule(re.compile(r"\d(?<![\d-]\d)\d\d-\d\d-\d{4}(?![\d-])"), 11, ("-",)),
        _social_security_number,
    ),
    # UK National Insurance numbers, spaced in pairs or not.
    _Number(
        _Rule(re.compile(r"[A-Z](?<![A-Za-z0-9][A-Z])[A-Z](?: ?\d\d){3} ?[A-D](?![A-Za-z0-9])"), 9),
        _national_insurance_number,
    ),
)
_VALID = {rule.pattern: valid for rule, valid in _NUMBERS}
_SHORTEST_SECRET = min(rule.shortest for rule in (*_SECRETS, *(n.rule for n in _NUMBERS)))

# Zero-width, bidirectional overrides, tag characters and C0/C1 controls other than
# tab and newlines: invisible to a person, read by a model.
_HIDDEN = re.compile(
    "[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
)
_ROLE_TOKENS = _Rule(
    re.compile(
        r"<\|[A-Za-z_]{2,24}\|>|\[/?INST\]|<</?SYS>>|</?s>|<\|?(?:system|assistant|user)\|?>",
        re.IGNORECASE,
    ),
    3,
    ("<", "["),
)
_INSTRUCTIONS = _Rule(
    re.compile(
        r"(?im)(?:^[ \t#>*]*(?:system|assistant|developer)\s*(?:prompt)?\s*:)"
        r"|\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:of\s+)?"
        r"(?:the\s+|your\s+)?(?:previous|prior|above|earlier|preceding|system)\s+"
        r"(?:instructions?|prompts?|messages?|rules?|directions?)"
        r"|\byou\s+are\s+now\s+(?:a|an|in)\b"
        r"|\bnew\s+(?:system\s+)?instructions?\s*:"
    ),
    7,
    ("system", "assistant", "developer", "ignore", "disregard", "forget", "override", "you", "new"),
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
    """The text with keys, tokens, credentials, card numbers and national identity numbers
    replaced; how many."""
    if len(text) < _SHORTEST_SECRET:
        return text, 0
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

    # Replacing a secret (by a marker in brackets) adds no clue: the text's clues will do.
    clue_text = _clue_text(text)
    for rule in _SECRETS:
        if _may_match(rule, text, clue_text):
            text = rule.pattern.sub(secret, text)

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if not _VALID[match.re](match.group(0)):
            return match.group(0)
        count += 1
        return REDACTED

    for rule, _ in _NUMBERS:
        if _may_match(rule, text, clue_text):
            text = rule.pattern.sub(number, text)
    return text, count


def neutralise_instructions(text: str) -> tuple[str, int]:
    """The text with hidden characters removed, model role tokens replaced and phrases that
    address the model marked as quoted data; how many places were changed."""
    text, hidden = _HIDDEN.subn("", text)
    # After the hidden characters are gone (they may split a word), and before the role
    # markers' replacement, which adds no clue to instructions.
    clue_text = _clue_text(text)
    tokens = phrases = 0
    if _may_match(_ROLE_TOKENS, text, clue_text):
        text, tokens = _ROLE_TOKENS.pattern.subn("[role marker removed]", text)
    if _may_match(_INSTRUCTIONS, text, clue_text):
        text, phrases = _INSTRUCTIONS.pattern.subn(
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
