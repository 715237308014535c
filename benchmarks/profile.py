"""Profile one service under the step bench: `make profile SERVICE=planner`.

Starts the stack as the step bench does, attaches py-spy (a sampling profiler: the service
runs unchanged, nothing in it is instrumented) to the named service's process, runs the step
bench's sequential sessions and its concurrent ones, then stops py-spy, which writes the
profile to `profiles/` (ignored by git):

    python benchmarks/profile.py planner                       # profiles/planner.svg, a flame graph
    python benchmarks/profile.py state --format speedscope     # open at speedscope.app

py-spy reads the process's memory with ptrace: where that is not allowed (a container
without CAP_SYS_PTRACE, kernel.yama.ptrace_scope above 1), it says so and exits, and the
bench goes on without a profile.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
from pathlib import Path

import uvloop
from steps import SEQUENTIAL_STEPS, SERVICES, SESSIONS, STEPS_EACH, echo_chain, run_sessions
from steps import services_running as stack

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
SEQUENTIAL_SESSIONS = 2
RATE_HZ = 250


async def profile(service: str, output: Path, fmt: str) -> int:
    """Profile `service` under the step bench into `output`; py-spy's exit code."""
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    async with stack() as (nc, store, services):
        await run_sessions(nc, store, "warmup", [echo_chain(5)])
        pid = services.processes[service].pid
        # --nonblocking: sample without pausing the service, so it keeps its pace.
        recorder = await asyncio.create_subprocess_exec(
            *[
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(RATE_HZ),
                "--nonblocking",
                "--format",
                fmt,
                "--output",
                str(output),
            ]
        )
        try:
            for _ in range(SEQUENTIAL_SESSIONS):
                await run_sessions(nc, store, "sequential", [echo_chain(SEQUENTIAL_STEPS)])
            await run_sessions(
                nc, store, "concurrent", [echo_chain(STEPS_EACH) for _ in range(SESSIONS)]
            )
        finally:
            # py-spy writes its profile when interrupted.
            recorder.send_signal(signal.SIGINT)
            code = await asyncio.wait_for(recorder.wait(), 30)
    return code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [name.replace("_", "-") for name in SERVICES]
    parser.add_argument("service", choices=names)
    parser.add_argument(
        "--format", choices=("flamegraph", "speedscope", "raw"), default="flamegraph"
    )
    arguments = parser.parse_args()
    service = arguments.service.replace("-", "_")
    suffix = {"flamegraph": "svg", "speedscope": "speedscope.json", "raw": "txt"}[arguments.format]
    PROFILES.mkdir(exist_ok=True)
    output = PROFILES / f"{arguments.service}.{suffix}"
    code = uvloop.run(profile(service, output, arguments.format))
    if code != 0 or not output.exists():
        sys.exit(f"py-spy could not profile {service} (exit {code}): see its message above")
    print(f"{service}: {output}")


if __name__ == "__main__":
    main()
