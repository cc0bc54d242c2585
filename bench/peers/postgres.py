"""PostgreSQL: a primary (region us, 127.0.0.1) and one synchronous standby (region eu,
127.0.0.2) whose replication connection goes through ``meridian wan-proxy``, driven by
``pgbench`` with two weighted custom scripts.

Durability: ``synchronous_commit = on`` and ``synchronous_standby_names`` name the standby,
so a writing transaction's commit returns once the standby has flushed its WAL (one round
trip). Isolation: SERIALIZABLE (``default_transaction_isolation``), the level that matches
Meridian's strict serializability; serialization failures and deadlocks are retried by
pgbench (``--max-tries 0``: until they commit) and counted as retries.

The servers run as the ``postgres`` system user (PostgreSQL refuses root), each in a process
group of its own, data directories under the run's scratch directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

from bench.peers.common import (
    KINDS,
    Link,
    Processes,
    RunResult,
    Workload,
    log,
    start_wan_proxy,
    wait_for,
)

USER = "postgres"
STANDBY = "standby1"

NOT_MEASURED = (
    "2 regions only (primary + 1 synchronous standby; nothing in the third); no automatic "
    "failover (a standby is promoted by an operator or an outside tool); read-only "
    "transactions are answered by the primary alone (they write nothing, so they never "
    "wait for the standby)"
)

# Four distinct keys, uniform over 1..nkeys: draw each from the keys not yet drawn, by
# drawing a rank and stepping over the keys already taken in increasing order.
KEYS_SQL = r"""\set k1 random(1, :nkeys)
\set r2 random(1, :nkeys - 1)
\set k2 case when :r2 >= :k1 then :r2 + 1 else :r2 end
\set lo2 least(:k1, :k2)
\set hi2 greatest(:k1, :k2)
\set r3 random(1, :nkeys - 2)
\set s3 case when :r3 >= :lo2 then :r3 + 1 else :r3 end
\set k3 case when :s3 >= :hi2 then :s3 + 1 else :s3 end
\set lo3 least(:k1, :k2, :k3)
\set hi3 greatest(:k1, :k2, :k3)
\set mid3 :k1 + :k2 + :k3 - :lo3 - :hi3
\set r4 random(1, :nkeys - 3)
\set s4 case when :r4 >= :lo3 then :r4 + 1 else :r4 end
\set t4 case when :s4 >= :mid3 then :s4 + 1 else :s4 end
\set k4 case when :t4 >= :hi3 then :t4 + 1 else :t4 end
"""

READ_ONLY_SQL = KEYS_SQL + "SELECT k, v FROM kv WHERE k IN (:k1, :k2, :k3, :k4);\n"

RMW_SQL = KEYS_SQL + (
    "BEGIN;\n"
    "SELECT k, v FROM kv WHERE k IN (:k1, :k2, :k3, :k4);\n"
    "UPDATE kv SET v = v + 1 WHERE k IN (:k1, :k2, :k3, :k4);\n"
    "END;\n"
)


def binaries() -> Path | None:
    """The directory of PostgreSQL's server programs (Debian's layout), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=_major, reverse=True)
    for postgres in found:
        bindir = postgres.parent
        if all((bindir / tool).exists() for tool in ("initdb", "pg_basebackup", "psql", "pgbench")):
            return bindir
    return None


def _major(path: Path) -> int:
    with contextlib.suppress(ValueError):
        return int(path.parent.parent.name)
    return 0


def unavailable_reason() -> str | None:
    """Why PostgreSQL cannot run here (None if it can)."""
    if binaries() is None:
        return "PostgreSQL is not installed (Debian package 'postgresql'; apt-get install -y postgresql)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no '{USER}' system user to run the servers as"
    if os.geteuid() != 0:
        return "needs root, to run the servers as the 'postgres' user"
    return None


def version() -> str:
    bindir = binaries()
    if bindir is None:
        return ""
    out = subprocess.run([bindir / "postgres", "--version"], check=False, capture_output=True, text=True)
    return out.stdout.strip()


