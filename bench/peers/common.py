"""What every system's run shares: the workload, the result of a run, child processes, and
the wide-area links through ``meridian wan-proxy``.

The workload (identical for every system): ``keys`` keys preloaded with the value 0; each
transaction touches 4 distinct keys chosen uniformly; half the transactions read the 4
keys (read-only), half read them and write each one +1 (read-modify-write); ``clients``
closed-loop clients; only committed transactions count, and a transaction that aborts or
meets a serialization failure is retried until it commits (each retry counted).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]

KINDS = ("read_only", "rmw")

# A transaction still retrying this long after the run's end is given up (counted in errors):
# retries are unbounded during the run, but a run must end.
RETRY_GRACE_S = 30.0


class GaveUp(Exception):
    """A transaction retried past the run's end plus ``RETRY_GRACE_S``."""


@dataclass(frozen=True)
class Workload:
    keys: int = 100_000
    clients: int = 64
    duration_s: float = 30.0
    keys_per_txn: int = 4
    read_only_fraction: float = 0.5
    seed: int = 1

    def describe(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "keys_per_txn": self.keys_per_txn,
            "key_choice": "distinct, uniform over all keys",
            "mix": {"read_only": self.read_only_fraction, "rmw": 1 - self.read_only_fraction},
            "rmw": "read the keys, write each one +1",
            "clients": self.clients,
            "closed_loop": True,
            "duration_s": self.duration_s,
            "counted": "committed transactions only; aborts and serialization failures are retried",
        }


def pick(rng: random.Random, workload: Workload) -> tuple[str, list[int]]:
    """One transaction: its kind and its distinct key numbers (0 .. keys-1)."""
    kind = "read_only" if rng.random() < workload.read_only_fraction else "rmw"
    return kind, rng.sample(range(workload.keys), workload.keys_per_txn)


def key_name(number: int) -> str:
    return f"kv/{number:06d}"


