"""The policy in force: the built-in one, or a file that is reloaded whenever it changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from helmline.approval._policy_file import PolicyFileError, default_policy, load_policy
from helmline.approval._rules import Policy
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, ToolSpec

logger = logging.getLogger(__name__)

_Stamp = tuple[int, int, int]


class PolicySource:
    """Holds the current policy; `watch` swaps in a changed file's policy once it is valid.

    An invalid edit is logged and the policy in force stays, so a typo in the file never
    leaves the service without a policy.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        poll_s: float = 1.0,
        tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME,
    ) -> None:
        self._path = path
        self._poll_s = poll_s
        # The tools policies judge: a live catalogue follows the gateways' registry.
        self.tools = tools
        self._stamp = _stamp(path) if path is not None else None
        self.current: Policy = (
            load_policy(path, tools) if path is not None else default_policy(tools)
        )

    def log_in_force(self) -> None:
        """Say which policy decides (once logging is set up, at the service's start)."""
        policy = self.current
        logger.info("policy %s in force: %d rules, %s", policy.source, len(policy), policy.hash)

    async def watch(self) -> None:
        """Reload the file when it changes, until cancelled (nothing to do for the built-in)."""
        if self._path is None:
            return
        while True:
            await asyncio.sleep(self._poll_s)
            # A large policy takes a while to compile; decisions go on meanwhile.
            await asyncio.to_thread(self.reload_if_changed)

    def reload_if_changed(self) -> bool:
        """Load the file again if it changed on disk; whether another policy is now in force."""
        if self._path is None:
            return False
        stamp = _stamp(self._path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy = load_policy(self._path, self.tools)
        except PolicyFileError as error:
            logger.error(
                "policy file changed but is invalid; keeping %s\n%s", self.current.hash, error
            )
            return False
        if policy.hash == self.current.hash:
            return False
        logger.info("policy reloaded from %s: %d rules, %s", self._path, len(policy), policy.hash)
        self.current = policy
        return True


def _stamp(path: Path) -> _Stamp | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino)
