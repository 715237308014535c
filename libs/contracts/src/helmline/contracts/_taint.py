"""Taint: what untrusted content a proposed tool call may carry into the world.

A model that read a web page, a mail or an issue may have been steered by it. The planner
records on each call it proposes which of the results in the model's context came from
tools not declared trusted (MCP tools, by default), whether any was flagged as a suspected
injection, and which arguments repeat text found only there (not in the goal nor in what a
person wrote): an address copied from a mail into a `send` call is the shape of
exfiltration. Policy rules match these facts (`taint:`); approvers see the sources.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from helmline.contracts._values import Contract, StepId, ToolName

TaintKind = Literal[
    "influenced_by_untrusted",
    "after_injection_suspected",
    "arguments_from_untrusted",
    "destinations_from_untrusted",
]
"""One fact of a call's taint, by the name of its field in `CallTaint`: what policy rules
match (`taint: [arguments_from_untrusted]`)."""

EXCERPT_CHARS = 160
"""Longest excerpt of a result a taint source quotes."""


class TaintSource(Contract):
    """A result in the model's context that a proposed call may owe something to."""

    step_id: StepId
    """The step whose call returned the result."""
    call_id: str = Field(min_length=1, max_length=128)
    """The call that returned it."""
    tool: ToolName
    """The tool that returned it."""
    arguments: tuple[str, ...] = ()
    """Names of the call's arguments whose text appears in this result (and not in the goal
    nor in what a person wrote)."""
    injection_suspected: bool = False
    """Whether the result is a suspected prompt injection: flagged by output safety, or
    holding the session's spotlight marker or a forged data delimiter."""
    cues: tuple[str, ...] = ()
    """The injection cues output safety found in the result (its `neutralised_by` rules),
    and `spotlight_delimiter` when it held the marker or a forged delimiter."""
    excerpt: str = Field(default="", max_length=EXCERPT_CHARS + 2)
    """The result's text around the first argument found in it: the span an approver should
    read. Empty when no argument came from it."""


class CallTaint(Contract):
    """What untrusted content a proposed call may owe its existence or arguments to.

    Computed by the planner from the session's log when the model proposes the call: only
    results recorded before the model's answer count (they were in its context)."""

    influenced_by_untrusted: bool = False
    """A result of an untrusted tool was in the model's context when it proposed the call."""
    after_injection_suspected: bool = False
    """A result in the model's context was flagged as a suspected prompt injection."""
    arguments_from_untrusted: tuple[str, ...] = ()
    """Names of the arguments (top level) holding an e-mail address, URL, path or other
    string of six characters or more that appears in untrusted output and not in the goal
    nor in a person's input (approval comments, edited arguments)."""
    destinations_from_untrusted: tuple[str, ...] = ()
    """Of those, the arguments that say where the call sends or reaches: one holding an
    e-mail address or a URL found in untrusted output, or one whose name says it is a
    destination (`to`, `recipient`, `url`, `channel`, `account`...). Text copied into a
    ticket's body is an argument from untrusted output; the address a mail goes to, taken
    from the text the model read, is the shape of exfiltration."""
    sources: tuple[TaintSource, ...] = ()
    """The results the arguments came from, and those flagged as suspected injections."""

    def holds(self, kind: TaintKind) -> bool:
        """Whether the call carries this fact of taint."""
        match kind:
            case "influenced_by_untrusted":
                return self.influenced_by_untrusted
            case "after_injection_suspected":
                return self.after_injection_suspected
            case "arguments_from_untrusted":
                return bool(self.arguments_from_untrusted)
            case "destinations_from_untrusted":
                return bool(self.destinations_from_untrusted)

    def described(self) -> str:
        """Where the call's arguments came from, and which results were flagged, in words."""
        parts = []
        for source in self.sources:
            where = f"step {source.step_id} ({source.tool}, call {source.call_id})"
            if source.arguments:
                said = f"{', '.join(source.arguments)} from the result of {where}"
                parts.append(f'{said}: "{source.excerpt}"' if source.excerpt else said)
            if source.injection_suspected:
                cues = f" ({', '.join(source.cues)})" if source.cues else ""
                flagged = f"the result of {where} was flagged as a suspected injection{cues}"
                # With no argument taken from it, its excerpt is the passage flagged.
                shown = source.excerpt and not source.arguments
                parts.append(f'{flagged}: "{source.excerpt}"' if shown else flagged)
        return "; ".join(parts) or "untrusted output was in the model's context"
