"""``meridian up``: start every process of a local cluster, wait for it, stop it cleanly.

On data directories an earlier run left, ``meridian up`` restarts that cluster: every
process starts with ``serve --rejoin`` and goes on from its disk (docs/durability.md);
``--fresh`` sets the data aside and starts a new one.

Each server (a shard's leader or follower, a configuration manager member, the wan proxy) is
a child process (``meridian serve``). The children watch their parent and exit if it
disappears, and ``up`` stops every child on Ctrl-C or SIGTERM (SIGTERM, then SIGKILL for any
that linger), so stopping ``up`` leaves no process behind.

Supervision. A child that dies while the cluster runs (killed, or crashed) is reported — its
name, pid, how it ended and the tail of its output — and the rest keep running: with a
configuration manager the shard's followers take over (docs/recovery.md). Then, unless
``restart`` is off (``meridian up --no-restart``), it is started again after
``RESTART_DELAY_S`` with ``serve --rejoin`` (a shard replica rejoins its shard as a
follower, from its own snapshot or a live replica's state; a configuration manager member
rebuilds its acceptor from its log), the wan proxy as it was. The one exception is a broken invariant (exit status 70): that is a bug, the cluster's state is
suspect, and ``up`` stops everything and exits non-zero.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from store.config import ClusterConfig, ReplicaNode
from store.core.epoch import EPOCH_SHIFT, format_counter
from store.core.partition import clock_marks

# A dead child is started again this long after its death was seen (never in a tight loop).
RESTART_DELAY_S = 1.0


class ProcessCluster:
    """The processes of one cluster file on this machine."""

    def __init__(
        self,
        config: ClusterConfig,
        python: str = sys.executable,
        restart: bool = True,
        on_host: Callable[[str, list[str]], list[str]] | None = None,
        server_args: Sequence[str] = (),
        fresh: bool = True,
    ) -> None:
        """``on_host(region, argv)`` gives the command that runs ``argv`` on the region's host
        (the Jepsen harness runs each region in a network namespace); ``server_args`` are
        added to every shard replica's ``serve`` command (the harness's ``--break``).
        ``fresh``: a new cluster, an earlier run's data set aside (what benchmarks and tests
        want); else the cluster goes on from its data directories (``meridian up``'s
        default)."""
        self.config = config
        self.python = python
        self.restart = restart
        self.on_host = on_host
        self.server_args = list(server_args)
        # An earlier run's data: go on from it (restarting), or, fresh, set it aside.
        self.fresh = fresh
        self.restarting = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []
        self.commands: list[list[str]] = []
        self.reported: set[str] = set()  # children whose death was reported
        self._restart_at: dict[str, float] = {}  # dead children to start again, and when
        self.restarts: dict[str, int] = {}
        self._env: dict[str, str] = {}
        self.remote: list[ReplicaNode] = []  # processes of other hosts (not started here)

    def log_files(self) -> list[Path]:
        """Every log file this cluster's processes write: per process, its JSON-lines log
        (``<name>.log``) and its standard output and error (``<name>.out``)."""
        names = [node.name for node in self.config.nodes()]
        if self.config.wan is not None:
            names.append("wan-proxy")
        run_dir = self.config.run_dir
        return [run_dir / f"{name}{suffix}" for name in names for suffix in (".log", ".out")]

    def _set_logs_aside(self) -> None:
        """Logs are per run: the previous run's files go to ``previous-run/`` (replacing the
        run before it) instead of being appended to. A process restarted within this run
        appends to its own files."""
        aside = self.config.run_dir / "previous-run"
        moved = False
        for path in self.log_files():
            if path.exists():
                if not moved:
                    shutil.rmtree(aside, ignore_errors=True)
                    aside.mkdir(parents=True)
                    moved = True
                path.rename(aside / path.name)

    def _with_data(self, nodes: list[ReplicaNode]) -> list[ReplicaNode]:
        """Those of ``nodes`` whose data directory holds something (an earlier run's)."""
        found = []
        for node in nodes:
            directory = self.config.process_data_dir(node)
            if directory.exists() and any(directory.iterdir()):
                found.append(node)
        return found

    def _set_data_aside(self, nodes: list[ReplicaNode]) -> None:
        """``--fresh``: the data directories of ``nodes`` go to ``<data_dir>/previous-run/``
        (replacing the run before it), for inspection, and a new cluster starts."""
        aside = self.config.data_root() / "previous-run"
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir(parents=True)
        for node in nodes:
            self.config.process_data_dir(node).rename(aside / node.name)

    def start(self) -> None:
        from store.node.server import log_name

        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self._set_logs_aside()
        assert self.config.path is not None, "a cluster started by 'up' needs a file"
        env = self._env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRPC_VERBOSITY": "ERROR"}
        # Leaders first (children[s] is shard s's leader), then followers, then the proxy.
        # Only the processes whose host is this machine (all of them through on_host, which
        # runs each on its own host): the others are started on theirs.
        self.remote = [
            node for node in self.config.nodes()
            if self.on_host is None and not is_local(node.rpc[0])
        ]
        local = [n for n in self.config.nodes() if n not in self.remote]
        with_data = self._with_data(local)
        # A cluster goes on from its disks through its followers' snapshots and its CM
        # (docs/durability.md); one without keeps no store on disk: it starts anew.
        restartable = bool(self.config.cm_addresses()) and all(
            shard.followers for shard in self.config.shards
        )
        self.restarting = bool(with_data) and not self.fresh and restartable
        if not self.restarting:
            # The counters the workers of each shard share (store.node.server.shard_counter)
            # start at 0 with a new cluster; a restart keeps them (they only ever grow).
            shutil.rmtree(self.config.run_dir / "counters", ignore_errors=True)
        if with_data and not self.restarting:
            self._set_data_aside(with_data)
            print(
                ("a new cluster" if self.fresh else "a new cluster (without followers and a "
                 "configuration manager, it keeps no store on disk to go on from)")
                + ": the data of the previous run "
                f"({', '.join(n.name for n in with_data)}) is in "
                f"{self.config.data_root() / 'previous-run'}",
                file=sys.stderr, flush=True,
            )
        elif with_data:
            print(
                f"restarting the cluster from {self.config.data_root()} (the data of "
                f"{len(with_data)} of its {len(local)} processes is there; meridian up --fresh "
                f"starts a new one)",
                file=sys.stderr, flush=True,
            )
        for node in self.config.nodes():
            if node in self.remote:
                continue
            command = [
                self.python, "-m", "store.cli", "serve", "--config", str(self.config.path),
                "--shard", str(node.shard), "--role", node.role,
            ]
            if node.role == "cm":
                command = [
                    self.python, "-m", "store.cli", "serve", "--config", str(self.config.path),
                    "--role", "cm", "--region", node.region,
                ]
            else:
                if node.role == "follower":
                    command += ["--region", node.region]
                command += self.server_args
            if self.restarting:
                command += ["--rejoin"]  # each goes on from its data (docs/durability.md)
            if self.on_host is not None:
                command = self.on_host(node.region, command)
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
        if name in self.names:
            self.children[self.names.index(name)] = child
            return
        self.children.append(child)
        self.names.append(name)
        self.commands.append(command)

    def wait_ready(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Waits until every shard answers a status request; returns the statuses."""
        from store.client import Client

        async def poll() -> list[dict[str, Any]]:
            deadline = time.monotonic() + timeout_s
            client = await Client.connect(self.config, connect_timeout_s=0.5)
            try:
                while True:
                    self._check_children()
                    statuses = [
                        status for node, status in zip(
                            self.config.nodes(), await client.status(replicas=True), strict=True
                        )
                        if node not in self.remote
                    ]
                    if all(s is not None and s.get("ready", True) for s in statuses):
                        answered = [s for s in statuses if s is not None]
                        self._check_ours(answered)
                        return answered
                    if time.monotonic() > deadline:
                        nodes = [n for n in self.config.nodes() if n not in self.remote]
                        missing = [nodes[i].address for i, s in enumerate(statuses) if s is None]
                        raise TimeoutError(f"{missing} did not answer in {timeout_s} s")
                    await asyncio.sleep(0.1)
            finally:
                await client.close()

        return asyncio.run(poll())

    def _check_ours(self, statuses: list[dict[str, Any]]) -> None:
        """Every answer must come from a process this cluster started: else another
        cluster holds an address (one ``ports_in_use`` could not see, or taken since)."""
        if self.on_host is not None:
            return  # started through a wrapper on another host: its pids are not ours
        ours = set(self.pids())
        strangers = [
            f"{status.get('address')} (pid {status.get('pid')})" for status in statuses
            if status.get("pid") not in ours
        ]
        if strangers:
            raise RuntimeError(
                "processes of another cluster answer at this cluster's addresses: "
                + ", ".join(strangers)
            )

    def _check_children(self) -> None:
        """While starting: any child that ended is an error."""
        for name, child in zip(self.names, self.children, strict=True):
            code = child.poll()
            if code is not None:
                raise RuntimeError(f"{name} exited with {code}:\n{self._tail(name)}")

    def supervise(self) -> list[str]:
        """While running: reports each child that ended since the last call (returned as
        lines), keeps the rest running and restarts it when due (see the module doc); a
        broken invariant (status 70) raises."""
        from store.node.server import EXIT_INVARIANT_BROKEN

        lines = []
        now = time.monotonic()
        for name, child in zip(self.names, self.children, strict=True):
            code = child.poll()
            if code is None:
                continue
            if name not in self.reported:
                self.reported.add(name)
                if code == EXIT_INVARIANT_BROKEN:
                    raise RuntimeError(f"{name} exited with {code}:\n{self._tail(name)}")
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
                then = "the rest of the cluster keeps running"
                if self.restart:
                    self._restart_at[name] = now + RESTART_DELAY_S
                    then += f"; restarting it in {RESTART_DELAY_S:g} s"
                lines.append(
                    f"{name} (pid {child.pid}) {how}; {then}"
                    + (f"\n{self._tail(name, 600)}" if code > 0 else "")
                )
            due = self._restart_at.get(name)
            if due is not None and now >= due:
                del self._restart_at[name]
                lines.append(self.respawn(name))
        return lines

    def respawn(self, name: str) -> str:
        """Starts the dead child ``name`` again — a shard replica with ``--rejoin`` — and
        says so in a line."""
        index = self.names.index(name)
        assert self.children[index].poll() is not None, f"{name} is still running"
        command = self.commands[index]
        if name != "wan-proxy" and "--rejoin" not in command:
            command = [*command, "--rejoin"]
        self._spawn(name, command, self._env)
        self.reported.discard(name)
        self._restart_at.pop(name, None)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        what = {"shard": "rejoins its shard", "cm": "rejoins the configuration manager"}.get(
            name.split("-", maxsplit=1)[0], "is back"
        )
        return f"{name} restarted (pid {self.pid_of(name)}); it {what}"

    def _tail(self, name: str, chars: int = 2000) -> str:
        log = self.config.run_dir / f"{name}.out"
        return log.read_text()[-chars:] if log.exists() else ""

    def pid_of(self, name: str) -> int:
        return self.children[self.names.index(name)].pid

    def stop(self, grace_s: float = 5.0) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                child.send_signal(signal.SIGCONT)  # a paused child must run to stop
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


def describe(
    config: ClusterConfig, statuses: list[dict[str, Any]], log_files: Sequence[Path] = ()
) -> str:
    lines = [f"cluster {config.name!r}: {len(config.shards)} shard(s), regions {', '.join(config.regions)}"]
    for status in statuses:
        if status["role"] == "cm":
            lines.append(
                f"  cm       {'member':<8} {status['address']:<16} region {status['region']}  "
                f"pid {status['pid']}"
            )
            continue
        lines.append(
            f"  shard {status['shard']}  {status['role']:<8} {status['address']:<16} "
            f"region {status['region']}  pid {status['pid']}"
            + (f"  metrics {status['metrics']}" if status.get("metrics") else "")
        )
    if config.wan is not None:
        lines.append(
            f"  wan-proxy: {config.wan.rtt_ms:g} ms round trips between regions, control "
            f"{config.wan.control[0]}:{config.wan.control[1]}"
        )
    lines.append(f"  cluster file: {config.path}")
    lines.append(f"  logs of this run (JSON lines in .log, output in .out; the previous run's in {config.run_dir / 'previous-run'}):")
    lines += [f"    {path}" for path in log_files]
    return "\n".join(lines)


def is_local(host: str) -> bool:
    """Whether ``host`` is an address (or name) of this machine: it can be bound here."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def ports_in_use(config: ClusterConfig) -> list[str]:
    """Every address this machine would have to bind for the cluster and cannot, because
    something else holds it: each server's RPC port (UDP) and replication port (TCP), the
    wan-proxy's links and control port (TCP). Addresses of other hosts are skipped."""
    wanted: list[tuple[str, tuple[str, int], int]] = []
    for node in config.nodes():
        wanted.append((f"{node.role} {node.address} (RPC, UDP)", node.rpc, socket.SOCK_DGRAM))
        listen = config.replication_listen(node)
        wanted.append(
            (f"{node.role} {node.address} (replication, TCP {listen[1]})", listen, socket.SOCK_STREAM)
        )
        metrics = config.metrics_listen(node)
        if metrics is not None:
            wanted.append(
                (f"{node.role} {node.address} (metrics, TCP {metrics[1]})", metrics, socket.SOCK_STREAM)
            )
    if config.wan is not None:
        wanted.append(("wan-proxy control (TCP)", config.wan.control, socket.SOCK_STREAM))
        for name, listen, _, _, _, _ in config.wan_links():
            wanted.append((f"wan-proxy link {name} (TCP)", listen, socket.SOCK_STREAM))
    busy = []
    for what, (host, port), kind in wanted:
        with socket.socket(socket.AF_INET, kind) as probe:
            if kind == socket.SOCK_STREAM:
                # As a server binds (TIME_WAIT of a stopped one does not count).
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    busy.append(f"{host}:{port} for {what}")
                # Any other error (an address of another host): not this machine's to check.
    return busy


def run_up(config: ClusterConfig, restart: bool = True, fresh: bool = False) -> int:
    busy = ports_in_use(config)
    if busy:
        # Nothing is started: another cluster (or anything else) holds these, and its
        # processes would answer the readiness check as if they were this cluster's.
        print(
            "error: cannot start: addresses in use:\n  " + "\n  ".join(busy),
            file=sys.stderr, flush=True,
        )
        return 1
    cluster = ProcessCluster(config, restart=restart, fresh=fresh)
    stop_requested = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        cluster.start()
        statuses = cluster.wait_ready()
        print(describe(config, statuses, cluster.log_files()), flush=True)
        if cluster.remote:
            print(
                "  on other hosts (start them there with meridian serve): "
                + ", ".join(f"{node.name} {node.address}" for node in cluster.remote),
                flush=True,
            )
        print("ready; Ctrl-C stops the cluster", flush=True)
        while not stop_requested:
            time.sleep(0.2)
            if not stop_requested:
                for line in cluster.supervise():
                    print(line, flush=True)
    except (RuntimeError, TimeoutError) as exc:
        if stop_requested:
            return 0
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        cluster.stop()
        print("stopped", flush=True)
    return 0


def format_status(
    epoch: int, leaders: list[str], statuses: list[dict[str, Any] | None]
) -> str:
    """One line per shard (with workers, per worker: ``shard.worker``): its leader in the
    cluster map (epoch -1: the cluster file's, no configuration manager answered), the
    leader's process, its watermark (a worker's: its claim), the slot its stream has chosen
    through (``-``: no followers, no stream), and its counters."""
    source = "cluster file" if epoch < 0 else "configuration manager"
    lines = [
        f"epoch {max(epoch, 0)} (leaders from the {source})",
        f"{'shard':>5}  {'leader':<21} {'pid':>7} {'health':<8} {'watermark':>9} {'stream':>7} "
        f"{'keys':>8} {'in-flight':>9} {'certified':>9} {'committed':>9} {'aborted':>8} "
        f"{'rolled back':>11}",
    ]
    for shard, (leader, status) in enumerate(zip(leaders, statuses, strict=True)):
        if status is None or status.get("role") != "leader":
            health = "DOWN" if status is None else status.get("role", "?").upper()
            lines.append(f"{shard:>5}  {leader:<21} {'-':>7} {health:<8}")
            continue
        counters = status["counters"]
        slot = status.get("stream_chosen_slot")
        lines.append(
            f"{status.get('label', shard):>5}  {status['address']:<21} {status['pid']:>7} {'up':<8} "
            f"{format_counter(status['watermark']):>9} {'-' if slot is None else slot:>7} "
            f"{status['keys']:>8} {status['in_flight']:>9} "
            f"{counters['certified']:>9} {counters['committed']:>9} {counters['aborted']:>8} "
            f"{counters.get('rolled_back', 0):>11}"
        )
    return "\n".join(lines)


def format_processes(
    nodes: list[ReplicaNode], statuses: list[dict[str, Any] | None]
) -> str:
    """One line per process of the cluster file: its role now (a follower may have been
    promoted), shard, region, address, pid and metrics endpoint; a follower's lag behind
    its shard's leader, in stream slots (what the leader proposed and it has not accepted)
    and in watermark (counter values of the leader's watermark it has not applied); its disk:
    the records it recovered from its write-ahead log when it started, the log's size, and
    the watermark of the snapshot it went on from (a restarted follower)."""
    lag_slots: dict[str, int] = {}
    unit_marks: dict[int, int] = {}
    for status in statuses:
        if status is not None and status.get("role") == "leader":
            lag_slots.update(status.get("follower_lag_slots", {}))
            unit_marks[int(status["shard"])] = int(status["watermark"])
    # By vector-clock entry: a follower's "watermark" is its shard's, and with workers a
    # leader process reports its worker's claim, so a shard's is the least of its workers'.
    workers = max((node.workers for node in nodes), default=1)
    leader_marks = clock_marks(unit_marks, workers)
    lines = [
        f"{'process':<14} {'role':<9} {'shard':>5} {'region':<7} {'address':<21} {'pid':>7} "
        f"{'lag':<22} {'disk':<44} metrics"
    ]
    for node, status in zip(nodes, statuses, strict=True):
        name = node.name
        if status is None:
            lines.append(f"{name:<14} {'DOWN':<9} {node.label:>5} {node.region:<7} {node.address:<21}")
            continue
        lag = ""
        if status.get("role") == "follower":
            if status.get("rejoining"):
                lag = "rejoining"
            else:
                slots = lag_slots.get(node.address)
                mark = leader_marks.get(node.shard // node.workers)
                behind = (
                    max(0, mark - int(status["watermark"]))
                    if mark is not None and mark >> EPOCH_SHIFT == int(status["watermark"]) >> EPOCH_SHIFT
                    else None
                )
                lag = f"{'?' if slots is None else slots} slots, {'?' if behind is None else behind} behind"
        shard = "-" if node.role == "cm" else node.label
        disk = status.get("disk")
        shown_disk = "-" if not disk else (
            f"{disk['recovered_records']} recovered, {disk['log_bytes'] / 1e6:.1f} MB"
            + ("" if disk["fsync"] else " NO FSYNC")
            + (
                f", restored at {format_counter(disk['recovered']['watermark'])}"
                if disk.get("recovered") else ""
            )
        )
        lines.append(
            f"{name:<14} {status.get('role', '?'):<9} {shard:>5} {node.region:<7} "
            f"{node.address:<21} {status.get('pid', '-'):>7} {lag:<22} {shown_disk:<44} "
            f"{status.get('metrics') or '-'}"
        )
    return "\n".join(lines)


def format_placement(config: ClusterConfig) -> str:
    """How the cluster file places keys (what every server and client runs with)."""
    placement = config.placement()
    parts = [f"other tables: {placement['default']}"]
    if placement["replicated"]:
        parts.insert(0, "replicated on every shard: " + ", ".join(placement["replicated"]))
    for table, rule in placement["tables"].items():
        where = f"field {rule['field']}" + (
            f" in ranges split at {rule['splits']}" if "splits" in rule else " mod shards"
        )
        parts.insert(-1, f"{table}: {where}")
    return "placement: " + "; ".join(parts)


def run_status(config: ClusterConfig) -> int:
    from store.client import Client

    async def fetch() -> tuple[int, list[str], list[dict[str, Any] | None], list[dict[str, Any] | None]]:
        client = await Client.connect(config, connect_timeout_s=0.5, attempt_timeout_s=0.5)
        try:
            epoch, leaders = await client.cluster_map()
            return epoch, leaders, await client.status(), await client.status(replicas=True)
        finally:
            await client.close()

    epoch, leaders, statuses, processes = asyncio.run(fetch())
    print(format_status(epoch, leaders, statuses))
    print()
    print(format_processes(config.nodes(), processes))
    print()
    print(format_placement(config))
    return 0 if all(s is not None and s.get("role") == "leader" for s in statuses) else 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
