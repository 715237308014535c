"""Each event type is one class that declares everything about it; the catalogue is derived."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from typing import Any, Self

import pytest

from helmline.contracts import PAYLOAD_CLASSES, Payload, events


def test_every_aggregate_module_is_in_the_catalogue() -> None:
    modules = {
        f"{events.__name__}.{module.name}"
        for module in pkgutil.iter_modules(events.__path__)
        if not module.name.startswith("_")
    }
    assert modules == {payload.__module__ for payload in PAYLOAD_CLASSES}, (
        "add the module to `_AGGREGATES` in helmline/contracts/events/__init__.py"
    )
    types = [payload.TYPE for payload in PAYLOAD_CLASSES]
    assert len(types) == len(set(types))


def test_the_package_exports_at_run_time_what_its_modules_define() -> None:
    # mypy reads the names from the star imports, so it sees every public name a module
    # binds; at run time `__all__` must keep the same ones (annotate a constant to export it).
    bound: set[str] = set()
    for module in {payload.__module__ for payload in PAYLOAD_CLASSES}:
        for node in ast.parse(inspect.getsource(importlib.import_module(module))).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                bound.add(node.name)
            elif isinstance(node, ast.AnnAssign | ast.Assign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound.update(t.id for t in targets if isinstance(t, ast.Name))
    exported = set(vars(events)["__all__"])  # hidden from mypy, which reads the star imports
    assert exported == {"PAYLOAD_CLASSES"} | {n for n in bound if not n.startswith("_")}


def _declare(**declaration: Any) -> type[Payload]:
    class Declared(Payload, **declaration):
        count: int = 0

        @classmethod
        def example(cls) -> Self:
            return cls()

    return Declared


def test_an_incomplete_declaration_fails_at_class_creation() -> None:
    declared = _declare(type="test.declared", published_by=("planner",))
    assert declared.TYPE == "test.declared"
    assert declared.SCHEMA_VERSION == 1
    with pytest.raises(TypeError, match="published_by"):
        _declare(type="test.declared", published_by=("mailroom",))
    with pytest.raises(TypeError, match=r"needs exactly the upcasters \['upcast_v1_v2'\]"):
        _declare(type="test.declared", version=2, published_by=("planner",))
    with pytest.raises(TypeError, match="declares no example"):

        class NoExample(Payload, type="test.no_example", published_by=("planner",)):
            pass
