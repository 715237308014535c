"""Write the chart's per-service NATS publish permissions from the contracts.

The chart cannot run Python, so the permissions are rendered into
deploy/helm/helmline/files/nats-permissions.json; a test fails when that file differs from
what the contracts say. Usage: python deploy/tools/nats_permissions.py
"""

from __future__ import annotations

import json
from pathlib import Path

from helmline.contracts import SERVICES, nats_permissions

CHART_FILE = Path(__file__).parents[1] / "helm" / "helmline" / "files" / "nats-permissions.json"


def rendered() -> str:
    table = {service: list(nats_permissions(service).publish_allow) for service in SERVICES}
    return json.dumps(table, indent=2) + "\n"


if __name__ == "__main__":
    CHART_FILE.write_text(rendered())
    print(f"wrote {CHART_FILE}")
