"""Output safety: whatever reaches the log (a tool's result, a model's text, an error's
message) made fit to share and for a model to read. Pure, and the one place it is done.

Secrets are redacted, text that tries to instruct a model is neutralised (kept readable, but
marked as data, and hidden characters removed), and the whole is cut to a size cap with a
marker. Each rule has a name; what fired is counted by name, never quoted. The caller keeps
the raw output, if at all, for people allowed to see it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import quote, quote_plus

from ahocorasick_rs import AhoCorasick, Implementation, MatchKind
from pydantic import JsonValue

from helmline.contracts import ClassifierVerdict, ToolError

REDACTED = "[REDACTED]"
NEUTRALISED = "[untrusted text, not an instruction: "
"""How a neutralised passage opens in a result (a `]` closes it): the span that was flagged."""
CLASSIFIER_RULE = "classifier"
"""The rule name a classifier's `injection` is counted under, beside the patterns' names."""
SECRET_RULE_PREFIX = "secret:"
"""A registered secret's rule is named `secret:NAME`, and its values are replaced by
`[secret:NAME]`: the name says what was there, never the value."""


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
    """A named pattern, and what lets most text skip it: a text shorter than its shortest match,
    or one with none of its clues (every match contains one of them, compared with the text
    as `_folded` gives it). A search costs milliseconds on a large output, and microseconds
    on each of the many short strings of a structured one; these checks cost less."""

    name: str
    """What an event calls the rule when it fired."""
    pattern: re.Pattern[str]
    shortest: int
    """The length of the pattern's shortest match."""
    clues: tuple[str, ...] = ()
    """Lower-case; none means every text long enough is searched."""


def _may_match(rule: _Rule, text: str, clues: _Clues | None) -> bool:
    if len(text) < rule.shortest:
        return False
    return clues is None or not rule.clues or clues.any_of(rule.clues)


_CLUES_FROM = 16
"""Shorter texts are searched by every pattern: that costs less than looking for clues."""


def _clues_in(text: str) -> _Clues | None:
    """Where the rules' clues are in the text, or None if the text is too short to bother."""
    return _Clues(_folded(text)) if len(text) >= _CLUES_FROM else None


