"""schemathesis fuzzes every operation of the published OpenAPI document against the running
API, as an admin of a tenant of its own: no input may make it answer with a 5xx."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from tests.api.conftest import KeyMaker

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"


async def test_no_input_makes_the_api_fail_with_a_server_error(
    api_url: str, make_key: KeyMaker, tenant: str, tmp_path: Path
) -> None:
    admin = await make_key(tenant, "admin")
    # Run as its own process: the API answers from this test's event loop meanwhile.
    fuzz = await asyncio.create_subprocess_exec(
        str(SCHEMATHESIS),
        "run",
        f"{api_url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--header",
        f"Authorization: {admin['Authorization']}",
        # The event streams never end by design; they are tested on their own.
        "--exclude-path-regex",
        "events$",
        "--max-examples",
        "25",
        "--phases",
        "examples,coverage,fuzzing",
        "--seed",
        "9",
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--no-color",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    output, _ = await asyncio.wait_for(fuzz.communicate(), timeout=600)
    report = output.decode()
    assert fuzz.returncode == 0, report[-6000:]
    # Proof that requests were made at all, e.g. "860 generated, 860 passed".
    passed = re.search(r"\d+ generated, (\d+) passed", report)
    assert passed is not None, report[-3000:]
    assert int(passed.group(1)) > 100, report[-3000:]
