"""Small TCP and TLS endpoints the site network's tests run inside node namespaces.

``python -m tests.testenv.site_probe COMMAND ...`` (through ``SiteHost.exec_prefix``):

* ``echo ADDR PORT``: listen, print ``ready``, echo one connection back, exit.
* ``sink ADDR PORT COUNT``: listen, print ``ready``, read COUNT connections to their end
  (at once), print ``{"bytes": N, "seconds": S}`` from the first accept to the last end.
* ``send ADDR PORT BYTES``: connect and send BYTES zero bytes.
* ``tls-serve ADDR PORT PEM CA COUNT``: listen with TLS requiring a client certificate that
  chains to CA (PEM holds the server's certificate and key), print ``ready``, then one JSON
  line a connection: ``{"ok": true, "peer": "<client CN>"}`` or ``{"ok": false, "error": ...}``.
* ``tls-connect ADDR PORT PEM|- CA NAME``: connect with TLS (PEM: the client certificate
  and key, ``-`` for none), check the server against CA and NAME, print one JSON line.

Each prints its outcome to stdout and exits; they hold no state and write no file.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
import time
from typing import Any

CHUNK = 1 << 16
TIMEOUT_S = 30.0


def _listen(addr: str, port: int) -> socket.socket:
    server = socket.create_server((addr, port))
    server.settimeout(TIMEOUT_S)
    print("ready", flush=True)
    return server


def echo(addr: str, port: int) -> None:
    with _listen(addr, port) as server:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(CHUNK):
                conn.sendall(data)


def sink(addr: str, port: int, count: int) -> None:
    totals: list[int] = []

    def drain(conn: socket.socket) -> None:
        n = 0
        with conn:
            while data := conn.recv(CHUNK):
                n += len(data)
        totals.append(n)

    with _listen(addr, port) as server:
        threads: list[threading.Thread] = []
        for _ in range(count):
            conn, _ = server.accept()
            if not threads:
                started = time.monotonic()
            threads.append(threading.Thread(target=drain, args=(conn,)))
            threads[-1].start()
        for t in threads:
            t.join()
    print(json.dumps({"bytes": sum(totals), "seconds": time.monotonic() - started}))


def send(addr: str, port: int, size: int) -> None:
    block = bytes(CHUNK)
    with socket.create_connection((addr, port), timeout=TIMEOUT_S) as conn:
        left = size
        while left > 0:
            conn.sendall(block[: min(left, CHUNK)])
            left -= CHUNK
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the sink closes once it has read everything


def _common_name(cert: dict[str, Any] | None) -> str:
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def tls_serve(addr: str, port: int, pem: str, ca: str, count: int) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(pem)
    with _listen(addr, port) as server:
        for _ in range(count):
            conn, _ = server.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    outcome = {"ok": True, "peer": _common_name(tls.getpeercert())}
                    tls.sendall(b"hello")
            except (ssl.SSLError, OSError) as exc:
                outcome = {"ok": False, "error": str(exc)}
            print(json.dumps(outcome), flush=True)


def tls_connect(addr: str, port: int, pem: str, ca: str, name: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    if pem != "-":
        context.load_cert_chain(pem)
    try:
        with (
            socket.create_connection((addr, port), timeout=TIMEOUT_S) as conn,
            context.wrap_socket(conn, server_hostname=name) as tls,
        ):
            # TLS 1.3: the server judges the client's certificate after the client's
            # handshake is done; its verdict arrives with the first read.
            greeting = tls.recv(5)
            peer = _common_name(tls.getpeercert())
        outcome: dict[str, Any] = {"ok": greeting == b"hello", "peer": peer}
    except (ssl.SSLError, OSError) as exc:
        outcome = {"ok": False, "error": str(exc)}
    print(json.dumps(outcome), flush=True)


def main(argv: list[str]) -> None:
    command, addr, port, *rest = argv
    match command:
        case "echo":
            echo(addr, int(port))
        case "sink":
            sink(addr, int(port), int(rest[0]))
        case "send":
            send(addr, int(port), int(rest[0]))
        case "tls-serve":
            tls_serve(addr, int(port), rest[0], rest[1], int(rest[2]))
        case "tls-connect":
            tls_connect(addr, int(port), rest[0], rest[1], rest[2])
        case _:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