class _Clues:
    """Where each clue of every rule is in a (folded) text, all found in one pass
    (Aho-Corasick, in Rust): a scan of the text for each clue of each rule cost more than
    the searches the clues spare."""

    def __init__(self, folded: str) -> None:
        self._at: dict[str, list[int]] = {}
        for index, start, _ in _CLUE_FINDER.find_matches_as_indexes(folded, overlapping=True):
            self._at.setdefault(_ALL_CLUES[index], []).append(start)

    def any_of(self, clues: tuple[str, ...]) -> bool:
        return not self._at.keys().isdisjoint(clues)

    def found(self) -> Iterable[str]:
        """Every clue in the text."""
        return self._at.keys()

    def count(self, clues: tuple[str, ...]) -> int:
        return sum(len(self._at.get(clue, ())) for clue in clues)

    def at(self, clue: str) -> list[int]:
        """Where the clue begins, in order."""
        return self._at.get(clue, [])


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
        "private_key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
        52,
    ),
    _Rule(
        "aws_access_key_id",
        re.compile(r"A[KS]IA(?<!\wA[KS]IA)[0-9A-Z]{16}\b"),
        20,
        ("akia", "asia"),
    ),
    # A secret key is 40 characters of base64 that only its name tells from other base64.
    _Rule(
        "aws_secret_access_key",
        re.compile(
            r"(?i)(?<![a-z0-9])aws_?secret(?:_?access)?_?key[\"']?\s*[:=]\s*[\"']?"
            r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"
        ),
        53,
        ("aws",),
    ),
    _Rule("github_token", re.compile(r"gh(?<!\wgh)[pousr]_[A-Za-z0-9]{30,}\b"), 34, ("gh",)),
    _Rule(
        "github_token",
        re.compile(r"github_pat_(?<!\wgithub_pat_)[A-Za-z0-9_]{22,}\b"),
        33,
        ("github_pat_",),
    ),
    _Rule(
        "model_api_key",
        re.compile(r"sk-(?<!\wsk-)(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"),
        23,
        ("sk-",),
    ),
    _Rule(
        "gitlab_token",
        re.compile(r"gl(?<!\wgl)(?:pat|rt|dt|ptt|cbt|soat|imt|ft|oas)-[A-Za-z0-9_-]{20,}"),
        25,
        ("gl",),
    ),
    _Rule("stripe_key", re.compile(r"sk_(?<!\wsk_)(?:live|test)_[A-Za-z0-9]{20,}"), 28, ("sk_",)),
    _Rule("stripe_key", re.compile(r"rk_(?<!\wrk_)(?:live|test)_[A-Za-z0-9]{20,}"), 28, ("rk_",)),
    _Rule("stripe_key", re.compile(r"whsec_(?<!\wwhsec_)[A-Za-z0-9+/=]{24,}"), 30, ("whsec_",)),
    _Rule(
        "google_oauth_client_secret",
        re.compile(r"GOCSPX-(?<!\wGOCSPX-)[A-Za-z0-9_-]{24,}"),
        31,
        ("gocspx-",),
    ),
    _Rule(
        "sendgrid_api_key",
        re.compile(r"SG\.(?<!\wSG\.)[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
        36,
        ("sg.",),
    ),
    _Rule("npm_token", re.compile(r"npm_(?<!\wnpm_)[A-Za-z0-9]{36}\b"), 40, ("npm_",)),
    _Rule(
        "pypi_token",
        re.compile(r"pypi-(?<!\wpypi-)AgEIcHlwaS5vcmc[A-Za-z0-9_-]{20,}"),
        40,
        ("pypi-",),
    ),
    _Rule("vault_token", re.compile(r"hv(?<!\whv)[sbr]\.[A-Za-z0-9_-]{24,}"), 28, ("hv",)),
    _Rule(
        "slack_webhook",
        re.compile(
            r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}"
        ),
        53,
        ("hooks.slack.com",),
    ),
    _Rule("slack_token", re.compile(r"xox(?<!\wxox)[abposr]-[A-Za-z0-9-]{10,}"), 15, ("xox",)),
    _Rule("google_api_key", re.compile(r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}\b"), 39, ("aiza",)),
    _Rule(
        "jwt",
        re.compile(r"eyJ(?<!\weyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        29,
        ("eyj",),
    ),
    _Rule(
        "bearer_token",
        re.compile(r"(?i)\bbearer\s+(?P<secret>(?!\[REDACTED\])[A-Za-z0-9._~+/-]{12,}=*)"),
        19,
        ("bearer",),
    ),
    # Basic credentials are base64 of `user:password`: only the header's name tells them.
    _Rule(
        "basic_auth",
        re.compile(
            r"(?i)authorization[\"']?\s*[:=]\s*[\"']?basic\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})"
        ),
        28,
        ("authorization",),
    ),
    # A name may end a longer one (`DB_PASSWORD`, `GITHUB_TOKEN`), hence no `\b` before it.
    _Rule(
        "credential_assignment",
        re.compile(
            r"(?i)(?<![a-z0-9\[])(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|"
            r"auth[_-]?token|access[_-]?token|client[_-]?secret|token|account[_-]?key|"
            r"shared[_-]?access[_-]?key)[\"']?\s*[:=]\s*[\"']?"
            r"(?P<secret>(?!\[REDACTED\]|\[secret:)[^\s\"',;&]{4,})"
        ),
        8,
        (
            *("pass", "pwd", "secret", "api", "access", "auth", "token"),
            *("accountkey", "account_key", "account-key"),
        ),
    ),
    _Rule(
        "connection_string_password",
        # The user may be empty (`redis://:password@host`).
        re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]*:(?P<secret>(?!\[secret:)[^/\s@]+)@"),
        7,
        ("://",),
    ),
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
    shape: bytes
    """What every match looks like in `_shapes` of an ASCII text."""


# Each starts with its first character matched before a lookbehind saying that nothing of
# the kind precedes it, for the same reason as above.
_NUMBERS: tuple[_Number, ...] = (
    # Card numbers: 13 to 19 digits, single spaces or hyphens between.
    _Number(
        _Rule("card_number", re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-])"), 13),
        _card_number,
        b"1" * 13,
    ),
    # US Social Security numbers, as they are written, with hyphens: nine bare digits, or
    # spaced, are too many other things.
    _Number(
        _Rule(
            "us_social_security_number",
            re.compile(r"\d(?<![\d-]\d)\d\d-\d\d-\d{4}(?![\d-])"),
            11,
            ("-",),
        ),
        _social_security_number,
        b"1" * 11,
    ),
    # UK National Insurance numbers, spaced in pairs or not.
    _Number(
        _Rule(
            "uk_national_insurance_number",
            re.compile(r"[A-Z](?<![A-Za-z0-9][A-Z])[A-Z](?: ?\d\d){3} ?[A-D](?![A-Za-z0-9])"),
            9,
        ),
        _national_insurance_number,
        b"AA1",
    ),
)
_VALID = {number.rule.pattern: number.valid for number in _NUMBERS}
_NAMES = {rule.pattern: rule.name for rule in (*_SECRETS, *(number.rule for number in _NUMBERS))}
_SHORTEST_SECRET = min(rule.shortest for rule in (*_SECRETS, *(n.rule for n in _NUMBERS)))

_SHAPE_OF = {
    **dict.fromkeys(b"0123456789 -", ord("1")),
    **dict.fromkeys(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", ord("A")),
    **dict.fromkeys([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F], ord("H")),
}
_SHAPES = bytes(_SHAPE_OF.get(byte, ord("0")) for byte in range(256))


def _shapes(text: str) -> bytes | None:
    """A long ASCII text's characters by kind: a digit, space or hyphen is `1`, a capital
    `A`, a hidden character `H`, any other `0`. Looking for a number's shape or for `H` in it
    costs a fraction of what the search does, whose matcher starts at every digit (or every
    character, for the hidden ones); a text that lacks the shape is not searched."""
    if len(text) < _WINDOWED_FROM or not text.isascii():
        return None
    return text.encode("ascii").translate(_SHAPES)


# Zero-width, bidirectional overrides, tag characters and C0/C1 controls other than
# tab and newlines: invisible to a person, read by a model.
_HIDDEN = re.compile(
    "[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
)
_ROLE_TOKENS = _Rule(
    "role_marker",
    re.compile(
        r"<\|[A-Za-z_]{2,24}\|>|\[/?INST\]|<</?SYS>>|</?s>|<\|?(?:system|assistant|user)\|?>",
        re.IGNORECASE,
    ),
    3,
    ("<", "["),
)


class _Cue(NamedTuple):
    """A sign of text written to instruct a model rather than to inform whoever reads it, and
    what tells a match from a lookalike where the pattern alone cannot."""

    rule: _Rule
    meant: Callable[[re.Match[str]], bool] | None = None
    """Whether a match is the cue; none means every match is."""
    also: tuple[str, ...] = ()
    """Clues of a second part of every match (lower-case, as `_Rule.clues`): a text must
    hold one of these as well as one of the rule's, where each alone is common."""


# What attacks call the model they address, in the languages below; a name of a model family
# stands for the family.
_MODEL = (
    r"(?:(?:ai|a\.i\.|artificial\s+intelligence)(?:\s+(?:language\s+)?"
    r"(?:model|assistant|agent|system|bot))?|llms?|(?:large\s+)?language\s+models?|"
    r"assistant|agent|chat\s?bot|chatgpt|gpt[\w.-]*|claude[\w.-]*|gemini[\w.-]*|"
    r"llama[\w.-]*|mistral[\w.-]*|copilot|"
    r"ki|(?:ki-)?sprachmodell|assistent(?:in)?|modell|ia|mod[eè]le(?:\s+de\s+langage)?|"
    r"modelo(?:\s+de\s+lenguaje)?|modello(?:\s+linguistico)?|asistente|assistente|agente)"
)
_VOCATIVE_ENDS = (
    *(
        f"{name}{plural}{mark}"
        for name in (
            *("ai", "a.i.", "llm", "model", "assistant", "agent", "bot", "system", "ki"),
            *("intelligence", "ia", "modell", "modèle", "langage", "modelo", "lenguaje"),
            *("modello", "linguistico", "asistente", "assistente", "agente", "assistent"),
            "assistentin",
        )
        for plural in ("", "s")
        for mark in ",:!"
    ),
    *("gpt", "claude", "gemini", "llama", "mistral", "copilot"),
)
"""What every greeting to a model ends with (`_MODEL`, then a comma, colon or exclamation
mark): rarer in text than the greetings themselves."""
_ARTICLE = r"(?:(?:the|an?|my|our|dear|der|die|das|le|la|les|el|lo|il|o|a)\s+|l['\u2019])?"

# What the text asks the reader to set aside: its instructions, by any of their names, in
# English, German, French, Spanish, Italian and Portuguese.
_OBJECTS = frozenset(
    {
        *("instructions", "instruction", "prompts", "prompt", "messages", "rules"),
        *("directions", "directives", "commands", "guidelines", "orders"),
        *("anweisungen", "anweisung", "instruktionen", "befehle", "anordnungen", "vorgaben"),
        *("regeln", "consignes", "règles", "ordres", "commandes", "instrucciones"),
        *("indicaciones", "órdenes", "ordenes", "reglas", "directivas", "mensajes"),
        *("comandos", "istruzioni", "indicazioni", "ordini", "regole", "direttive"),
        *("messaggi", "comandi", "instruções", "instrucoes", "orientações", "ordens"),
        *("regras", "diretrizes", "mensagens"),
    }
)


def _names_instructions(match: re.Match[str]) -> bool:
    """Whether the object is one of `_OBJECTS`, misspelt or not: attacks misspell it to pass
    filters (a letter added, dropped, swapped or changed per five letters of the word)."""
    word = _folded(match.group("object"))
    return any(_within_edits(word, known, len(known) // 5) for known in _OBJECTS)


def _within_edits(word: str, known: str, most: int) -> bool:
    """Whether `most` insertions, deletions, substitutions or swaps of adjacent letters or
    fewer turn `word` into `known` (optimal string alignment, cut off at `most`)."""
    if abs(len(word) - len(known)) > most:
        return False
    if most == 0:
        return word == known
    before: list[int] = []
    row = list(range(len(known) + 1))
    for i, char in enumerate(word, 1):
        current = [i]
        for j, other in enumerate(known, 1):
            cost = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (char != other))
            if i > 1 and j > 1 and char == known[j - 2] and word[i - 2] == other:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        if min(current) > most:
            return False
        before, row = row, current
    return row[-1] <= most


_IMPERATIVE_AFTER = re.compile(
    r"(?:^|[.!?:;,(>*•-]|\b(?:please|then|and|just|now|kindly|first|immediately))"
    r"[ \t]*['\"\u201c]?$",
    re.IGNORECASE | re.MULTILINE,
)


def _imperative(match: re.Match[str]) -> bool:
    """Whether the verb opens a sentence or a request (after `please`, `then`, `and`...):
    a command to the reader, not a description of what someone does."""
    start = match.start()
    return _IMPERATIVE_AFTER.search(match.string, max(0, start - 16), start) is not None


_TO_WHAT_THE_TEXT_NAMES = (
    r"(?:[^\n.!?]|[.!?](?=\S)){0,160}?\bto[ \t]+(?:[\w\u2019']+[:,]?[ \t]+){0,4}?"
)
"""After a verb that sends: the rest of its sentence (a full stop inside an address or a
quotation does not end it) up to `to` and at most four words that name what follows ("my
new email address:")."""
_SYSTEM_PART = r"(?:message|prompt|instructions?|note|override|update)"
"""What a block from the system or an administrator calls itself after their name."""

# Each cue is named after the kind of sign it is; counts go to that name. Every pattern
# reaches no further than `_REACH` from its clues, and is case-blind (`(?i)`).
_CUES: tuple[_Cue, ...] = (
    # "Ignore all previous instructions": a verb that sets aside, a word placing what is set
    # aside before this text, then the instructions by name (`_names_instructions`).
    _Cue(
        _Rule(
            "instruction",
            re.compile(
                r"(?i)\b(?:ignore|disregard|forget|override)\b"
                r"(?:\s+(?:all|any|every|each|of|the|your|my|our|these|those|its|other)){0,4}"
                r"\s+(?:previous|prior|above|earlier|preceding|foregoing|former|original|"
                r"initial|old|existing|system)\s+(?:(?:system|user|developer|safety|security|given)\s+)?"
                r"(?P<object>[^\W\d_]{4,20})\b"
            ),
            15,
            ("ignore", "disregard", "forget", "override"),
        ),
        _names_instructions,
    ),
    _Cue(
        _Rule(
            "instruction",
            re.compile(
                r"(?i)\b(?:ignorier|vergiss|vergessen sie|missachte)\w*"
                r"(?:\s+(?:sie|alle|sämtliche|die|deine|ihre|jegliche)){0,4}"
                r"\s+(?:vorherig|bisherig|vorig|obig|früher|vorangegangen|vorstehend|"
                r"ursprünglich|alt)e[nrsm]?\s+(?P<object>[^\W\d_]{4,20})\b"
            ),
            17,
            ("ignorier", "vergiss", "vergessen sie", "missachte"),
        ),
        _names_instructions,
    ),
    # French, Spanish, Italian and Portuguese place the adjective after the noun.
    _Cue(
        _Rule(
            "instruction",
            re.compile(
                r"(?i)\b(?:ignor|oubli|olvid|dimentic|esqueç|esquec|desconsider|"
                r"ne tiens pas compte|ne tenez pas compte|haz caso omiso)\w*"
                r"(?:\s+(?:toutes|tous|les|vos|tes|des|de|todas|todos|las|los|tus|sus|"
                r"tutte|tutti|le|gli|i|tue|as|os|suas|tuas)){0,4}"
                r"\s+(?P<object>[^\W\d_]{4,20})\s+(?:précédentes|antérieures|ci-dessus|"
                r"anteriores|previas|precedentes|precedenti|sopra|prévias|acima)\b"
            ),
            16,
            (
                *("ignor", "oubli", "olvid", "dimentic", "esqueç", "esquec", "desconsider"),
                *("ne tiens pas compte", "ne tenez pas compte", "haz caso omiso"),
            ),
        ),
        _names_instructions,
    ),
    _Cue(
        _Rule(
            "instruction",
            re.compile(
                r"(?i)\b(?:you are now\s+(?:a|an|in)\b|from now on,?\s+you\s+"
                r"(?:are|will|must|shall)\b)"
            ),
            13,
            ("you are now", "from now on"),
        )
    ),
    _Cue(
        _Rule(
            "instruction",
            re.compile(
                r"(?i)\b(?:new\s+(?:system\s+)?instructions?|neue\s+anweisungen|"
                r"nouvelles\s+(?:instructions|consignes)|nuevas\s+instrucciones|"
                r"nuove\s+istruzioni|novas\s+instruções)\s*:"
            ),
            16,
            (
                "instruction",
                "anweisungen",
                "consignes",
                "instrucciones",
                "istruzioni",
                "instruções",
            ),
        )
    ),
    # A role's turn written into data, or a block claiming to come from the system.
    _Cue(
        _Rule(
            "fake_system_block",
            re.compile(r"(?im)^[ \t#>*]*(?:system|assistant|developer)\s*(?:prompt)?\s*:"),
            7,
            ("system", "assistant", "developer"),
        )
    ),
    _Cue(
        _Rule(
            "fake_system_block",
            re.compile(
                r"(?i)(?:#{2,}|[\[({<])[ \t]*[\[(]?[ \t]*(?:system(?:[ \t_-]*"
                + _SYSTEM_PART
                + ")?|"
                r"admin(?:istrator)?[ \t_-]*" + _SYSTEM_PART + r")[ \t]*(?:[\])}>]|:)"
            ),
            8,
            ("system", "admin"),
        )
    ),
    _Cue(
        _Rule(
            "fake_system_block",
            re.compile(
                r"(?i)\b(?:system|admin(?:istrator)?)[ \t_-]*(?:message|prompt|instructions?|"
                r"override)[ \t]*:|systemnachricht\s*:|message\s+(?:du\s+)?système\s*:|"
                r"mensaje\s+del\s+sistema\s*:|messaggio\s+di\s+sistema\s*:|"
                r"mensagem\s+do\s+sistema\s*:"
            ),
            12,
            ("system", "admin", "système", "sistema"),
        ),
        also=(
            *("message", "prompt", "instruction", "override", "nachricht", "mensaje"),
            *("messaggio", "mensagem"),
        ),
    ),
    # A block that announces a message for the model: a tag, or an important message from
    # the user (the person the model works for) or to the model.
    _Cue(
        _Rule(
            "important_message",
            re.compile(
                r"(?i)<[ \t]*/?[ \t]*(?:information|important|instructions?|priority|urgent)"
                r"(?:[ \t_-]+(?:information|instructions?|message|note|notice))?[ \t]*>"
            ),
            8,
            ("information", "important", "instruction", "priority", "urgent"),
        )
    ),
    _Cue(
        _Rule(
            "important_message",
            re.compile(
                r"(?i)\b(?:important|urgent|critical)\s+(?:message|instructions?|notice|note)"
                r"\s+(?:from\s+(?:me|the\s+user|your\s+(?:user|owner|developer|creator|"
                r"operator|admin))\b|(?:for|to)\s+(?:you,?\s+)?"
                + _ARTICLE
                + _MODEL
                + r"(?=\s*[,:.!]))"
                r"|wichtige\s+(?:nachricht|mitteilung|anweisung(?:en)?|botschaft)\s+"
                r"(?:von\s+mir|vom\s+(?:benutzer|nutzer)|an\s+(?:dich|sie)|für\s+(?:dich|sie))"
                r"|(?:message|instruction|consigne)s?\s+importante?s?\s+"
                r"(?:de\s+ma\s+part|de\s+(?:la\s+part\s+de\s+)?l['\u2019]utilisateur|"
                r"pour\s+(?:toi|vous)|à\s+(?:toi|vous))"
                r"|(?:mensaje|instrucci[oó]n|aviso)(?:es)?\s+importantes?\s+"
                r"(?:de\s+mi\s+parte|de\s+parte\s+del\s+usuario|del\s+usuario|"
                r"para\s+(?:ti|usted))"
                r"|(?:messaggio|istruzion[ei]|avviso)\s+important[ei]\s+"
                r"(?:da\s+parte\s+(?:mia|dell['\u2019]utente)|dall['\u2019]utente|per\s+te)"
                r"|(?:mensagem|instru[çc][ãa]o|aviso)\s+importante\s+"
                r"(?:de\s+mim|minha|da\s+minha\s+parte|do\s+(?:usuário|utilizador)|"
                r"para\s+(?:você|ti))"
            ),
            17,
            ("important", "urgent", "critical", "wichtige"),
        )
    ),
    # Text that names its reader as a model: "to you, GPT-4", "Dear assistant,".
    _Cue(
        _Rule(
            "addressed_to_model",
            re.compile(r"(?i)\b(?:to|for) you\s*,?\s+" + _ARTICLE + _MODEL + r"\b"),
            9,
            ("to you", "for you"),
        )
    ),
    _Cue(
        _Rule(
            "addressed_to_model",
            re.compile(
                r"(?i)\b(?:an (?:dich|sie|euch)|für (?:dich|sie)|[àa] (?:toi|vous)|"
                r"pour (?:toi|vous)|para (?:ti|usted|você|voce)|a (?:ti|te|usted|você)|"
                r"per te)\s*,\s*" + _ARTICLE + _MODEL + r"\b"
            ),
            7,
            (
                *("dich", "an sie", "für sie", "euch", "toi", "vous", "para ti", "a ti"),
                *("usted", "você", "voce", "a te", "per te"),
            ),
        )
    ),
    _Cue(
        _Rule(
            "addressed_to_model",
            re.compile(
                r"(?i)\b(?:dear|hey|hi|hello|attention|greetings|note to|message to|"
                r"liebe[rs]?|hallo|achtung|cher|chère|bonjour|salut|querid[oa]|estimad[oa]|"
                r"hola|atención|car[oa]|ciao|attenzione|olá|prezad[oa]|atenção)"
                r"\s*,?\s+(?:the\s+|all\s+|any\s+)?" + _ARTICLE + _MODEL + r"s?[,:!]"
            ),
            6,
            _VOCATIVE_ENDS,
        ),
        also=(
            *("dear", "hey", "hi", "hello", "attention", "greetings", "note to"),
            *("message to", "liebe", "hallo", "achtung", "cher", "bonjour", "salut"),
            *("querid", "estimad", "hola", "atención", "caro", "cara", "ciao"),
            *("attenzione", "olá", "prezad", "atenção"),
        ),
    ),
    _Cue(
        _Rule(
            "addressed_to_model",
            re.compile(
                r"(?i)\bif you are\s+(?:an?\s+)?(?:ai|llm|(?:large\s+)?language\s+model|"
                r"chat\s?bot|ai\s+(?:assistant|agent|model))\b(?!\s+(?:developer|engineer|"
                r"researcher|company|startup|team|enthusiast|practitioner|user))"
                r"|(?:ai|llm|assistant|agent|model|bot)s?\s+(?:that\s+is\s+|who\s+is\s+)?"
                r"(?:reading|processing|parsing|summari[sz]ing|analy[sz]ing) this\b"
            ),
            13,
            (
                *("if you are", "reading this", "processing this", "parsing this"),
                *("summarizing this", "summarising this", "analyzing this", "analysing this"),
            ),
        )
    ),
    # A detour before the task the model was given, or a way back to it after.
    _Cue(
        _Rule(
            "task_hijack",
            re.compile(
                r"(?i)\bbefore you\s+(?:can\s+|do\s+|start\s+|continue\s+|proceed\s+|go\s+on\s+)?"
                r"(?:solve|complete|finish|answer|continue|proceed|respond|reply|do|start|"
                r"begin|work\s+on|carry\s+on)(?:\s+with)?\s+(?:the|your|this|my|any)\s+"
                r"(?:\w+\s+){0,2}?(?:task|request|question|query|job|assignment|goal)s?\b"
                r"|after you\s+(?:do|did|have\s+done|are\s+done\s+with|finish|complete)\s+"
                r"(?:that|this|it)\s*,?\s+(?:you\s+(?:can|may)\s+|please\s+)?(?:go\s+back\s+to|"
                r"return\s+to|continue(?:\s+with)?|proceed(?:\s+with)?|resume|solve|complete|"
                r"do|finish)\s+(?:the|your)\s+(?:original\s+|previous\s+|initial\s+|actual\s+)?"
                r"(?:task|request|job|assignment)\b"
            ),
            20,
            ("before you", "after you"),
        )
    ),
    # A command to call a tool, or to send, transfer or post something to an address, an
    # account or a site that the text itself supplies.
    _Cue(
        _Rule(
            "tool_command",
            re.compile(
                r"(?i)\b(?:you\s+(?:should|must|need\s+to|have\s+to)|please|now)\s+"
                r"(?:use|call|invoke|run|execute|trigger)\s+the (?:tool|function|action)"
                r"\s+\S{1,64}\s+with\s+(?:the\s+following\s+|these\s+)?"
                r"(?:arguments|parameters|args|inputs)\b"
            ),
            28,
            ("the tool", "the function", "the action"),
        )
    ),
    _Cue(
        _Rule(
            "tool_command",
            re.compile(
                r"(?i)\b(?:send|e-?mail|forward|transfer|wire|pay|post|upload|share|leak|"
                r"exfiltrate)\b" + _TO_WHAT_THE_TEXT_NAMES + r"['\"\u201c`<]?"
                r"(?:[\w.+-]+@[\w-]+\.[\w.-]*\w|(?:https?://|www\.)[^\s'\"\u201d>]+)"
            ),
            11,
            (
                *("send", "mail", "forward", "transfer", "wire", "pay", "post", "upload"),
                *("share", "leak", "exfiltrate"),
            ),
        ),
        _imperative,
        also=("@", "://", "www."),
    ),
    _Cue(
        _Rule(
            "tool_command",
            re.compile(
                r"(?i)\b(?:send|transfer|wire|pay)\b" + _TO_WHAT_THE_TEXT_NAMES + r"(?:"
                r"[a-z]{2}\d{2}[a-z0-9]{10,30}|"
                r"(?:iban|account)\s*:?\s*[a-z0-9]{8,34})\b"
            ),
            18,
            ("send", "transfer", "wire", "pay"),
        ),
        _imperative,
    ),
)
_INJECTION_RULES = tuple(cue.rule for cue in _CUES)
_CUES_BY_CLUE = {
    clue: tuple(cue for cue in _CUES if clue in cue.rule.clues)
    for cue in _CUES
    for clue in cue.rule.clues
}


_ALL_CLUES = tuple(
    sorted(
        {
            *(
                clue
                for rule in (*_SECRETS, *(n.rule for n in _NUMBERS), _ROLE_TOKENS)
                for clue in rule.clues
            ),
            *(clue for cue in _CUES for clue in (*cue.rule.clues, *cue.also)),
        }
    )
)
_CLUE_FINDER = AhoCorasick(list(_ALL_CLUES), implementation=Implementation.DFA)

Fired = dict[str, int]
"""How often each rule fired, by rule name."""


_DFA_FORMS = 1000
"""Most forms of registered values searched with a DFA."""


class RegisteredSecrets:
    """The values of the secrets registered with Helmline, by name, each also in the
    encodings a shell commonly prints it in (base64, URL-encoded, hex), all found in one
    pass over a text (Aho-Corasick, in Rust: 50 secrets cost a few microseconds per KiB)."""

    def __init__(self, values: Iterable[tuple[str, str]]) -> None:
        """`values`: (name, value) pairs; several secrets may share a name (in different
        tenants)."""
        forms: dict[str, str] = {}
        pairs = sorted(values)
        for name, value in pairs:
            for form in _encodings(value):
                forms.setdefault(form, name)
        self._names = tuple(forms.values())
        # A DFA searches 2-3 times faster than the library's choice, but takes about 0.15 ms
        # per form to build: past a hundred secrets or so, building it would cost more.
        implementation = Implementation.DFA if len(forms) <= _DFA_FORMS else None
        self._automaton = (
            AhoCorasick(
                list(forms), matchkind=MatchKind.LeftmostLongest, implementation=implementation
            )
            if forms
            else None
        )
        self._shortest = min(map(len, forms), default=0)
        self.count = len(pairs)
        """How many secrets are registered."""

    def redact(self, text: str, fired: Fired) -> str:
        """The text with every form of every value replaced by `[secret:NAME]`, each
        counted in `fired` under `secret:NAME`."""
        if self._automaton is None or len(text) < self._shortest:
            return text
        found = self._automaton.find_matches_as_indexes(text)
        if not found:
            return text
        pieces: list[str] = []
        done = 0
        for index, start, end in found:
            rule = SECRET_RULE_PREFIX + self._names[index]
            fired[rule] = fired.get(rule, 0) + 1
            pieces += (text[done:start], f"[{rule}]")
            done = end
        return "".join(pieces) + text[done:]


def _encodings(value: str) -> set[str]:
    """The value as it is, URL-encoded, in hex, and in base64 (standard and URL-safe) as
    the encoding of the value alone or of a text it is part of: each of the three ways the
    value can fall on base64's 3-byte groups gives the characters that only its own bits
    make, whatever comes before or after it."""
    raw = value.encode()
    forms = {value, quote(value, safe=""), quote(value), quote_plus(value, safe="")}
    forms |= {raw.hex(), raw.hex().upper()}
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + raw).decode()
        first, last = -(-8 * shift // 6), 8 * (shift + len(raw)) // 6
        core = encoded[first:last]
        forms |= {core, core.replace("+", "-").replace("/", "_")}
    return {form for form in forms if form}


@dataclass(slots=True)
class _Registry:
    secrets: RegisteredSecrets = field(default_factory=lambda: RegisteredSecrets(()))


_REGISTRY = _Registry()


def register_secrets(secrets: RegisteredSecrets) -> None:
    """Make `secrets` what this process redacts from now on, wherever output safety runs
    (the services that follow the secrets bucket keep it current)."""
    _REGISTRY.secrets = secrets


def registered_secrets() -> RegisteredSecrets:
    """What this process redacts now."""
    return _REGISTRY.secrets


@dataclass(frozen=True, slots=True)
class SafeOutput:
    """An output fit for the log and for a model, and what was done to it."""

    output: JsonValue
    redacted_by: Mapping[str, int] = field(default_factory=dict[str, int])
    """How many values each redaction rule replaced, by rule name."""
    neutralised_by: Mapping[str, int] = field(default_factory=dict[str, int])
    """How many places each injection rule neutralised (or only found, where instructions
    are not marked), by rule name."""
    truncated: bool = False
    classifier: ClassifierVerdict | None = None
    """What the injection classifier said of the output, when one was asked (it is asked
    after the patterns, at the edge: `helmline.runtime.classified`)."""

    @property
    def redactions(self) -> int:
        """How many values were redacted."""
        return sum(self.redacted_by.values())

    @property
    def neutralised(self) -> int:
        """How many instruction-like passages or hidden characters were neutralised."""
        return sum(self.neutralised_by.values())

    @property
    def injection_suspected(self) -> bool:
        """Whether a pattern neutralised (or found) an instruction, or the classifier judged
        the output an injection."""
        return bool(self.neutralised_by) or self._classified_injection

    @property
    def suspected_by(self) -> Mapping[str, int]:
        """`neutralised_by`, with the classifier's `injection` counted once as rule
        `classifier`: what an event records as the rules that fired."""
        if not self._classified_injection:
            return self.neutralised_by
        return {**self.neutralised_by, CLASSIFIER_RULE: 1}

    @property
    def _classified_injection(self) -> bool:
        return self.classifier is not None and self.classifier.verdict == "injection"

    @property
    def changed(self) -> bool:
        """Whether the output differs from what was given."""
        return bool(self.redacted_by or self.neutralised_by or self.truncated)


def make_safe(output: JsonValue, *, max_bytes: int, mark_instructions: bool = True) -> SafeOutput:
    """Redact secrets, neutralise instructions to models, then cut to `max_bytes` of JSON.

    With `mark_instructions` false, instructions are only counted: the arguments of a call a
    model proposes are what the tool will do, and an e-mail body that asks its reader to
    send something is what it should send."""
    redacted: Fired = {}
    neutralised: Fired = {}

    def clean(text: str) -> str:
        text, _ = redact_secrets(text, redacted)
        marked, _ = neutralise_instructions(text, neutralised)
        return marked if mark_instructions else text

    cleaned = _map_strings(output, clean)
    capped, truncated = _cap(cleaned, max_bytes)
    return SafeOutput(capped, redacted, neutralised, truncated)


def make_text_safe(text: str, *, max_bytes: int) -> tuple[str, SafeOutput]:
    """`make_safe` for a text that must stay a text (a message, a model's answer)."""
    safe = make_safe(text, max_bytes=max_bytes)
    assert isinstance(safe.output, str)
    return safe.output, safe


_WINDOWED_FROM = 4096
"""From this length, a rule with clues is searched only around them, when they are few."""
_REACH = 256
"""How far around a clue its rule is searched (then out to whole lines): further than any
of the patterns with clues reaches on one side of its clue, unless a line of it is longer."""
_CLUES_PER_KIB = 4
"""More clues than this per KiB of text, and searching the whole text costs less."""


def _matches(rule: _Rule, text: str, clues: _Clues | None) -> Iterator[re.Match[str]]:
    """`rule.pattern.finditer(text)`, in a long text only near the rule's clues: `re` tries
    a pattern that begins with an alternative or a class at every position, which costs
    tens of microseconds per KiB, while finding a clue in the folded text costs less than
    one."""
    if clues is None or not rule.clues or len(text) < _WINDOWED_FROM:
        yield from rule.pattern.finditer(text)
        return
    limit = len(text) * _CLUES_PER_KIB // 1024
    if clues.count(rule.clues) > limit:
        yield from rule.pattern.finditer(text)
        return
    windows: list[tuple[int, int]] = []
    for clue in rule.clues:
        for at in clues.at(clue):
            begin = 0 if at <= _REACH else text.rfind("\n", 0, at - _REACH) + 1
            end = text.find("\n", at + len(clue) + _REACH)
            windows.append((begin, len(text) if end < 0 else end))
    windows.sort()
    done = 0
    for begin, end in windows:
        # Windows overlap: each match is found once, searching on from where the last ended.
        for match in rule.pattern.finditer(text, max(begin, done), end):
            yield match
            done = match.end()


def _sub(
    rule: _Rule,
    text: str,
    clues: _Clues | None,
    replace: Callable[[re.Match[str]], str],
) -> str:
    """`rule.pattern.sub(replace, text)`, searched as `_matches` does."""
    pieces: list[str] = []
    done = 0
    for match in _matches(rule, text, clues):
        pieces += (text[done : match.start()], replace(match))
        done = match.end()
    if not pieces:
        return text
    return "".join(pieces) + text[done:]


def redact_secrets(text: str, fired: Fired | None = None) -> tuple[str, int]:
    """The text with registered secrets, keys, tokens, credentials, card numbers and
    national identity numbers replaced; how many. Each rule that fired is counted in
    `fired`."""
    counts: Fired = {} if fired is None else fired
    before = sum(counts.values())
    # First: a registered value is named, and the patterns after it must not cut it up.
    text = _REGISTRY.secrets.redact(text, counts)
    if len(text) < _SHORTEST_SECRET:
        return text, sum(counts.values()) - before

    def secret(match: re.Match[str]) -> str:
        name = _NAMES[match.re]
        counts[name] = counts.get(name, 0) + 1
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole_start = match.start()
            return (
                match.group(0)[: start - whole_start]
                + REDACTED
                + match.group(0)[end - whole_start :]
            )
        return REDACTED

    clues = _clues_in(text)
    for rule in _SECRETS:
        if _may_match(rule, text, clues):
            replaced = _sub(rule, text, clues, secret)
            if replaced is not text and clues is not None and len(replaced) != len(text):
                # Positions moved: a later rule's clues are looked for where they now are.
                clues = _clues_in(replaced)
            text = replaced

    def number(match: re.Match[str]) -> str:
        if not _VALID[match.re](match.group(0)):
            return match.group(0)
        name = _NAMES[match.re]
        counts[name] = counts.get(name, 0) + 1
        return REDACTED

    shapes = _shapes(text)
    for rule, _, shape in _NUMBERS:
        if _may_match(rule, text, clues) and (shapes is None or shape in shapes):
            replaced = rule.pattern.sub(number, text)
            if replaced != text:
                text, shapes = replaced, _shapes(replaced)
    return text, sum(counts.values()) - before


def neutralise_instructions(text: str, fired: Fired | None = None) -> tuple[str, int]:
    """The text with hidden characters removed, model role tokens replaced and passages
    that instruct a model (`_CUES`) marked as quoted data; how many places were changed.
    Each rule that fired is counted in `fired`."""
    counts: Fired = {} if fired is None else fired
    shapes = _shapes(text)
    text, hidden = _HIDDEN.subn("", text) if shapes is None or b"H" in shapes else (text, 0)
    if hidden:
        counts["hidden_characters"] = counts.get("hidden_characters", 0) + hidden
    # After the hidden characters are gone (they may split a word), and before the role
    # markers' replacement, which adds no clue to the cues.
    clues = _clues_in(text)
    tokens = 0
    if _may_match(_ROLE_TOKENS, text, clues):
        text, tokens = _ROLE_TOKENS.pattern.subn("[role marker removed]", text)
        if tokens:
            counts[_ROLE_TOKENS.name] = counts.get(_ROLE_TOKENS.name, 0) + tokens
            clues = _clues_in(text)
    passages = _passages(text, clues)
    if not passages:
        return text, hidden + tokens
    pieces: list[str] = []
    done = 0
    for start, end, name in passages:
        counts[name] = counts.get(name, 0) + 1
        pieces += (
            text[done:start],
            f"{NEUTRALISED}{text[start:end].strip()}]",
        )
        done = end
    return "".join(pieces) + text[done:], hidden + tokens + len(passages)


def _passages(text: str, clues: _Clues | None) -> list[tuple[int, int, str]]:
    """Where the cues match, in order, as (start, end, rule name): of passages that overlap
    (one cue inside another's match), the one that starts first, then the longest, is
    kept, so that a passage is marked, and counted, once."""
    found = [
        (match.start(), -match.end(), cue.rule.name)
        for cue in _cues_that_may_match(text, clues)
        for match in _matches(cue.rule, text, clues)
        if cue.meant is None or cue.meant(match)
    ]
    kept: list[tuple[int, int, str]] = []
    for start, negative_end, name in sorted(found):
        if not kept or start >= kept[-1][1]:
            kept.append((start, -negative_end, name))
    return kept


def _cues_that_may_match(text: str, clues: _Clues | None) -> list[_Cue]:
    """The cues a text long enough holds the clues of (every cue has clues): found from the
    clues it holds, which are few, rather than by asking each cue."""
    if clues is None:
        return [cue for cue in _CUES if len(text) >= cue.rule.shortest]
    held = {id(cue): cue for clue in clues.found() for cue in _CUES_BY_CLUE.get(clue, ())}
    return [
        cue
        for cue in held.values()
        if len(text) >= cue.rule.shortest and (not cue.also or clues.any_of(cue.also))
    ]


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


ERROR_MAX_BYTES = 16_384
"""The size cap of an error's message: a failing tool's whole output belongs in its result."""


def make_error_safe(error: ToolError) -> tuple[ToolError, SafeOutput]:
    """The error with its message made safe (the one part of it a tool or server wrote)."""
    message, safe = make_text_safe(error.message, max_bytes=ERROR_MAX_BYTES)
    return (error.model_copy(update={"message": message}) if safe.changed else error), safe
