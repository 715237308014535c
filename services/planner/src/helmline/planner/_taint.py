"""The taint of the calls a model proposes, decided purely from the session's log.

When the model answers, every result recorded before its answer was in its context. A call
it proposes then is `influenced_by_untrusted` when one of those results came from a tool not
declared trusted, `after_injection_suspected` when one was flagged by output safety, and its
arguments are `arguments_from_untrusted` when they repeat text (an e-mail address, a URL, a
path, any other string of six characters or more) that untrusted output holds and that
neither the goal nor a person (an approval's comment or edited arguments) wrote. Of those,
the `destinations_from_untrusted` say where the call sends or reaches: an argument that is
an e-mail address or a URL as a whole, or one named for a destination (`to`, `recipient`,
`webhook_url`...). Text quoted into a ticket's body came from untrusted output; the address
a mail goes to, taken from it, is the shape of exfiltration.

Matching is on text, lower-cased: an address the model re-spelled is missed, a word the goal
happens to share is forgiven. It says where to look, not what happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from pydantic import JsonValue

from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    EXCERPT_CHARS,
    ApprovalDecisionSubmitted,
    CallTaint,
    Event,
    ModelExchangeRecorded,
    SessionStarted,
    TaintSource,
    ToolCallCompleted,
    authorizations,
)
from helmline.runtime import NEUTRALISED

SPOTLIGHT_CUE = "spotlight_delimiter"
"""The cue of a result that held the session's spotlight marker or a forged delimiter."""
SHORTEST_FRAGMENT = 6
"""Shorter strings (`yes`, `main`, `42`) are everywhere; repeating one says nothing."""
MAX_SOURCES = 16
"""Most sources a call's taint lists: those its arguments came from first, then the newest
flagged results."""
_FRAGMENT = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # an e-mail address
    r"|[a-z][a-z0-9+.-]*://[^\s\"'<>]+"  # a URL
    r"|[\w.~-]*/[\w.~/-]+",  # a path
    re.IGNORECASE,
)
_TRAILING = ".,;:!?)]}'\""
_ADDRESS_OR_URL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|[a-z][a-z0-9+.-]*://\S+")
DESTINATION_WORDS = frozenset(
    {
        "to", "cc", "bcc", "recipient", "recipients", "email", "emails", "address",
        "url", "uri", "link", "host", "endpoint", "webhook", "channel", "account",
        "iban", "phone", "destination", "target",
    }
)  # fmt: skip
"""Words of an argument's name (`to`, `recipient_email`, `webhookUrl`) that say it is where
the call sends or reaches."""


@dataclass(frozen=True)
class _Result:
    """A result the model had read that taint may point to."""

    completed: ToolCallCompleted
    untrusted: bool
    """Whether it is outside content (see `outside_results`)."""
    forged: bool = False
    """Whether it held the session's spotlight marker or a forged delimiter."""

    @property
    def flagged(self) -> bool:
        """Whether it is a suspected injection: by output safety, or by its delimiters."""
        return self.completed.injection_suspected or self.forged

    # Read only when an argument is looked for in it: most calls have none worth looking for.
    @cached_property
    def text(self) -> str:
        """The result's strings, one a line."""
        return "\n".join(_strings(self.completed.output))

    @cached_property
    def lowered(self) -> str:
        return self.text.lower()


@dataclass(frozen=True, slots=True)
class Reading:
    """What the model had read when it answered: the tools' results, and people's words."""

    results: tuple[_Result, ...]
    people: str
    """The goal and what people wrote into the session, lower-cased."""


def outside_results(log: Sequence[Event]) -> frozenset[str]:
    """The calls whose results are outside content: those of tools not declared trusted;
    and, once the workspace was filled from outside (a call let use the network was
    authorised in the session: a clone, a download), every later result of a sandboxed
    tool, which may read back what came in. A rollback past that call does not make the
    workspace trusted again: what else the call left is not known."""
    outside: set[str] = set()
    networked = {event.id for event, call in authorizations(log) if call.network}
    filled = False
    for event in log:
        filled = filled or event.id in networked
        match event.data:
            case ToolCallCompleted(call_id=call_id, tool=tool) as done if done.untrusted or (
                filled and _in_sandbox(tool)
            ):
                outside.add(call_id)
            case _:
                pass
    return frozenset(outside)


def _in_sandbox(tool: str) -> bool:
    spec = BUILTIN_TOOLS_BY_NAME.get(tool)
    return spec is not None and spec.executor == "sandbox"


