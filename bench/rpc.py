"""RPC core benchmark: Meridian RPC against a C UDP ping-pong and grpc.aio, in one run.

Every figure is measured between two processes on loopback, the server in a child process:

- c_udp_rtt_us_p50: median round trip of a minimal C UDP ping-pong (compiled here with cc);
- rpc_rtt_us_p50: median round trip of a 32-byte Meridian RPC (awaited, one at a time);
- py_uvloop_udp_rtt_us_p50: for context, a bare asyncio DatagramProtocol echo on uvloop (the
  floor for any Python protocol on asyncio), and latency_ratio_vs_py_udp;
- rpc_per_s: Meridian RPCs per second with 64 requests outstanding (64 asyncio tasks, each
  awaiting one call at a time, spread over 8 sessions of eRPC's 8-request window);
- rpc_per_s_continuations: the same with eRPC-style continuations instead of tasks;
- grpc_per_s: grpc.aio unary calls per second with 64 concurrent calls, same payload;
- latency_ratio = rpc_rtt_us_p50 / c_udp_rtt_us_p50 (target <= 1.5);
- throughput_ratio_vs_grpc = rpc_per_s / grpc_per_s (target >= 10).

The measurements are interleaved in rounds (C, RPC, Python echo, RPC throughput, gRPC,
continuations; then again), the figures are medians over rounds and the ratios medians of the
per-round ratios, so load from other processes hits baseline and Meridian alike.

Both Python sides use uvloop, for Meridian and for gRPC alike. By default the scheduler places
the processes (the conditions of the figures in issue 3); MERIDIAN_BENCH_PIN=1 pins every
server to CPU 1 and every client to CPU 0, the C ping-pong's included. Usage:

    python bench/rpc.py            # a table
    python bench/rpc.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PAYLOAD_BYTES = 32
OUTSTANDING = 64
SESSIONS = 8
LATENCY_SAMPLES = 5_000
WARMUP = 1_000
THROUGHPUT_SECONDS = 1.5
ROUNDS = 5
READY_TIMEOUT_S = 30.0
ECHO = 1
GRPC_METHOD = "/meridian.bench.Echo/Echo"

C_PINGPONG = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    char buf[2048];
    if (strcmp(argv[1], "server") == 0) {
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) return 1;
        printf("ready\n");
        fflush(stdout);
        for (;;) {
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
            if (n < 0) continue;
            if (n == 4 && memcmp(buf, "quit", 4) == 0) return 0;
            sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fl);
        }
    }
    int samples = atoi(argv[3]), warmup = atoi(argv[4]), size = atoi(argv[5]);
    long long *rtt = malloc(sizeof(long long) * (size_t)samples);
    memset(buf, 'x', (size_t)size);
    for (int i = 0; i < warmup + samples; i++) {
        long long t0 = now_ns();
        sendto(fd, buf, (size_t)size, 0, (struct sockaddr *)&a, sizeof a);
        recv(fd, buf, sizeof buf, 0);
        if (i >= warmup) rtt[i - warmup] = now_ns() - t0;
    }
    sendto(fd, "quit", 4, 0, (struct sockaddr *)&a, sizeof a);
    qsort(rtt, (size_t)samples, sizeof(long long), cmp);
    printf("%lld\n", rtt[samples / 2]);
    return 0;
}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    # TCP for gRPC uses the same number; both are free with overwhelming likelihood.
    return port


PIN = os.environ.get("MERIDIAN_BENCH_PIN") == "1"


def pin(cpu: int) -> None:
    if PIN and (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu % (os.cpu_count() or 1)})


def spawn_server(args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = proc.stdout.readline()
    if line.strip() != "ready" or time.monotonic() > deadline:
        proc.kill()
        raise RuntimeError(f"server {args} did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- C ping-pong ---------------------------------------------------------------------------


def build_c_pingpong(workdir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) found")
    src = workdir / "pingpong.c"
    exe = workdir / "pingpong"
    src.write_text(C_PINGPONG)
    subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def c_udp_rtt_us(exe: Path, port: int, samples: int) -> float:
    """One round of the C client against the C echo server (a fresh server each round: the
    client's "quit" stops it)."""
    pinned = PIN and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    server = spawn_server(["taskset", "-c", "1", str(exe), "server", str(port)] if pinned
                          else [str(exe), "server", str(port)])
    try:
        out = subprocess.run(
            [*(["taskset", "-c", "0"] if pinned else []),
             str(exe), "client", str(port), str(samples), str(WARMUP), str(PAYLOAD_BYTES)],
            check=True, capture_output=True, text=True, timeout=120,
        )
    finally:
        stop(server)
    return int(out.stdout.strip()) / 1000.0


# --- Meridian RPC --------------------------------------------------------------------------


def serve_rpc(port: int) -> None:
    from store.rpc import Nexus
    from store.rpc.aio import Rpc, new_event_loop

    pin(1)

    async def main() -> None:
        nexus = Nexus()
        nexus.register_req_func(ECHO, lambda _handle, payload: payload)
        Rpc.udp(nexus, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    new_event_loop().run_until_complete(main())


class RpcClient:
    def __init__(self, port: int) -> None:
        self.port = port

    async def start(self) -> None:
        from store.rpc import Nexus
        from store.rpc.aio import Rpc

        self.client = Rpc.udp(Nexus())
        address = ("127.0.0.1", self.port)
        self.sessions = [await self.client.connect(address) for _ in range(SESSIONS)]
        self.payload = b"x" * PAYLOAD_BYTES
        for _ in range(WARMUP):
            await self.client.call(self.sessions[0], ECHO, self.payload)

    async def rtt_us(self, samples: int) -> float:
        """Median round trip, one request at a time."""
        call, session, payload = self.client.call, self.sessions[0], self.payload
        clock = time.perf_counter_ns
        rtts: list[int] = []
        for _ in range(samples):
            t0 = clock()
            await call(session, ECHO, payload)
            rtts.append(clock() - t0)
        return statistics.median(rtts) / 1000.0

    async def per_s_tasks(self, seconds: float) -> float:
        """OUTSTANDING asyncio tasks, each awaiting one call at a time."""
        call, payload = self.client.call, self.payload
        counts: list[int] = []

        async def worker(session: object, stop_at: float) -> None:
            n = 0
            while time.perf_counter() < stop_at:
                for _ in range(64):
                    await call(session, ECHO, payload)  # type: ignore[arg-type]
                n += 64
            counts.append(n)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker(self.sessions[i % SESSIONS], t0 + seconds)
                               for i in range(OUTSTANDING)])
        return sum(counts) / (time.perf_counter() - t0)

    async def per_s_continuations(self, seconds: float) -> float:
        """eRPC style: each response's continuation enqueues the next request."""
        client, payload = self.client, self.payload
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        completed = 0
        in_flight = OUTSTANDING
        stop_at = time.perf_counter() + seconds

        def make_cont(session: object):  # type: ignore[no-untyped-def]
            def cont(_payload: bytes | None, error: object) -> None:
                nonlocal completed, in_flight
                if error is not None:
                    if not done.done():
                        done.set_exception(RuntimeError(str(error)))
                    return
                completed += 1
                if time.perf_counter() < stop_at:
                    client.enqueue_request(session, ECHO, payload, cont)  # type: ignore[arg-type]
                    return
                in_flight -= 1
                if in_flight == 0 and not done.done():
                    done.set_result(None)

            return cont

        t0 = time.perf_counter()
        for i in range(OUTSTANDING):
            session = self.sessions[i % SESSIONS]
            client.enqueue_request(session, ECHO, payload, make_cont(session))
        await done
        return completed / (time.perf_counter() - t0)

    def close(self) -> dict[str, int]:
        stats = self.client.stats()
        self.client.close()
        return stats


