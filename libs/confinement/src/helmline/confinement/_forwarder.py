"""The egress forwarder: the first process of a sandbox allowed to reach named hosts.

Run inside the sandbox's own network namespace (nothing there but loopback), by the
sandbox's interpreter with nothing of ours importable (`python -I -S forwarder.py`), so this
file uses the standard library only:

    forwarder.py SOCKET [--uid=UID] LISTEN=DESTINATION ... -- COMMAND ARG ...

It listens on each LISTEN address (`127.0.0.1:8080`, or the loopback address the sandbox's
hosts file gives a named host), starts COMMAND with its own stdin, stdout and stderr, and
exits with COMMAND's status. Each connection accepted on a LISTEN address is passed to the
egress proxy outside the sandbox through SOCKET (a unix socket bound in), asking for its
DESTINATION; the proxy decides, and connects out. So the forwarder decides nothing: a
process of the sandbox that talks to SOCKET itself is judged by the same proxy.

A connection to any other port finds nothing listening and is refused by the kernel. When
the sandbox gave the forwarder CAP_NET_RAW, it watches the namespace's TCP packets for such
attempts (a SYN to an address and port it does not listen on) and tells the proxy of each
(`unrouted HOST:PORT`), which records it; COMMAND is then started without that capability,
through setpriv. With `--uid`, COMMAND is started as that uid (and group), through setpriv
too: a sandbox run as root leaves the forwarder root, and the command becomes its
unprivileged uid only after it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading

_CHUNK = 65536


def _relay(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        # The other direction may still be sending: only this one ends.
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def _pass_on(client: socket.socket, proxy_path: str, destination: str) -> None:
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proxy.connect(proxy_path)
        proxy.sendall(destination.encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < 1024:
            chunk = proxy.recv(1)
            if not chunk:
                break
            answer += chunk
        if answer != b"ok\n":
            return
        back = threading.Thread(target=_relay, args=(proxy, client), daemon=True)
        back.start()
        _relay(client, proxy)
        back.join()
    except OSError:
        pass
    finally:
        proxy.close()
        client.close()


def _serve(listener: socket.socket, proxy_path: str, destination: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(
            target=_pass_on, args=(client, proxy_path, destination), daemon=True
        ).start()


_SYN, _ACK = 0x02, 0x10
_UID = "--uid="
_SETPRIV = "/usr/bin/setpriv"  # As `SETPRIV` in _egress: this file imports nothing of ours.


_TOLD_TIMEOUT_S = 2.0
_WATCHING = b"watching\n"  # As `WATCHING` in _egress.
_LOOK_S = 0.05


def _tell(proxy_path: str, line: str) -> None:
    """Tell the proxy, and wait until it has taken note (it closes the connection then):
    what the command was refused is recorded before the forwarder exits with it."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as proxy:
        proxy.settimeout(_TOLD_TIMEOUT_S)
        proxy.connect(proxy_path)
        proxy.sendall(line.encode() + b"\n")
        proxy.recv(1)


def _watch(
    watcher: socket.socket,
    proxy_path: str,
    listening: set[tuple[str, int]],
    ended: threading.Event,
) -> None:
    """Tell the proxy of every connection attempted to a place nothing listens on, until
    the command has `ended` and every packet it sent has been looked at. Asked `sync` on
    the control connection, tell of every attempt made so far first, then say `synced`:
    the proxy learns of all before a call's result is recorded."""
    control: socket.socket | None = None
    with contextlib.suppress(OSError):
        control = socket.socket(socket.AF_UNIX)
        control.connect(proxy_path)
        control.sendall(_WATCHING)
    while True:
        waited = [watcher] if control is None else [watcher, control]
        ready, _, _ = select.select(waited, [], [], _LOOK_S)
        if not ready:
            if ended.is_set():
                return
            continue
        if watcher in ready:
            _look(watcher.recv(65535), proxy_path, listening)
        if control is not None and control in ready:
            try:
                asked = control.recv(64)
                # Every packet of an attempt made before the question is queued already.
                while select.select([watcher], [], [], 0)[0]:
                    _look(watcher.recv(65535), proxy_path, listening)
                control.sendall(b"synced\n" * asked.count(b"\n") if asked else b"")
            except OSError:
                asked = b""
            if not asked:
                control.close()
                control = None


def _look(packet: bytes, proxy_path: str, listening: set[tuple[str, int]]) -> None:
    header = (packet[0] & 0x0F) * 4
    if len(packet) < header + 14:
        return
    flags = packet[header + 13]
    if flags & _SYN and not flags & _ACK:
        address = socket.inet_ntoa(packet[16:20])
        port = int.from_bytes(packet[header + 2 : header + 4], "big")
        if (address, port) not in listening:
            _tell(proxy_path, f"unrouted {address}:{port}")


def _watcher() -> socket.socket | None:
    """A raw socket that sees the namespace's TCP packets, if this process may open one."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    except OSError:
        return None


def main(argv: list[str]) -> int:
    split = argv.index("--")
    proxy_path, routes, command = argv[0], argv[1:split], argv[split + 1 :]
    uid = None
    if routes and routes[0].startswith(_UID):
        uid, routes = int(routes[0].removeprefix(_UID)), routes[1:]
    listening: set[tuple[str, int]] = set()
    for route in routes:
        listen, _, destination = route.partition("=")
        host, _, port = listen.rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(64)
        listening.add((host, int(port)))
        threading.Thread(
            target=_serve, args=(listener, proxy_path, destination), daemon=True
        ).start()
    watcher = _watcher()
    if (watcher is not None or uid is not None) and not os.path.exists(_SETPRIV):
        # The server would keep the capability: better not to start it.
        sys.exit(f"forwarder: given capabilities but no {_SETPRIV} to start the server without")
    ended = threading.Event()
    watching: threading.Thread | None = None
    if watcher is not None:
        watching = threading.Thread(
            target=_watch, args=(watcher, proxy_path, listening, ended), daemon=True
        )
        watching.start()
    if watcher is not None or uid is not None:
        # The server gets no capability: not those that let the forwarder watch, nor those
        # that let it become `uid`, which it does here.
        ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
        drop = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
        command = [_SETPRIV, *ids, *drop, "--", *command]
    # Listening before the server starts: its first connection finds the way open.
    server = subprocess.Popen(command)
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop, lambda number, _frame: server.send_signal(number))
    status = server.wait()
    ended.set()
    if watching is not None:
        # The packets of the command's last attempts are queued already: told before exit
        # (within a bound, should what the command left behind keep sending).
        watching.join(_TOLD_TIMEOUT_S)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
