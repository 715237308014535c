"""The sample session `up` starts, so that a newcomer has something to approve at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helmline.cli._connection import connect
from helmline.cli._follow import last_started_seq
from helmline.cli._playbook_file import load_playbook
from helmline.cli._sessions import start_session

SAMPLE_TENANT = "default"


def sample_playbook() -> Path | None:
    """`examples/playbooks/hello.yaml` of the source tree this CLI runs from, if there is one.

    The examples are not part of the installed package: from an installed wheel (a container
    image) there is no sample, and `up` says so instead of inventing one.
    """
    candidate = Path(__file__).resolve().parents[4] / "examples" / "playbooks" / "hello.yaml"
    return candidate if candidate.is_file() else None


def start_sample(nats_url: str, playbook: Path, *, tenant: str = SAMPLE_TENANT) -> str | None:
    """Start a session from `playbook` on the stack at `nats_url`; its id.

    None when the log already has sessions: a data folder's first `up` shows the newcomer
    something to approve, and later ones do not pile up samples.
    """
    loaded = load_playbook(playbook)

    async def start() -> str | None:
        async with connect(nats_url) as log:
            if await last_started_seq(log.js, tenant) > 0:
                return None
            session_id, _ = await start_session(log, loaded, tenant=tenant)
            return session_id

    return asyncio.run(start())
