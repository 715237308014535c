"""The Grafana dashboard and the Prometheus alert rules use only metrics the services export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from helmline.runtime import ServiceMetrics

DEPLOY = Path(__file__).parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "helmline.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bhelmline_[a-z0-9_]+\b")


def exported() -> set[str]:
    """Every series name a service's /metrics can show."""
    names: set[str] = set()
    for family in ServiceMetrics("any").registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "gauge": ("",),
        }[family.type]
        names |= {family.name + suffix for suffix in suffixes}
    return names


def _expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item)


def test_every_metric_on_the_dashboard_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    rows = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert {"Activity", "Execution health", "Safety", "Resources", "Bus"} <= rows
    available = exported()
    for panel in panels:
        used = {name for expr in _expressions(panel) for name in METRIC.findall(expr)}
        assert used, f"panel {panel['title']!r} shows no Helmline metric"
        assert used <= available, f"panel {panel['title']!r}: {used - available} not exported"


def test_every_alert_is_well_formed_and_uses_exported_metrics() -> None:
    rules = [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    available = exported()
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"]
        used = set(METRIC.findall(rule["expr"]))
        assert used, f"{rule['alert']} uses no Helmline metric"
        assert used <= available, f"{rule['alert']}: {used - available} not exported"
    names = " ".join(rule["alert"].lower() for rule in rules)
    for topic in ("failure", "denial", "approval", "consumer", "deadletters", "sandbox"):
        assert topic in names, f"no alert about {topic}"
