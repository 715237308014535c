"""Context management: which tools a request offers, how big results may be, and compaction.

Pure and deterministic (a shadow replay must build the very same request), so tokens are
estimated from the request's JSON rather than counted by a provider's tokenizer: about four
characters a token for English and JSON, which errs on the large side for most models.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from helmline.contracts import ModelMessage, ToolSpec

CHARS_PER_TOKEN = 4
KEPT_TAIL = 4
"""Newest messages never compacted: the model's latest call and what answered it."""
_WORD = re.compile(r"[a-z0-9]+")
SUMMARY_HEADING = "Summary of earlier work (older turns were compacted):"
ACCOUNT_HEADING = "In the words of a model that read the compacted turns:"


def estimate_tokens(
    system: str, messages: Sequence[ModelMessage], tools: Sequence[ToolSpec]
) -> int:
    """Estimated prompt size of a request, counted on its JSON form as the wire carries it."""
    chars = len(json.dumps(system))
    chars += sum(len(message.model_dump_json()) for message in messages)
    return chars // CHARS_PER_TOKEN + 1 + sum(schema_tokens(tool) for tool in tools)


def truncate(text: str, limit: int) -> str:
    """The text, cut to `limit` characters with a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[truncated: {limit} of {len(text)} characters shown]"


def schema_tokens(tool: ToolSpec) -> int:
    """Estimated size of a tool's schema in a request, as `estimate_tokens` counts it."""
    return len(json.dumps([tool.name, tool.description, tool.parameters])) // CHARS_PER_TOKEN + 1


def select_tools(
    registry: Sequence[ToolSpec],
    context: Iterable[str],
    used: Iterable[str],
    limit: int,
    max_tokens: int,
    picked: Sequence[str] = (),
) -> list[ToolSpec]:
    """At most `limit` tools whose schemas take at most `max_tokens`: those the session used,
    then those the classifying model picked for the goal (in its order), then the best
    matches of the goal and recent messages by shared words of name and description;
    registry order breaks ties. A tool too large for the room left is passed over for the
    next that fits."""
    words = {word for text in context for word in _WORD.findall(text.lower())}
    recent = set(used)
    rank = {name: len(picked) - index for index, name in enumerate(reversed(picked))}

    def score(tool: ToolSpec) -> int:
        if tool.name in recent:
            return 1_000_000
        if tool.name in rank:
            return 500_000 + rank[tool.name]
        named = set(_WORD.findall(tool.name.lower()))
        described = set(_WORD.findall(tool.description.lower()))
        return 10 * len(named & words) + len(described & words)

    ranked = sorted(range(len(registry)), key=lambda index: -score(registry[index]))
    chosen: list[int] = []
    room = max_tokens
    for index in ranked:
        if len(chosen) == limit:
            break
        size = schema_tokens(registry[index])
        if size <= room:
            chosen.append(index)
            room -= size
    return [registry[index] for index in sorted(chosen)]


@dataclass(frozen=True, slots=True)
class Compaction:
    """A conversation made smaller: the messages now sent, and what the summary kept."""

    messages: tuple[ModelMessage, ...]
    kept: tuple[str, ...]
    dropped: int


def compaction_cut(messages: Sequence[ModelMessage]) -> int | None:
    """Where the kept tail of a compacted conversation starts (the messages between the
    goal and it are dropped); None when there is nothing to drop. The tail starts at an
    assistant message, because tool results must follow the call they answer."""
    cut = len(messages) - KEPT_TAIL
    while cut > 1 and messages[cut].role != "assistant":
        cut -= 1
    return cut if cut > 1 else None


def compact(
    messages: Sequence[ModelMessage], facts: Sequence[str], account: str = ""
) -> Compaction | None:
    """Replace every message between the goal and the newest turn by a summary of `facts`,
    followed by the summarising model's `account` of the dropped turns when there is one.

    The summary leads with facts the log holds for certain (plans decided, each step's
    outcome), so nothing decided is lost or invented by a paraphrase; the account adds what
    the facts do not say (what was learnt, what is left). None when there is nothing to drop.
    """
    cut = compaction_cut(messages)
    if cut is None:
        return None
    goal = messages[0].content.split(f"\n\n{SUMMARY_HEADING}")[0]
    summary = "\n".join(f"- {fact}" for fact in facts)
    if account:
        summary += f"\n{ACCOUNT_HEADING}\n{account}"
    first = ModelMessage(role="user", content=f"{goal}\n\n{SUMMARY_HEADING}\n{summary}")
    return Compaction(messages=(first, *messages[cut:]), kept=tuple(facts), dropped=cut - 1)


def transcript(messages: Sequence[ModelMessage], limit: int) -> str:
    """Messages as plain text for a summarising model, each cut to a share of `limit`
    characters (the newest keep theirs when the whole would be longer)."""
    each = max(200, limit // max(1, len(messages)))
    lines: list[str] = []
    for message in messages:
        calls = "".join(f"\n  call {c.name} {c.arguments}" for c in message.tool_calls)
        lines.append(f"[{message.role}] {truncate(message.content + calls, each)}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[len(text) - limit :]
