"""etcd: three members, one per region (127.0.0.1 us, 127.0.0.2 eu, 127.0.0.3 ap), every
peer-to-peer connection through ``meridian wan-proxy``; clients through ``aetcd`` (PyPI's
maintained asyncio gRPC client of the etcd v3 API).

How the members are a round trip apart: each member listens for its peers on a port of its
own address and *advertises* a wan-proxy port in front of it instead, so every other member
dials it through the proxy (one-way delay rtt/2 each direction).

The transactions. Read-only: one ``Txn`` holding four ``Range`` reads (linearizable: the
leader confirms its leadership with a quorum, one round trip). Read-modify-write: the same
read, then one ``Txn`` that compares the four keys' ``mod_revision`` with what was read and
puts each value + 1; a failed comparison (another client wrote in between) reads again and
retries, counted as a retry. The clients talk to the leader directly (as Meridian's clients
talk to shard leaders in their own region).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from bench.peers.common import (
    RETRY_GRACE_S,
    GaveUp,
    Link,
    Processes,
    RunResult,
    Workload,
    key_name,
    log,
    pick,
    start_wan_proxy,
)

MEMBERS = (("m1", "us", "127.0.0.1"), ("m2", "eu", "127.0.0.2"), ("m3", "ap", "127.0.0.3"))
PRELOAD_BATCH = 128  # etcd's default --max-txn-ops
PRELOAD_CONCURRENCY = 16

NOT_MEASURED = (
    "no sharding (one Raft group holds every key); clients talk to the leader directly "
    "(a client at a follower adds a round trip); read-modify-write is optimistic on the "
    "client (read, then compare mod_revision and put), as etcd's STM does"
)


def unavailable_reason() -> str | None:
    if shutil.which("etcd") is None:
        return "etcd is not installed (Debian package 'etcd-server'; apt-get install -y etcd-server)"
    try:
        import aetcd  # noqa: F401
    except ImportError:
        return "the Python etcd client 'aetcd' is not installed (pip install aetcd)"
    return None


def version() -> str:
    import subprocess

    out = subprocess.run(["etcd", "--version"], check=False, capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip() if out.stdout else ""


class EtcdCluster:
    def __init__(
        self, scratch: Path, processes: Processes, base_port: int, rtt_ms: float, jitter_ms: float
    ) -> None:
        self.dir = scratch
        self.processes = processes
        self.client_port = base_port  # on each member's own address
        self.peer_port = base_port + 1  # where a member listens for its peers
        self.proxy_port = base_port + 2  # the wan-proxy in front of it, which it advertises
        self.control = ("127.0.0.1", base_port + 3)
        self.rtt_ms = rtt_ms
        self.jitter_ms = jitter_ms

    def client_address(self, host: str) -> tuple[str, int]:
        return host, self.client_port

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        start_wan_proxy(
            self.processes, "etcd-wan-proxy",
            [
                Link(f"peers-{region}/etcd", (host, self.proxy_port), (host, self.peer_port))
                for _, region, host in MEMBERS
            ],
            self.rtt_ms, self.jitter_ms, self.control,
        )
        initial = ",".join(f"{name}=http://{host}:{self.proxy_port}" for name, _, host in MEMBERS)
        for name, _, host in MEMBERS:
            self.processes.spawn(f"etcd-{name}", [
                "etcd", "--name", name, "--data-dir", str(self.dir / name),
                "--listen-peer-urls", f"http://{host}:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://{host}:{self.proxy_port}",
                "--listen-client-urls", f"http://{host}:{self.client_port}",
                "--advertise-client-urls", f"http://{host}:{self.client_port}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "meridian-peers-bench",
                "--logger", "zap", "--log-level", "warn",
            ], stop_signal=signal.SIGKILL)  # scratch data: a graceful stop only transfers leadership

    async def leader(self, timeout_s: float = 60.0) -> tuple[str, int]:
        """The client address of the elected leader, once every member agrees on one."""
        import aetcd

        deadline = time.monotonic() + timeout_s
        while True:
            self.processes.check_alive()
            leaders = set()
            for _, _, host in MEMBERS:
                try:
                    async with aetcd.Client(host, self.client_port, timeout=2) as client:
                        status = await client.status()
                        if status.leader is not None:
                            leaders.add(status.leader.client_urls[0])
                        else:
                            leaders.add(None)
                except Exception:
                    leaders.add(None)
            if len(leaders) == 1 and None not in leaders:
                url = leaders.pop().removeprefix("http://")
                host, _, port = url.rpartition(":")
                return host, int(port)
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd: no leader every member agrees on within {timeout_s:g} s")
            await asyncio.sleep(0.1)


async def preload(client: Any, workload: Workload) -> None:
    numbers = list(range(workload.keys))
    batches = [numbers[i : i + PRELOAD_BATCH] for i in range(0, len(numbers), PRELOAD_BATCH)]
    queue = iter(batches)

    async def loader() -> None:
        for batch in queue:
            await client.transaction(
                compare=[],
                success=[client.transactions.put(key_name(n).encode(), b"0") for n in batch],
                failure=[],
            )

    await asyncio.gather(*(loader() for _ in range(PRELOAD_CONCURRENCY)))


async def drive(address: tuple[str, int], workload: Workload, result: RunResult) -> None:
    import aetcd

    async with aetcd.Client(address[0], address[1], timeout=30) as client:
        started = time.monotonic()
        await preload(client, workload)
        log(f"etcd: {workload.keys:,} keys preloaded in {time.monotonic() - started:.1f} s; "
            f"{workload.clients} clients, {workload.duration_s:g} s")
        rng = random.Random(workload.seed)
        txn = client.transactions
        stop_at = time.monotonic() + workload.duration_s

        async def read(keys: list[bytes]) -> list[tuple[int, int]]:
            """(value, mod_revision) of each key, in one linearizable Txn."""
            _, responses = await client.transaction(
                compare=[], success=[txn.get(k) for k in keys], failure=[]
            )
            found = []
            for kvs in responses:
                value, meta = kvs[0]
                found.append((int(value), meta.mod_revision))
            return found

        async def worker() -> None:
            while time.monotonic() < stop_at:
                kind, numbers = pick(rng, workload)
                keys = [key_name(n).encode() for n in numbers]
                begun = time.monotonic()
                try:
                    if kind == "read_only":
                        await read(keys)
                    else:
                        while True:
                            seen = await read(keys)
                            succeeded, _ = await client.transaction(
                                compare=[
                                    txn.mod(k) == revision
                                    for k, (_, revision) in zip(keys, seen, strict=True)
                                ],
                                success=[
                                    txn.put(k, str(value + 1).encode())
                                    for k, (value, _) in zip(keys, seen, strict=True)
                                ],
                                failure=[],
                            )
                            if succeeded:
                                break
                            result.retries += 1
                            if time.monotonic() > stop_at + RETRY_GRACE_S:
                                raise GaveUp("comparison failed until the retry deadline")
                except (aetcd.ClientError, GaveUp) as exc:
                    result.errors += 1
                    result.extra.setdefault("error_examples", [])
                    if len(result.extra["error_examples"]) < 3:
                        result.extra["error_examples"].append(repr(exc)[:200])
                    continue
                result.latencies_s[kind].append(time.monotonic() - begun)
                result.committed[kind] += 1

        cpu = time.process_time()
        begun = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workload.clients)))
        result.elapsed_s = time.monotonic() - begun
        result.driver_cpu_s = time.process_time() - cpu


def run(
    scratch: Path, log_dir: Path, workload: Workload, rtt_ms: float, jitter_ms: float,
    base_port: int,
) -> RunResult:
    result = RunResult("etcd", rtt_ms, not_measured=NOT_MEASURED)
    result.extra["consistency"] = "linearizable reads (no serializable/stale reads)"
    result.extra["client"] = "aetcd (asyncio gRPC), one channel for every client"
    reason = unavailable_reason()
    if reason is not None:
        result.status, result.reason = "unavailable", reason
        return result
    result.extra["version"] = version()
    directory = scratch / f"etcd-{rtt_ms:g}"
    with Processes(log_dir) as processes:
        cluster = EtcdCluster(directory, processes, base_port, rtt_ms, jitter_ms)
        started = time.monotonic()
        cluster.start()

        async def main() -> None:
            leader = await cluster.leader()
            log(f"etcd: 3 members up in {time.monotonic() - started:.1f} s (rtt {rtt_ms:g} ms), "
                f"leader {leader[0]}:{leader[1]}")
            result.extra["leader"] = f"{leader[0]}:{leader[1]}"
            await drive(leader, workload, result)

        asyncio.run(main())
        processes.check_alive()
    with contextlib.suppress(OSError):
        shutil.rmtree(directory)
    return result