class PostgresPair:
    """The primary and the standby of one run (start, load, stop)."""

    def __init__(
        self, scratch: Path, processes: Processes, base_port: int, rtt_ms: float, jitter_ms: float
    ) -> None:
        bindir = binaries()
        assert bindir is not None
        self.bin = bindir
        self.dir = scratch
        self.processes = processes
        self.port = base_port  # the primary on 127.0.0.1, the standby on 127.0.0.2
        self.proxy_port = base_port + 1  # on 127.0.0.2: the standby's way to the primary
        self.control = ("127.0.0.1", base_port + 2)
        self.rtt_ms = rtt_ms
        self.jitter_ms = jitter_ms
        entry = pwd.getpwnam(USER)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.env = {
            "PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(self.dir), "LANG": "C.UTF-8",
            "PGUSER": USER, "PGDATABASE": "postgres",
        }

    def tool(self, name: str, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            [str(self.bin / name), *args], check=False, capture_output=True, text=True, user=self.uid,
            group=self.gid, extra_groups=[], env=self.env, cwd=self.dir, timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def psql(self, *commands: str, host: str = "127.0.0.1") -> str:
        args = ["-h", host, "-p", str(self.port), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]
        for command in commands:
            args += ["-c", command]
        return self.tool("psql", *args).strip()

    def start(self, workload: Workload, isolation: str = "serializable") -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.dir, self.uid, self.gid)
        primary, standby = self.dir / "primary", self.dir / "standby"
        self.tool("initdb", "-D", str(primary), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        (self.dir / "sock-primary").mkdir()
        (self.dir / "sock-standby").mkdir()
        for sock in ("sock-primary", "sock-standby"):
            os.chown(self.dir / sock, self.uid, self.gid)
        with open(primary / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# bench/peers\n"
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.dir / 'sock-primary'}'\n"
                "max_connections = 300\n"
                "shared_buffers = 256MB\n"
                "wal_level = replica\n"
                "max_wal_senders = 4\n"
                "synchronous_commit = on\n"
                f"synchronous_standby_names = '{STANDBY}'\n"
                f"default_transaction_isolation = '{isolation}'\n"
                "max_pred_locks_per_transaction = 256\n"
                "hot_standby = on\n"
                "logging_collector = off\n"
            )
        (primary / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host all all 127.0.0.0/8 trust\n"
            "host replication all 127.0.0.0/8 trust\n"
        )
        self.processes.spawn(
            "postgres-primary", [str(self.bin / "postgres"), "-D", str(primary)],
            user=USER, stop_signal=signal.SIGINT, env=self.env, cwd=self.dir,
        )
        self._wait_accepting("127.0.0.1", "primary")
        # Preloaded before the standby exists: it starts from a base backup holding the keys.
        self.psql(
            "SET synchronous_commit = local",  # no standby yet
            "CREATE TABLE kv (k integer PRIMARY KEY, v bigint NOT NULL)",
            f"INSERT INTO kv SELECT g, 0 FROM generate_series(1, {workload.keys}) AS g",
            "VACUUM ANALYZE kv",
        )
        self.tool(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-D", str(standby),
            "-X", "stream", "-c", "fast", "--no-sync",
        )
        with open(standby / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# bench/peers: the standby\n"
                "listen_addresses = '127.0.0.2'\n"
                f"unix_socket_directories = '{self.dir / 'sock-standby'}'\n"
                f"primary_conninfo = 'host=127.0.0.2 port={self.proxy_port} user={USER} "
                f"application_name={STANDBY}'\n"
            )
        (standby / "standby.signal").touch()
        os.chown(standby / "standby.signal", self.uid, self.gid)
        start_wan_proxy(
            self.processes, "postgres-wan-proxy",
            [Link("eu-us/postgres", ("127.0.0.2", self.proxy_port), ("127.0.0.1", self.port), "127.0.0.2")],
            self.rtt_ms, self.jitter_ms, self.control,
        )
        self.processes.spawn(
            "postgres-standby", [str(self.bin / "postgres"), "-D", str(standby)],
            user=USER, stop_signal=signal.SIGINT, env=self.env, cwd=self.dir,
        )
        wait_for(
            lambda: self.psql(
                "SELECT sync_state || '/' || state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY}'"
            ) == "sync/streaming",
            60, "the standby streaming as the synchronous standby", interval_s=0.1,
            check=self.processes.check_alive,
        )

    def _wait_accepting(self, host: str, what: str) -> None:
        def ready() -> bool:
            out = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", host, "-p", str(self.port), "-q"],
                check=False, env=self.env, timeout=10,
            )
            return out.returncode == 0

        wait_for(ready, 60, f"PostgreSQL {what} accepting connections", interval_s=0.1,
                 check=self.processes.check_alive)

    def pgbench(self, workload: Workload, result: RunResult) -> None:
        bench_dir = self.dir / "pgbench"
        bench_dir.mkdir()
        os.chown(bench_dir, self.uid, self.gid)
        (bench_dir / "read_only.sql").write_text(READ_ONLY_SQL)
        (bench_dir / "rmw.sql").write_text(RMW_SQL)
        weight_ro = round(workload.read_only_fraction * 100)
        seconds = max(1, round(workload.duration_s))
        command = [
            str(self.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(self.port), "-n",
            "-M", "prepared", "-c", str(workload.clients), "-j", str(min(2, workload.clients)),
            "-T", str(seconds), "--max-tries", "0", "-D", f"nkeys={workload.keys}",
            "--random-seed", str(workload.seed),
            "-f", f"{bench_dir / 'read_only.sql'}@{weight_ro}",
            "-f", f"{bench_dir / 'rmw.sql'}@{100 - weight_ro}",
            "-l", "--log-prefix", str(bench_dir / "txn"),
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            command, check=False, capture_output=True, text=True, user=self.uid, group=self.gid,
            extra_groups=[], env=self.env, cwd=bench_dir, timeout=seconds + 120,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        (self.processes.log_dir / "pgbench.out").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"pgbench failed ({out.returncode}): {out.stderr.strip()[-1500:]}")
        result.driver_cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        result.elapsed_s = float(seconds)
        failed = parse_logs(sorted(bench_dir.glob("txn.*")), result)
        result.errors += failed
        summary = parse_summary(out.stdout)
        result.extra["pgbench"] = summary
        if summary.get("tps") and summary.get("transactions"):
            # pgbench's own rate: the run's time less the clients' initial connections (the
            # other systems' clients connect before their clocks start, too).
            result.elapsed_s = float(summary["transactions"]) / float(summary["tps"])
        if "retries" in summary and summary["retries"] != result.retries:
            log(f"postgres: pgbench says {summary['retries']} retries, its logs {result.retries}")


def parse_logs(paths: list[Path], result: RunResult) -> int:
    """Adds every transaction of pgbench's per-transaction logs to ``result`` (script 0 is
    read-only, 1 read-modify-write); returns how many failed for good.

    A line is ``client_id transaction_no time script_no time_epoch time_us [retries]``:
    ``time`` is the latency in microseconds, retries included, or ``failed``."""
    failed = 0
    for path in paths:
        with open(path) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) < 6:
                    continue
                if len(fields) >= 7:
                    result.retries += int(fields[6])
                if not fields[2].isdigit():
                    failed += 1
                    continue
                kind = KINDS[int(fields[3])]
                result.committed[kind] += 1
                result.latencies_s[kind].append(int(fields[2]) / 1e6)
    return failed