@dataclass
class RunResult:
    """One system at one round trip. ``latencies_s`` holds every committed transaction's
    latency by kind (for percentiles and CDFs; not written to report.json)."""

    system: str
    rtt_ms: float
    status: str = "ok"  # "ok", "failed" or "unavailable"
    reason: str = ""
    elapsed_s: float = 0.0
    committed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    retries: int = 0  # attempts that aborted / failed serialization and were retried
    errors: int = 0  # transactions that ended in an error other than a conflict
    latencies_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    extra: dict[str, Any] = field(default_factory=dict)
    not_measured: str = ""
    latency_means: str = "from submission until the client had the committed answer"
    driver_cpu_s: float | None = None

    @property
    def total(self) -> int:
        return sum(self.committed.values())

    def all_latencies(self) -> list[float]:
        return [x for kind in KINDS for x in self.latencies_s[kind]]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"system": self.system, "rtt_ms": self.rtt_ms, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.status != "ok":
            out["not_measured"] = self.not_measured
            return out
        out.update({
            "elapsed_s": round(self.elapsed_s, 3),
            "committed": self.total,
            "committed_by_kind": dict(self.committed),
            "txn_per_s": round(self.total / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "p50_ms": percentile_ms(self.all_latencies(), 50),
            "p99_ms": percentile_ms(self.all_latencies(), 99),
            "by_kind": {
                kind: {
                    "p50_ms": percentile_ms(self.latencies_s[kind], 50),
                    "p99_ms": percentile_ms(self.latencies_s[kind], 99),
                    # With closed-loop clients, throughput is clients / mean latency.
                    "mean_ms": mean_ms(self.latencies_s[kind]),
                    # The tail's share: a Meridian read-only transaction that read a version
                    # not yet durable waits for its commit (about a wide-area round).
                    "over_10ms_share": share_at_least(self.latencies_s[kind], 0.010),
                }
                for kind in KINDS
            },
            "retries": self.retries,
            "errors": self.errors,
            "latency": self.latency_means,
            "not_measured": self.not_measured,
        })
        if self.driver_cpu_s is not None:
            out["driver_cpu_s"] = round(self.driver_cpu_s, 2)
            out["driver_cpu_share"] = round(self.driver_cpu_s / max(self.elapsed_s, 1e-9), 2)
        out.update(self.extra)
        return out


def percentile_ms(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    # Nearest rank: the smallest value with at least p% of the values at or below it.
    rank = max(1, -(-len(ordered) * p // 100))
    return round(ordered[int(rank) - 1] * 1000, 3)


def share_at_least(values: Sequence[float], limit_s: float) -> float | None:
    """The fraction of ``values`` at or above ``limit_s`` (None for none)."""
    if not values:
        return None
    return round(sum(1 for x in values if x >= limit_s) / len(values), 5)


def mean_ms(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values) * 1000, 3) if values else None


def log(message: str) -> None:
    print(f"peers: {message}", file=sys.stderr, flush=True)


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05,
    check: Callable[[], None] | None = None,
) -> Any:
    """Polls ``condition`` until it returns something true, or raises TimeoutError naming
    ``what``; ``check`` runs before every poll (to fail fast when a process died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


class Processes:
    """Child processes, each in a process group of its own, stopped together: ``stop``
    signals each group (``stop_signal``, then SIGKILL after a grace period), so that no
    grandchild outlives the run. Use it in a ``with`` block (or try/finally)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen[bytes], int]] = []

    def spawn(
        self, name: str, command: list[str], *, user: str | None = None,
        stop_signal: int = signal.SIGTERM, env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out: IO[bytes]
        with open(self.log_path(name), "ab") as out:
            child = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=cwd, **_as_user(user),
            )
        self.children.append((name, child, stop_signal))
        return child

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def tail(self, name: str, chars: int = 1500) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check_alive(self) -> None:
        for name, child, _ in self.children:
            code = child.poll()
            if code is not None:
                raise RuntimeError(f"{name} exited with {code}:\n{self.tail(name)}")

    def stop(self, grace_s: float = 10.0) -> None:
        for _, child, stop_signal in reversed(self.children):
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, stop_signal)
        deadline = time.monotonic() + grace_s
        for _, child, _ in reversed(self.children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            # Whatever is left in the group (the child itself or a grandchild) is killed.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        self.children.clear()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _as_user(user: str | None) -> dict[str, Any]:
    """Popen's arguments that run a child as ``user`` (its own group, no other groups)."""
    if user is None:
        return {}
    import pwd

    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@dataclass(frozen=True)
class Link:
    """One wan-proxy link: connections to ``listen`` reach ``target`` one ``rtt/2`` later
    each way; ``source`` is the host the proxy connects from (the caller's region)."""

    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    source: str | None = None

    def argument(self) -> str:
        spec = f"{self.name}={self.listen[0]}:{self.listen[1]}>{self.target[0]}:{self.target[1]}"
        return spec + (f"@{self.source}" if self.source else "")


def jitter_for(rtt_ms: float, jitter_ms: float) -> float:
    """Jitter applies only on a delayed link (0 ms stays 0 ms for every system)."""
    return jitter_ms if rtt_ms > 0 else 0.0


def start_wan_proxy(
    processes: Processes, name: str, links: Sequence[Link], rtt_ms: float, jitter_ms: float,
    control: tuple[str, int],
) -> None:
    """``meridian wan-proxy`` (``python -m store.wan``) with ``links``, one way rtt/2;
    returns once it printed its ready line."""
    command = [
        sys.executable, "-m", "store.wan", "--delay-ms", str(rtt_ms / 2),
        "--jitter-ms", str(jitter_for(rtt_ms, jitter_ms)),
        "--control", f"{control[0]}:{control[1]}",
    ]
    for link in links:
        command += ["--link", link.argument()]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    processes.spawn(name, command, env=env)
    wait_for(
        lambda: "wan-proxy ready" in processes.tail(name, 100_000), 30, f"{name} ready",
        check=processes.check_alive,
    )


def busy_ports(addresses: Sequence[tuple[str, int]]) -> list[str]:
    """The addresses among ``addresses`` that something already listens on (TCP)."""
    import socket

    busy = []
    for host, port in addresses:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                busy.append(f"{host}:{port}")
    return busy