# --- bare Python UDP echo (context: the floor of any asyncio datagram protocol) -------------


def serve_pyecho(port: int) -> None:
    import uvloop

    pin(1)

    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.transport.sendto(data, addr)  # type: ignore[attr-defined]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", port))
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.new_event_loop().run_until_complete(main())


async def pyecho_rtt_us(port: int, samples: int) -> float:
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[bytes]] = []

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            if waiter and not waiter[0].done():
                waiter[0].set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    payload = b"x" * PAYLOAD_BYTES
    rtts: list[int] = []
    clock = time.perf_counter_ns
    for i in range(WARMUP + samples):
        fut = loop.create_future()
        waiter[:] = [fut]
        t0 = clock()
        transport.sendto(payload)
        await asyncio.wait_for(fut, 1.0)
        if i >= WARMUP:
            rtts.append(clock() - t0)
    transport.close()
    return statistics.median(rtts) / 1000.0


# --- gRPC ----------------------------------------------------------------------------------


def serve_grpc(port: int) -> None:
    import grpc
    import uvloop

    pin(1)

    async def main() -> None:
        def echo(request: bytes, _context: object) -> bytes:
            return request

        handler = grpc.method_handlers_generic_handler(
            "meridian.bench.Echo",
            {"Echo": grpc.unary_unary_rpc_method_handler(echo)},  # bytes in, bytes out
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.new_event_loop().run_until_complete(main())


async def grpc_per_s(channel: object, seconds: float) -> float:
    echo = channel.unary_unary(GRPC_METHOD)  # type: ignore[attr-defined]
    payload = b"x" * PAYLOAD_BYTES
    counts: list[int] = []

    async def worker(stop_at: float) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            await echo(payload)
            n += 1
        counts.append(n)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(t0 + seconds) for _ in range(OUTSTANDING)])
    return sum(counts) / (time.perf_counter() - t0)


