"""Servers and clients for the wan-proxy tests: plain threads and blocking sockets, so the
proxy's own loop is the only event loop involved."""

from __future__ import annotations

import hashlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from store.wan import Address, LinkSpec, ProxyThread

# The far region's server listens on another loopback address, as in a local cluster.
TARGET_HOST = "127.0.0.2"
LISTEN_HOST = "127.0.0.1"
IO_TIMEOUT_S = 15.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := self.request.recv(1 << 20):
            self.request.sendall(data)


class _Sink(socketserver.BaseRequestHandler):
    """Reads to end of stream, then answers with the byte count (8 bytes, big-endian) and
    the SHA-256 of what it read."""

    stall_s = 0.0

    def handle(self) -> None:
        time.sleep(self.stall_s)  # lets the proxy's writes back up
        total, digest = 0, hashlib.sha256()
        while data := self.request.recv(1 << 20):
            total += len(data)
            digest.update(data)
        self.request.sendall(total.to_bytes(8, "big") + digest.digest())


class _StallingSink(_Sink):
    stall_s = 0.5


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def server(kind: str) -> Iterator[Address]:
    handler = {"echo": _Echo, "sink": _Sink, "stalling-sink": _StallingSink}[kind]
    srv = _Server((TARGET_HOST, 0), handler)
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield Address(TARGET_HOST, srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


@contextmanager
def proxy_to(
    target: Address, delay_ms: float, jitter_ms: float = 0.0, name: str = "us-eu", **kw: object
) -> Iterator[ProxyThread]:
    spec = LinkSpec(name, Address(LISTEN_HOST, 0), target, delay_ms, jitter_ms)
    with ProxyThread([spec], **kw) as proxy:  # type: ignore[arg-type]
        yield proxy


def connect(address: Address) -> socket.socket:
    sock = socket.create_connection((address.host, address.port), timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    parts = []
    while count:
        data = sock.recv(min(count, 1 << 20))
        if not data:
            raise ConnectionError("closed early")
        parts.append(data)
        count -= len(data)
    return b"".join(parts)


def round_trip_s(sock: socket.socket, payload: bytes = b"x") -> float:
    started = time.perf_counter()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.perf_counter() - started
