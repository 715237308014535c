"""`helmline schema export`: the contracts' JSON Schemas, written where they are committed."""

from __future__ import annotations

import json
from pathlib import Path

import helmline.contracts
from helmline.cli._errors import CliError


def default_schema_dir() -> Path:
    """`libs/contracts/schema/` of the checkout the contracts package is installed from."""
    package = Path(helmline.contracts.__file__).resolve().parent
    # src/helmline/contracts -> the distribution's root, when installed from a checkout.
    root = package.parents[2]
    if not (root / "pyproject.toml").is_file():
        raise CliError(
            f"helmline.contracts is not installed from a source checkout ({package}); "
            "pass --out to say where the schemas go"
        )
    return root / "schema"


CHART_PERMISSIONS = Path("deploy/helm/helmline/files/nats-permissions.json")
"""Where the Helm chart keeps the services' NATS permissions (it cannot run Python)."""


def export_chart_permissions(schema_dir: Path) -> Path | None:
    """Write the services' NATS publish permissions into the chart of the checkout whose
    `libs/contracts/schema` is `schema_dir`; None when that checkout has no chart."""
    target = schema_dir.resolve().parents[2] / CHART_PERMISSIONS
    if not target.parent.is_dir():
        return None
    text = json.dumps(helmline.contracts.nats_permissions_table(), indent=2) + "\n"
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        target.write_text(text, encoding="utf-8")
    return target


def export_schemas(out: Path) -> int:
    """Write every schema under `out`, remove stale ones there, and return how many were written."""
    schemas = helmline.contracts.export_schemas()
    out = out.resolve()
    written: set[Path] = set()
    for relative, schema in schemas.items():
        target = (out / relative).resolve()
        if not target.is_relative_to(out):
            raise CliError(f"schema name {relative!r} points outside {out}")
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
        # Unchanged files keep their timestamps, so make and editors see no change.
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.add(target)
    for stale in out.rglob("*.json"):
        if stale.resolve() not in written:
            stale.unlink()
    # Deepest first, so a folder emptied by the removals above goes too.
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return len(written)
