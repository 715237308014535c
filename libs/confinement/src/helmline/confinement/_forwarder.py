"""The egress forwarder: the first process of a sandbox allowed to reach named hosts.

Run inside the sandbox's own network namespace (nothing there but loopback), by the
sandbox's interpreter with nothing of ours importable (`python -I -S forwarder.py`), so this
file uses the standard library only:

    forwarder.py SOCKET LISTEN=DESTINATION ... -- COMMAND ARG ...

It listens on each LISTEN address (`127.0.0.1:8080`, or the loopback address the sandbox's
hosts file gives a named host), starts COMMAND with its own stdin, stdout and stderr, and
exits with COMMAND's status. Each connection accepted on a LISTEN address is passed to the
egress proxy outside the sandbox through SOCKET (a unix socket bound in), asking for its
DESTINATION; the proxy decides, and connects out. So the forwarder decides nothing: a
process of the sandbox that talks to SOCKET itself is judged by the same proxy.
"""

from __future__ import annotations

import contextlib
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


def main(argv: list[str]) -> int:
    split = argv.index("--")
    proxy_path, routes, command = argv[0], argv[1:split], argv[split + 1 :]
    for route in routes:
        listen, _, destination = route.partition("=")
        host, _, port = listen.rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(64)
        threading.Thread(
            target=_serve, args=(listener, proxy_path, destination), daemon=True
        ).start()
    # Listening before the server starts: its first connection finds the way open.
    server = subprocess.Popen(command)
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop, lambda number, _frame: server.send_signal(number))
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
