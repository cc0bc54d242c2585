"""``python -m store.wan.measure``: what the proxy itself costs, against a direct
connection in the same run (the figures in docs/wan.md).

Round trips are 1-byte echoes on one connection; throughput is a one-way bulk transfer
answered by a byte count. Everything runs on loopback: the proxy on its own thread and
loop, the servers on plain threads, the client here.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import statistics
import threading
import time

from store.wan.link import Address, LinkSpec
from store.wan.thread import ProxyThread

CHUNK_BYTES = 64 * 1024


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := self.request.recv(1 << 20):
            self.request.sendall(data)


class _Sink(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        total = 0
        while data := self.request.recv(1 << 20):
            total += len(data)
        self.request.sendall(total.to_bytes(8, "big"))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _start(handler: type[socketserver.BaseRequestHandler]) -> tuple[_Server, Address]:
    server = _Server(("127.0.0.2", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, Address("127.0.0.2", server.server_address[1])


def _connect(address: Address) -> socket.socket:
    sock = socket.create_connection((address.host, address.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trips_us(address: Address, count: int) -> list[float]:
    with _connect(address) as sock:
        for _ in range(100):  # warm up
            sock.sendall(b"x")
            sock.recv(1)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
            samples.append((time.perf_counter() - started) * 1e6)
    return samples


def throughput_mb_s(address: Address, total_bytes: int) -> float:
    chunk = b"t" * CHUNK_BYTES
    started = time.perf_counter()
    with _connect(address) as sock:
        for _ in range(total_bytes // CHUNK_BYTES):
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < 8:
            answer += sock.recv(8 - len(answer))
    assert int.from_bytes(answer, "big") == total_bytes
    return total_bytes / (time.perf_counter() - started) / 1e6


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(round_trips: int, total_bytes: int, delay_ms: float) -> dict[str, float]:
    echo, echo_at = _start(_Echo)
    sink, sink_at = _start(_Sink)
    links = [
        LinkSpec("echo-0ms", Address("127.0.0.1", 0), echo_at, 0.0),
        LinkSpec("sink-0ms", Address("127.0.0.1", 0), sink_at, 0.0),
        LinkSpec("sink-delay", Address("127.0.0.1", 0), sink_at, delay_ms),
    ]
    try:
        with ProxyThread(links) as proxy:
            direct = round_trips_us(echo_at, round_trips)
            proxied = round_trips_us(proxy.address("echo-0ms"), round_trips)
            direct_mb_s = throughput_mb_s(sink_at, total_bytes)
            proxied_mb_s = throughput_mb_s(proxy.address("sink-0ms"), total_bytes)
            delayed_mb_s = throughput_mb_s(proxy.address("sink-delay"), total_bytes)
    finally:
        echo.shutdown()
        sink.shutdown()
    return {
        "rtt_direct_p50_us": statistics.median(direct),
        "rtt_proxy_0ms_p50_us": statistics.median(proxied),
        "rtt_added_p50_us": statistics.median(proxied) - statistics.median(direct),
        "rtt_direct_p99_us": _percentile(direct, 0.99),
        "rtt_proxy_0ms_p99_us": _percentile(proxied, 0.99),
        "throughput_direct_mb_s": direct_mb_s,
        "throughput_proxy_0ms_mb_s": proxied_mb_s,
        "throughput_proxy_delay_mb_s": delayed_mb_s,
        "throughput_ratio_0ms": proxied_mb_s / direct_mb_s,
        "delay_ms": delay_ms,
        "transfer_bytes": total_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store.wan.measure")
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--transfer-mb", type=int, default=256)
    parser.add_argument("--delay-ms", type=float, default=25.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.round_trips, args.transfer_mb * 1024 * 1024, args.delay_ms)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:32} {value:12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
