"""The texts the injection part reads as data: AgentDojo's injection tasks put into its
attacks' templates as its attacks package does (offline: nothing is sent to a model), and
benign text, the project's own documents and the descriptions of installed packages."""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTDOJO_SUITES = "v1.2.2"
"""The newest version of AgentDojo's task suites in the package."""


@dataclass(frozen=True, slots=True)
class Injection:
    """One attack string: the suite and injection task whose goal it carries, and the attack
    (template) that carries it."""

    suite: str
    task: str
    attack: str
    text: str


def agentdojo_injections() -> list[Injection]:
    """Every injection task of every suite, in every template attack that needs no model to
    compose (AgentDojo's own `attack()`, given a pipeline named after a model it knows)."""
    # Imported here: the package and its model SDKs take seconds to import.
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.attacks import FixedJailbreakAttack, load_attack
    from agentdojo.attacks.attack_registry import ATTACKS
    from agentdojo.task_suite.load_suites import get_suites

    class Target(BasePipelineElement):
        """Names the attacked model (templates address it); never queried."""

        name = "gpt-4o-2024-05-13"

        def query(self, *args: object, **kwargs: object) -> object:
            raise AssertionError("the suite composes attacks offline; no model is asked")

    injections: list[Injection] = []
    for suite_name, suite in get_suites(AGENTDOJO_SUITES).items():
        # Templates that quote the user's task get the suite's first one.
        user_task = next(iter(suite.user_tasks.values()))
        for attack_name, attack_class in sorted(ATTACKS.items()):
            if not issubclass(attack_class, FixedJailbreakAttack) or attack_class.is_dos_attack:
                continue
            attack = load_attack(attack_name, suite, Target())
            for task_id, task in suite.injection_tasks.items():
                # One text per (attack, task): every injection point gets the same one.
                (text,) = set(attack.attack(user_task, task).values())
                injections.append(Injection(suite_name, task_id, attack_name, text))
    return injections


@dataclass(frozen=True, slots=True)
class Benign:
    """A paragraph of text nobody wrote to instruct a model, and where it comes from."""

    source: str
    text: str


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
SHORTEST_PARAGRAPH = 40
"""Shorter blocks (headings, rules, blank lines) are not counted."""


def paragraphs(source: str, text: str) -> Iterator[Benign]:
    for block in _PARAGRAPH_BREAK.split(text):
        if len(block.strip()) >= SHORTEST_PARAGRAPH:
            yield Benign(source, block)


def project_documents() -> list[Path]:
    """The project's Markdown: its README, docs and each package's README."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    for folder in ("libs", "services", "cli"):
        found += sorted((ROOT / folder).glob("*/README.md"))
    return [path for path in found if path.is_file()]


def benign_paragraphs() -> list[Benign]:
    """Paragraphs of the project's documents and of every installed package's description
    (its METADATA, which holds its README)."""
    found: list[Benign] = []
    for path in project_documents():
        found += paragraphs(str(path.relative_to(ROOT)), path.read_text())
    seen: set[str] = set()
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        metadata = distribution.read_text("METADATA")
        if name is None or metadata is None or name.lower() in seen:
            continue
        seen.add(name.lower())
        found += paragraphs(f"{name} METADATA", metadata)
    return found


@dataclass(frozen=True, slots=True)
class InjectedAction:
    """What an injection task wants done: its suite and id, the attack text asking for it,
    and the last call of its ground truth (the harmful one: earlier calls look things up)."""

    suite: str
    task: str
    text: str
    function: str
    arguments: dict[str, object]
    attack: str = "important_instructions"
    """The template attack whose text this is."""


def agentdojo_actions(*attack_names: str) -> list[InjectedAction]:
    """Each injection task of each suite in each attack's template (by default
    `important_instructions` alone), with the call it asks for (a task whose ground truth
    calls nothing asks for its goal as such)."""
    from agentdojo.task_suite.load_suites import get_suites

    names = attack_names or ("important_instructions",)
    texts = {(i.suite, i.task, i.attack): i.text for i in agentdojo_injections()}

    actions: list[InjectedAction] = []
    for suite_name, suite in get_suites(AGENTDOJO_SUITES).items():
        environment = suite.load_and_inject_default_environment({})
        for task_id, task in suite.injection_tasks.items():
            calls = task.ground_truth(environment)
            function, arguments = (
                (calls[-1].function, json.loads(json.dumps(dict(calls[-1].args), default=str)))
                if calls
                else ("as_instructed", {"goal": task.GOAL})
            )
            for name in names:
                text = texts[(suite_name, task_id, name)]
                actions.append(InjectedAction(suite_name, task_id, text, function, arguments, name))
    return actions
