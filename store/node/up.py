"""``meridian up``: start every process of a local cluster, wait for it, stop it cleanly.

Each shard leader is a child process (``meridian serve``). The children watch their parent
and exit if it disappears, and ``up`` stops every child on Ctrl-C or SIGTERM (SIGTERM, then
SIGKILL for any that linger), so stopping ``up`` leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from store.config import ClusterConfig


class ProcessCluster:
    """The processes of one cluster file on this machine."""

    def __init__(self, config: ClusterConfig, python: str = sys.executable) -> None:
        self.config = config
        self.python = python
        self.children: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []

    def start(self) -> None:
        from store.node.server import log_name

        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        assert self.config.path is not None, "a cluster started by 'up' needs a file"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRPC_VERBOSITY": "ERROR"}
        # Leaders first (children[s] is shard s's leader), then followers, then the proxy.
        for node in self.config.nodes():
            command = [
                self.python, "-m", "store.cli", "serve", "--config", str(self.config.path),
                "--shard", str(node.shard), "--role", node.role,
            ]
            if node.role == "follower":
                command += ["--region", node.region]
            self._spawn(log_name(node), command, env)
        if self.config.wan is not None:
            wan = self.config.wan
            command = [
                self.python, "-m", "store.wan", "--delay-ms", str(wan.rtt_ms / 2),
                "--jitter-ms", str(wan.jitter_ms), "--control", f"{wan.control[0]}:{wan.control[1]}",
            ]
            for name, listen, target, source, _, _ in self.config.wan_links():
                command += [
                    "--link",
                    f"{name}={listen[0]}:{listen[1]}>{target[0]}:{target[1]}@{source}",
                ]
            self._spawn("wan-proxy", command, env)

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> None:
        out = open(self.config.run_dir / f"{name}.out", "ab")  # noqa: SIM115
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        out.close()
        self.children.append(child)
        self.names.append(name)

    def wait_ready(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Waits until every shard answers a status request; returns the statuses."""
        from store.client import Client

        async def poll() -> list[dict[str, Any]]:
            deadline = time.monotonic() + timeout_s
            client = await Client.connect(self.config, connect_timeout_s=0.5)
            try:
                while True:
                    self._check_children()
                    statuses = await client.status(replicas=True)
                    if all(statuses):
                        return [s for s in statuses if s is not None]
                    if time.monotonic() > deadline:
                        nodes = self.config.nodes()
                        missing = [nodes[i].address for i, s in enumerate(statuses) if s is None]
                        raise TimeoutError(f"{missing} did not answer in {timeout_s} s")
                    await asyncio.sleep(0.1)
            finally:
                await client.close()

        return asyncio.run(poll())

    def _check_children(self) -> None:
        for name, child in zip(self.names, self.children, strict=True):
            code = child.poll()
            if code is not None:
                log = self.config.run_dir / f"{name}.out"
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {code}:\n{tail}")

    def stop(self, grace_s: float = 5.0) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def pids(self) -> list[int]:
        return [child.pid for child in self.children]


def describe(config: ClusterConfig, statuses: list[dict[str, Any]]) -> str:
    lines = [f"cluster {config.name!r}: {len(config.shards)} shard(s), regions {', '.join(config.regions)}"]
    for status in statuses:
        lines.append(
            f"  shard {status['shard']}  {status['role']:<8} {status['address']:<16} "
            f"region {status['region']}  pid {status['pid']}"
        )
    if config.wan is not None:
        lines.append(
            f"  wan-proxy: {config.wan.rtt_ms:g} ms round trips between regions, control "
            f"{config.wan.control[0]}:{config.wan.control[1]}"
        )
    lines.append(f"  cluster file: {config.path}")
    lines.append(f"  logs: {config.run_dir}/shard-<n>.log (JSON lines), shard-<n>.out")
    return "\n".join(lines)


def run_up(config: ClusterConfig) -> int:
    cluster = ProcessCluster(config)
    stop_requested = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        cluster.start()
        statuses = cluster.wait_ready()
        print(describe(config, statuses), flush=True)
        print("ready; Ctrl-C stops the cluster", flush=True)
        while not stop_requested:
            time.sleep(0.2)
            if not stop_requested:
                cluster._check_children()
    except (RuntimeError, TimeoutError) as exc:
        if stop_requested:
            return 0
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        cluster.stop()
        print("stopped", flush=True)
    return 0


def format_status(config: ClusterConfig, statuses: list[dict[str, Any] | None]) -> str:
    lines = [f"{'shard':>5}  {'leader':<21} {'health':<8} {'watermark':>9} {'keys':>8} {'in-flight':>9} {'certified':>9} {'committed':>9} {'aborted':>8}"]
    for shard, status in zip(config.shards, statuses, strict=True):
        if status is None:
            lines.append(f"{shard.shard:>5}  {shard.leader_address:<21} {'DOWN':<8}")
            continue
        counters = status["counters"]
        lines.append(
            f"{shard.shard:>5}  {status['address']:<21} {'up':<8} {status['watermark']:>9} "
            f"{status['keys']:>8} {status['in_flight']:>9} {counters['certified']:>9} "
            f"{counters['committed']:>9} {counters['aborted']:>8}"
        )
    return "\n".join(lines)


def run_status(config: ClusterConfig) -> int:
    from store.client import Client

    async def fetch() -> list[dict[str, Any] | None]:
        client = await Client.connect(config, connect_timeout_s=0.5, attempt_timeout_s=0.5)
        try:
            return await client.status()
        finally:
            await client.close()

    statuses = asyncio.run(fetch())
    print(format_status(config, statuses))
    return 0 if all(statuses) else 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