def reading(log: Sequence[Event]) -> Reading:
    """What the model had read, as the log up to its answer records it."""
    results: list[_Result] = []
    people: list[str] = []
    outside = outside_results(log)
    # Text that tried to end its block early, or repeated the session's marker, is trying
    # to speak outside the data: flagged, as output safety's cues flag.
    forged = {
        step
        for e in log
        if isinstance(e.data, ModelExchangeRecorded)
        for step in e.data.spotlight_flagged
    }
    for event in log:
        match event.data:
            case SessionStarted(goal=goal):
                people.append(goal)
            case ApprovalDecisionSubmitted(comment=comment, modified_arguments=edited):
                people += [comment, *_strings(edited)]
            case ToolCallCompleted() as done if (
                done.call_id in outside or done.injection_suspected or done.step_id in forged
            ):
                results.append(
                    _Result(done, untrusted=done.call_id in outside, forged=done.step_id in forged)
                )
            case _:
                pass
    return Reading(tuple(results), "\n".join(people).lower())


def taint_of(read: Reading, arguments: Mapping[str, JsonValue]) -> CallTaint | None:
    """The taint of a call with `arguments` proposed after `read`; None when the model had
    read nothing untrusted nor flagged."""
    if not read.results:
        return None
    untrusted = [r for r in read.results if r.untrusted]
    named: dict[str, list[str]] = {}
    excerpts: dict[str, str] = {}
    destinations: list[str] = []
    for name, value in arguments.items():
        for fragment in _fragments(value):
            if fragment in read.people:
                continue
            # The newest result that holds it: the one the model most likely copied.
            found = next((r for r in reversed(untrusted) if fragment in r.lowered), None)
            if found is None:
                continue
            call_id = found.completed.call_id
            if name not in named.setdefault(call_id, []):
                named[call_id].append(name)
            at = found.lowered.find(fragment)
            excerpts.setdefault(call_id, _excerpt(found.text, at, fragment))
            if _is_destination(name, value):
                destinations.append(name)
            break
    by_call = {r.completed.call_id: r for r in read.results}
    flagged = [c for c in reversed(by_call) if by_call[c].flagged]
    listed = list(dict.fromkeys([*named, *flagged]))[:MAX_SOURCES]
    return CallTaint(
        influenced_by_untrusted=bool(untrusted),
        after_injection_suspected=bool(flagged),
        arguments_from_untrusted=tuple(dict.fromkeys(n for names in named.values() for n in names)),
        destinations_from_untrusted=tuple(destinations),
        sources=tuple(
            _source(by_call[c], tuple(named.get(c, ())), excerpts.get(c)) for c in listed
        ),
    )


def _is_destination(name: str, value: JsonValue) -> bool:
    """Whether an argument says where its call sends or reaches: by its name, or by being an
    e-mail address or a URL as a whole."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().replace("-", "_").split("_")
    if DESTINATION_WORDS.intersection(words):
        return True
    return isinstance(value, str) and _ADDRESS_OR_URL.fullmatch(value.strip()) is not None


def _source(result: _Result, arguments: tuple[str, ...], excerpt: str | None) -> TaintSource:
    """A result as a source of taint; with no argument taken from it, its excerpt is the
    first passage output safety neutralised in it (the span flagged), if any."""
    done = result.completed
    if excerpt is None:
        at = result.text.find(NEUTRALISED) if done.injection_suspected else -1
        excerpt = _excerpt(result.text, at, "") if at >= 0 else ""
    return TaintSource(
        step_id=done.step_id,
        call_id=done.call_id,
        tool=done.tool,
        arguments=arguments,
        injection_suspected=result.flagged,
        cues=tuple(sorted([*done.neutralised_by, *([SPOTLIGHT_CUE] if result.forged else [])])),
        excerpt=excerpt,
    )


def _strings(value: JsonValue) -> Iterator[str]:
    """Every string in a JSON value, keys included (a tool may key its result by address)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _fragments(value: JsonValue) -> Iterator[str]:
    """The parts of an argument that could have been copied: each string whole, and the
    addresses, URLs and paths inside it; lower-cased, long enough to mean something."""
    for text in _strings(value):
        whole = text.strip().lower()
        if len(whole) >= SHORTEST_FRAGMENT:
            yield whole
        for match in _FRAGMENT.finditer(whole):
            fragment = match.group().rstrip(_TRAILING)
            if len(fragment) >= SHORTEST_FRAGMENT and fragment != whole:
                yield fragment


def _excerpt(text: str, at: int, fragment: str) -> str:
    """The text around the fragment found at `at` (with none, the text from `at` on: a
    flagged passage), for an approver to read."""
    room = max(0, (EXCERPT_CHARS - len(fragment)) // 2) if fragment else 0
    start = max(0, at - room)
    end = min(len(text), at + len(fragment) + room) if fragment else at + EXCERPT_CHARS
    shown = " ".join(text[start:end].split())[:EXCERPT_CHARS]
    return f"{'…' if start else ''}{shown}{'…' if end < len(text) else ''}"