# --- main ----------------------------------------------------------------------------------


def measure(exe: Path, rounds: int) -> dict[str, list[float]]:
    """Interleave the measurements round by round, so that a change in the machine's load
    (other processes) hits the baseline and Meridian alike."""
    import grpc

    from store.rpc.aio import new_event_loop

    rpc_port, grpc_port, c_port = free_port(), free_port(), free_port()
    here = str(Path(__file__).resolve())
    pyecho_port = free_port()
    rpc_server = spawn_server([sys.executable, here, "--serve-rpc", str(rpc_port)])
    pyecho_server = spawn_server([sys.executable, here, "--serve-pyecho", str(pyecho_port)])
    grpc_server = spawn_server([sys.executable, here, "--serve-grpc", str(grpc_port)])
    out: dict[str, list[float]] = {k: [] for k in ("c_rtt", "rpc_rtt", "rpc_per_s",
                                                   "rpc_per_s_cont", "grpc_per_s", "py_rtt")}
    pin(0)

    async def main() -> list[float]:
        client = RpcClient(rpc_port)
        await client.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            await grpc_per_s(channel, 0.3)  # warm up
            for _ in range(rounds):
                out["c_rtt"].append(c_udp_rtt_us(exe, c_port, LATENCY_SAMPLES))
                out["rpc_rtt"].append(await client.rtt_us(LATENCY_SAMPLES))
                out["py_rtt"].append(await pyecho_rtt_us(pyecho_port, LATENCY_SAMPLES))
                out["rpc_per_s"].append(await client.per_s_tasks(THROUGHPUT_SECONDS))
                out["grpc_per_s"].append(await grpc_per_s(channel, THROUGHPUT_SECONDS))
                out["rpc_per_s_cont"].append(await client.per_s_continuations(THROUGHPUT_SECONDS))
        stats = client.close()
        return [float(stats["retransmits"])]

    try:
        loop = new_event_loop()
        out["retransmits"] = loop.run_until_complete(main())
        loop.close()
    finally:
        stop(rpc_server)
        stop(grpc_server)
        stop(pyecho_server)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="interleaved measurement rounds; figures are medians over rounds")
    parser.add_argument("--serve-rpc", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-grpc", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-pyecho", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_rpc is not None:
        serve_rpc(args.serve_rpc)
        return
    if args.serve_pyecho is not None:
        serve_pyecho(args.serve_pyecho)
        return
    if args.serve_grpc is not None:
        serve_grpc(args.serve_grpc)
        return

    with tempfile.TemporaryDirectory() as tmp:
        exe = build_c_pingpong(Path(tmp))
        measured = measure(exe, args.rounds)
    median = statistics.median
    rounds_latency_ratio = [r / c for r, c in zip(measured["rpc_rtt"], measured["c_rtt"], strict=True)]
    rounds_latency_ratio_py = [r / p for r, p in zip(measured["rpc_rtt"], measured["py_rtt"], strict=True)]
    rounds_throughput_ratio = [r / g for r, g in zip(measured["rpc_per_s"], measured["grpc_per_s"], strict=True)]
    result = {
        "payload_bytes": PAYLOAD_BYTES,
        "outstanding": OUTSTANDING,
        "c_udp_rtt_us_p50": round(median(measured["c_rtt"]), 2),
        "rpc_rtt_us_p50": round(median(measured["rpc_rtt"]), 2),
        "py_uvloop_udp_rtt_us_p50": round(median(measured["py_rtt"]), 2),
        "rpc_per_s": round(median(measured["rpc_per_s"])),
        "rpc_per_s_continuations": round(median(measured["rpc_per_s_cont"])),
        "grpc_per_s": round(median(measured["grpc_per_s"])),
        # Ratios are medians of per-round ratios: each round measures both sides back to back,
        # so a change in the machine's load between rounds does not skew them.
        "latency_ratio": round(median(rounds_latency_ratio), 3),
        "throughput_ratio_vs_grpc": round(median(rounds_throughput_ratio), 2),
        "latency_ratio_vs_py_udp": round(median(rounds_latency_ratio_py), 3),
        "rpc_retransmits": int(measured["retransmits"][0]),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "rounds": args.rounds,
        "rounds_detail": {k: [round(v, 2) for v in vs] for k, vs in measured.items()}
        | {"latency_ratio": [round(x, 3) for x in rounds_latency_ratio],
           "throughput_ratio_vs_grpc": [round(x, 2) for x in rounds_throughput_ratio]},
        "event_loop": "uvloop",
        "pinned": PIN,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