def parse_summary(text: str) -> dict[str, float]:
    """The figures of pgbench's closing summary that the report quotes."""
    patterns = {
        "transactions": r"number of transactions actually processed: (\d+)",
        "failed": r"number of failed transactions: (\d+)",
        "retried": r"number of transactions retried: (\d+)",
        "retries": r"total number of retries: (\d+)",
        "tps": r"tps = ([\d.]+) \(without initial connection time\)",
    }
    found: dict[str, float] = {}
    for name, pattern in patterns.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(match.group(1)) if "." in match.group(1) else int(match.group(1))
    return found


def run(
    scratch: Path, log_dir: Path, workload: Workload, rtt_ms: float, jitter_ms: float,
    base_port: int, isolation: str = "serializable",
) -> RunResult:
    result = RunResult("postgres", rtt_ms, not_measured=NOT_MEASURED)
    result.extra["isolation"] = isolation
    result.extra["durability"] = "synchronous_commit = on, one synchronous standby (remote flush)"
    reason = unavailable_reason()
    if reason is not None:
        result.status, result.reason = "unavailable", reason
        return result
    result.extra["version"] = version()
    os.chmod(scratch, 0o755)  # the postgres user must reach its directories below
    with Processes(log_dir) as processes:
        pair = PostgresPair(scratch / f"postgres-{rtt_ms:g}", processes, base_port, rtt_ms, jitter_ms)
        started = time.monotonic()
        pair.start(workload, isolation)
        log(f"postgres: primary + synchronous standby up in {time.monotonic() - started:.1f} s "
            f"(rtt {rtt_ms:g} ms); pgbench, {workload.clients} clients, {workload.duration_s:g} s")
        pair.pgbench(workload, result)
    shutil.rmtree(pair.dir, ignore_errors=True)
    return result
