"""UDP transport: kernel datagram sockets, batched recvmmsg/sendmmsg done in C.

The core's opaque addresses are raw `struct sockaddr_in` / `sockaddr_in6` bytes, exactly as
recvmmsg reports a sender, so the C side compares them with memcmp and hands them straight to
sendmmsg; Python converts (host, port) only when a session is created.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Final

from store.rpc import _native
from store.rpc.endpoint import Transport
from store.rpc.settings import RpcSettings, check_rx_datagrams_per_poll

UDP_PAYLOAD_MAX = 65507
SOCKET_BUFFER_BYTES = 4 << 20
RX_DATAGRAMS_PER_POLL: Final = RpcSettings().rx_datagrams_per_poll
RX_BATCHES_MAX: Final = 16  # recvmmsg calls per receive (each of up to 64 datagrams)


def encode_sockaddr(host: str, port: int) -> bytes:
    """(host, port) to the kernel's sockaddr bytes (IPv4 or IPv6, resolved once)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"bad port {port}")
    try:
        packed = socket.inet_pton(socket.AF_INET, host)
        family = socket.AF_INET
    except OSError:
        try:
            packed = socket.inet_pton(socket.AF_INET6, host)
            family = socket.AF_INET6
        except OSError:
            info = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
            packed = socket.inet_pton(socket.AF_INET, str(info[0][4][0]))
            family = socket.AF_INET
    if family == socket.AF_INET:
        return struct.pack("=H", family) + struct.pack("!H", port) + packed + bytes(8)
    return struct.pack("=H", family) + struct.pack("!HI", port, 0) + packed + struct.pack("=I", 0)


def decode_sockaddr(raw: bytes) -> tuple[str, int]:
    (family,) = struct.unpack_from("=H", raw)
    (port,) = struct.unpack_from("!H", raw, 2)
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
    return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port


def source_address_toward(host: str) -> str:
    """The local address this machine sends from toward ``host`` (asked of the kernel's
    routing table: connecting a UDP socket sends nothing). A client binds there, so that its
    datagrams leave with an address the servers can answer: 127.0.0.1 for a cluster on
    loopback, the right interface's address for one on a network."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
        except OSError:  # no route now: loopback, and the first send says what is wrong
            return "::1" if family == socket.AF_INET6 else "127.0.0.1"
        return str(probe.getsockname()[0])


class UdpTransport(Transport):
    """A non-blocking UDP socket bound to (host, port); port 0 picks a free one."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, mtu_bytes: int = 1472,
        rx_datagrams_per_poll: int = RX_DATAGRAMS_PER_POLL,
    ) -> None:
        if not 64 <= mtu_bytes <= UDP_PAYLOAD_MAX:
            raise ValueError(f"mtu_bytes must be in [64, {UDP_PAYLOAD_MAX}]")
        check_rx_datagrams_per_poll(rx_datagrams_per_poll)
        self.mtu_bytes = mtu_bytes
        # RpcSettings.rx_datagrams_per_poll: the rest wait for the loop's next turn.
        self.rx_datagrams_per_poll = rx_datagrams_per_poll
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            # Best effort: the kernel caps these at net.core.[rw]mem_max.
            self.sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        self.sock.bind((host, port))
        self._fd = self.sock.fileno()
        bound = self.sock.getsockname()
        self.address: tuple[str, int] = (bound[0], bound[1])

    def encode_address(self, address: Any) -> bytes:
        host, port = address
        return encode_sockaddr(host, int(port))

    def decode_address(self, raw: bytes) -> tuple[str, int]:
        return decode_sockaddr(raw)

    def receive(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        return core.udp_recv(self._fd, now_ns, RX_BATCHES_MAX, self.rx_datagrams_per_poll)

    def receive_all(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        return core.udp_recv(self._fd, now_ns, RX_BATCHES_MAX, 0)

    def flush(self, core: _native.Core) -> None:
        if core.pending_packets():
            core.udp_send(self._fd)

    def fileno(self) -> int | None:
        return self._fd

    def close(self) -> None:
        self.sock.close()
