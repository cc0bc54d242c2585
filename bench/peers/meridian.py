"""Meridian: the cluster of ``cluster/geo3.toml`` (shards led from us, a follower of each in
eu and ap, a configuration manager member per region, every replication connection between
regions through ``meridian wan-proxy``), with the round trip of the run and the first
``shards`` of its shards (default 1: like PostgreSQL's one primary and etcd's one group,
one copy of the 100,000 keys per region; docs/peers.md says why, and what two shards give).

The same cluster and preload serve two runs, one after the other:

* ``meridian-commit``: each client waits for the committed answer (``run_ops_detailed``:
  durable in a majority of regions) before its next transaction;
* ``meridian-certified``: each client goes on as soon as its transaction is certified
  (``run_pipelined``, as bench/geo.py does), and the run then waits for every commit: each
  transaction certified in the run must end committed (``committed_in_end``,
  ``not_committed``). Only the ones that committed are counted; the latency is the
  certified one (what the client waited for), the commit latency is reported beside it.

Aborts are retried by the SDK under new transaction ids (``attempts``) and, past its
``retries_max``, again by the driver: every retry is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
import tomllib
from pathlib import Path
from typing import Any

from bench.peers.common import (
    REPO,
    RETRY_GRACE_S,
    RunResult,
    Workload,
    key_name,
    log,
    mean_ms,
    percentile_ms,
    pick,
)

GEO3 = REPO / "cluster" / "geo3.toml"
SHARDS_DEFAULT = 1


def geo3() -> dict[str, Any]:
    """``cluster/geo3.toml``, parsed."""
    return tomllib.loads(GEO3.read_text())
LOAD_BATCH = 500
LOAD_CONCURRENCY = 8
MODES = ("commit", "certified")
OWN_CLUSTER_KEYS = frozenset({"run_dir", "data_dir", "fsync", "python_path"})
COMMIT_WAIT_S = 60.0  # after the certified run: how long its commits may still take

NOT_MEASURED = (
    "disks: the write-ahead logs are on the scratch directory (tmpfs unless --scratch), where "
    "fsync is nearly free; every shard leader, and the clients, in region us"
)
NOT_MEASURED_CERTIFIED = NOT_MEASURED + (
    "; a certified answer is speculative (recovery may roll it back; none was here, see "
    "committed_in_end)"
)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def parse_setting(text: str) -> tuple[str, str, Any]:
    """``SECTION.NAME=VALUE`` (``--meridian-set``): VALUE is read as a TOML value (an
    integer, a float, true/false, or a quoted string). Which sections and names exist is the
    cluster file's business: its loader refuses an unknown one, naming the known ones."""
    name, equals, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not equals or not dot or not section or not key.strip():
        raise ValueError(f"{text!r}: expected SECTION.NAME=VALUE, e.g. stream.batch_delay_ns=5000000")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{text!r}: {raw.strip()!r} is not a TOML value ({error})") from None
    if isinstance(value, dict | list):
        raise ValueError(f"{text!r}: a setting takes one value, not a table or a list")
    return section, key.strip(), value


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_seconds() -> tuple[float, float, float] | None:
    """(busy, stolen, total) CPU seconds of the whole machine so far, from /proc/stat.
    Stolen: time a virtual CPU was ready to run and the host ran something else (not busy,
    not idle: on a shared host it comes and goes, and with it every figure here)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle, steal = ticks[3] + ticks[4], ticks[7]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle - steal) / tick, steal / tick, sum(ticks) / tick


def machine_shares(
    before: tuple[float, float, float] | None, after: tuple[float, float, float] | None
) -> dict[str, float]:
    """The whole machine between two ``machine_seconds()``: busy (``machine_busy``) and
    stolen by the host (``machine_steal``), fractions of its time; {} when not measured."""
    if before is None or after is None or after[2] <= before[2]:
        return {}
    busy, stolen, total = (a - b for a, b in zip(after, before, strict=True))
    return {"machine_busy": round(busy / total, 3), "machine_steal": round(stolen / total, 3)}


def role_of(name: str) -> str:
    """The group a cluster process's CPU is reported under."""
    if name == "wan-proxy":
        return "wan_proxy"
    if name.startswith("cm-"):
        return "cm"
    return "followers" if name.count("-") >= 2 else "leaders"


class CpuMeter:
    """CPU shares over one phase, by role (leaders, followers, cm, wan_proxy: cores busy
    per second, summed over the role's processes) and of the whole machine (0..1): busy
    (``machine_busy``) and stolen by the host (``machine_steal``)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._start: tuple[float, dict[str, float], tuple[float, float, float] | None] | None = None

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, child in zip(self.cluster.names, self.cluster.children, strict=True):
            seconds = cpu_seconds(child.pid)
            if seconds is not None:
                out[name] = seconds
        return out

    def start(self) -> None:
        self._start = (time.monotonic(), self._sample(), machine_seconds())

    def shares(self) -> dict[str, float]:
        assert self._start is not None, "start() first"
        began, before, machine_before = self._start
        elapsed = max(time.monotonic() - began, 1e-9)
        out: dict[str, float] = {}
        for name, seconds in self._sample().items():
            if name in before:
                role = role_of(name)
                out[role] = out.get(role, 0.0) + (seconds - before[name]) / elapsed
        shares = {role: round(share, 3) for role, share in sorted(out.items())}
        shares.update(machine_shares(machine_before, machine_seconds()))
        return shares


def _shift(address: str, by: int) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + by}"


def cluster_file(
    directory: Path, log_dir: Path, rtt_ms: float, jitter_ms: float, port_shift: int = 0,
    source: Path = GEO3, fsync: bool = True, workers: int = 1,
    settings: list[tuple[str, str, Any]] | None = None, shards: int | None = None,
) -> Path:
    """``cluster/geo3.toml`` as it is, but for the round trip and jitter of this run, its
    servers' logs in ``log_dir``, their write-ahead logs in ``directory`` (the scratch
    directory, where the peers keep their data too), ``fsync`` as asked, every port moved by
    ``port_shift`` (0: geo3's own) and only its first ``shards`` shards (None: all);
    ``settings`` (section, name, value) set on top."""
    data = tomllib.loads(source.read_text())
    if shards is not None:
        if not 1 <= shards <= len(data["shards"]):
            raise ValueError(f"shards: {shards} asked, {source.name} has 1 to {len(data['shards'])}")
        data["shards"] = data["shards"][:shards]
    data["cluster"]["run_dir"] = str(log_dir)
    data["cluster"]["data_dir"] = str(directory / "data")
    data["cluster"]["fsync"] = fsync
    data["cluster"]["python_path"] = [str(REPO)]
    if workers != 1:
        data["cluster"]["workers"] = workers
    for shard in data["shards"]:
        shard["leader"] = _shift(shard["leader"], port_shift)
        for follower in shard.get("followers", []):
            follower["address"] = _shift(follower["address"], port_shift)
    for member in data.get("cm", []):
        member["address"] = _shift(member["address"], port_shift)
    for section, key, value in settings or []:
        if section == "wan" or (section == "cluster" and key in OWN_CLUSTER_KEYS):
            raise ValueError(
                f"--meridian-set {section}.{key}: set by the run itself (--rtt-ms, --jitter-ms, "
                "--meridian-port-shift, --meridian-no-fsync, --scratch)"
            )
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"--meridian-set: [{section}] is not a table of the cluster file")
        table[key] = value
    wan = data.setdefault("wan", {})
    wan["rtt_ms"] = float(rtt_ms)
    wan["jitter_ms"] = float(jitter_ms if rtt_ms > 0 else 0.0)
    wan["port_base"] = int(wan.get("port_base", 9400)) + port_shift
    wan["control"] = _shift(wan.get("control", "127.0.0.1:9199"), port_shift)
    lines: list[str] = []
    for section, body in data.items():
        if isinstance(body, list):
            for entry in body:
                lines.append(f"[[{section}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
        else:
            lines.append(f"[{section}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    path = directory / f"geo3-rtt{rtt_ms:g}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def preload(client: Any, workload: Workload) -> None:
    by_shard: dict[int, list[str]] = {}
    for number in range(workload.keys):
        key = key_name(number)
        by_shard.setdefault(client.partitioner.shard_of(key), []).append(key)
    batches = iter([
        (shard, keys[i : i + LOAD_BATCH])
        for shard, keys in sorted(by_shard.items())
        for i in range(0, len(keys), LOAD_BATCH)
    ])

    async def loader() -> None:
        for shard, batch in batches:
            await client.run_ops([["put", key, 0] for key in batch], route=shard)

    await asyncio.gather(*(loader() for _ in range(LOAD_CONCURRENCY)))


def ops_of(kind: str, keys: list[str]) -> list[list[Any]]:
    if kind == "read_only":
        return [["get", key] for key in keys]
    return [["increment", key, 1] for key in keys]


def _error(result: RunResult, exc: BaseException) -> None:
    result.errors += 1
    examples = result.extra.setdefault("error_examples", [])
    if len(examples) < 3:
        examples.append(repr(exc)[:200])


async def drive_commit(client: Any, workload: Workload, result: RunResult) -> None:
    """Closed loop: each client waits for the committed answer."""
    from store.client import Aborted, MeridianError

    rng = random.Random(workload.seed)
    stop_at = time.monotonic() + workload.duration_s
    retries_max = client.settings.retries_max
    # A committed read-modify-write's last attempt: until its certified answer, and from
    # there until its commit (the SDK's certified_s / committed_s).
    certifying: list[float] = []
    waiting: list[float] = []

    async def worker() -> None:
        while time.monotonic() < stop_at:
            kind, numbers = pick(rng, workload)
            keys = [key_name(n) for n in numbers]
            ops = ops_of(kind, keys)
            begun = time.monotonic()
            while True:
                try:
                    answer = await client.run_ops_detailed(ops)
                except Aborted as exc:
                    result.retries += retries_max + 1  # the SDK gave up; the driver does not
                    if time.monotonic() > stop_at + RETRY_GRACE_S:
                        _error(result, exc)
                        break
                    continue
                except MeridianError as exc:
                    _error(result, exc)
                    break
                result.retries += answer.attempts - 1
                result.latencies_s[kind].append(time.monotonic() - begun)
                result.committed[kind] += 1
                if kind == "rmw" and answer.committed_s is not None:
                    certifying.append(answer.certified_s)
                    waiting.append(answer.committed_s - answer.certified_s)
                break

    cpu = time.process_time()
    begun = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workload.clients)))
    result.elapsed_s = time.monotonic() - begun
    result.driver_cpu_s = time.process_time() - cpu
    result.extra["rmw_breakdown"] = {
        "certified_p50_ms": percentile_ms(certifying, 50),
        "certified_mean_ms": mean_ms(certifying),
        "commit_wait_p10_ms": percentile_ms(waiting, 10),
        "commit_wait_p50_ms": percentile_ms(waiting, 50),
        "commit_wait_p90_ms": percentile_ms(waiting, 90),
        "commit_wait_mean_ms": mean_ms(waiting),
    }


async def drive_certified(client: Any, workload: Workload, result: RunResult) -> None:
    """Closed loop at certification; then every certified transaction's commit is awaited."""
    from store.client import Aborted, MeridianError

    rng = random.Random(workload.seed + 1)
    stop_at = time.monotonic() + workload.duration_s
    retries_max = client.settings.retries_max
    commits: set[asyncio.Future[Any]] = set()
    counts = {"certified": 0, "committed_in_end": 0, "commit_failed": 0}
    commit_latencies: list[float] = []
    failures: list[str] = []

    def watch(commit: asyncio.Future[Any], kind: str, begun: float, certified_s: float) -> None:
        def done(future: asyncio.Future[Any]) -> None:
            commits.discard(future)
            if future.cancelled() or future.exception() is not None:
                counts["commit_failed"] += 1
                if len(failures) < 3:
                    failures.append(repr(None if future.cancelled() else future.exception())[:200])
                return
            counts["committed_in_end"] += 1
            result.committed[kind] += 1
            result.latencies_s[kind].append(certified_s)
            commit_latencies.append(time.monotonic() - begun)

        commits.add(commit)
        commit.add_done_callback(done)

    async def worker() -> None:
        while time.monotonic() < stop_at:
            kind, numbers = pick(rng, workload)
            keys = [key_name(n) for n in numbers]
            ops = ops_of(kind, keys)
            begun = time.monotonic()
            while True:
                try:
                    answer, commit = await client.run_pipelined("", ops, route=keys[0])
                except Aborted as exc:
                    result.retries += retries_max + 1
                    if time.monotonic() > stop_at + RETRY_GRACE_S:
                        _error(result, exc)
                        break
                    continue
                except MeridianError as exc:
                    _error(result, exc)
                    break
                result.retries += answer.attempts - 1
                counts["certified"] += 1
                watch(commit, kind, begun, time.monotonic() - begun)
                break

    cpu = time.process_time()
    begun = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workload.clients)))
    result.elapsed_s = time.monotonic() - begun
    result.driver_cpu_s = time.process_time() - cpu
    waited = time.monotonic()
    if commits:
        await asyncio.wait(list(commits), timeout=COMMIT_WAIT_S)
    pending = len(commits)
    for future in list(commits):
        future.cancel()
    result.extra.update({
        "certified": counts["certified"],
        "committed_in_end": counts["committed_in_end"],
        "not_committed": counts["certified"] - counts["committed_in_end"],
        "commit_failed": counts["commit_failed"] - pending,
        "commit_still_pending": pending,
        "last_commit_after_s": round(time.monotonic() - waited, 3),
        "commit_p50_ms": percentile_ms(commit_latencies, 50),
        "commit_p99_ms": percentile_ms(commit_latencies, 99),
    })
    if failures:
        result.extra["commit_failure_examples"] = failures


async def requests_counted(client: Any, result: RunResult, phase: Any, meter: CpuMeter) -> None:
    """Runs ``phase``, then says how many requests its transactions took: SUBMITs (the
    leaders' counters; an aborted attempt's retry is one more) and the SDK's AWAITs
    (pipelined commits waited for together), per committed transaction, and where the
    machine's CPU went meanwhile (``meter``: the cluster's processes by role)."""

    # Latency sums the leaders' statuses carry, as {"count", "sum_ns"}, by the name of the
    # mean reported: a stream batch's wait for its close and an entry's round to a majority
    # of regions (over every batch of every leader), and how late the leaders' deadlines
    # ran (a hurried batch's close among them).
    sums = {
        "stream_batch_wait_mean_ms": lambda s: s.get("stream_latency", {}).get("batch_wait", {}),
        "stream_choose_mean_ms": lambda s: s.get("stream_latency", {}).get("choose", {}),
        "leader_timer_late_mean_ms": lambda s: s.get("timer_lateness", {}),
    }

    def totals(statuses: list[Any]) -> dict[str, int]:
        out = {"submits": sum(int(s["counters"]["submits"]) for s in statuses if s)}
        for name, found in sums.items():
            for part in ("count", "sum_ns"):
                out[f"{name}/{part}"] = sum(int(found(s).get(part, 0)) for s in statuses if s)
        return out

    before, awaits_before = totals(await client.status()), client.stats()["await_requests"]
    meter.start()
    await phase
    result.extra["cpu_share"] = meter.shares()
    after = totals(await client.status())
    committed = max(1, sum(result.committed.values()))
    result.extra["submits_per_txn"] = round((after["submits"] - before["submits"]) / committed, 3)
    result.extra["await_requests_per_txn"] = round(
        (client.stats()["await_requests"] - awaits_before) / committed, 3
    )
    for name in sums:
        count = after[f"{name}/count"] - before[f"{name}/count"]
        total_ns = after[f"{name}/sum_ns"] - before[f"{name}/sum_ns"]
        result.extra[name] = round(total_ns / count / 1e6, 3) if count else None


def run(
    scratch: Path, log_dir: Path, workload: Workload, rtt_ms: float, jitter_ms: float,
    port_shift: int, fsync: bool = True, modes: tuple[str, ...] = MODES,
    settings: list[tuple[str, str, Any]] | None = None, shards: int = SHARDS_DEFAULT,
) -> list[RunResult]:
    """Meridian's runs at one round trip (``modes``: waiting for commit, going on at
    certification, or both), on one cluster of ``shards`` shards; ``settings`` as
    ``cluster_file`` takes them."""
    assert modes and set(modes) <= set(MODES), modes
    from store import config as config_module
    from store.client import Client
    from store.node.up import ProcessCluster
    from store.rpc.aio import new_event_loop

    commit = RunResult("meridian-commit", rtt_ms, not_measured=NOT_MEASURED)
    certified = RunResult(
        "meridian-certified", rtt_ms, not_measured=NOT_MEASURED_CERTIFIED,
        latency_means="from submission until the certified answer (the commit is awaited "
        "after the run: commit_p50_ms/commit_p99_ms)",
    )
    directory = scratch / f"meridian-{rtt_ms:g}"
    directory.mkdir(parents=True, exist_ok=True)
    config = config_module.load(
        cluster_file(directory, log_dir, rtt_ms, jitter_ms, port_shift, fsync=fsync,
                     settings=settings, shards=shards)
    )
    cluster = ProcessCluster(config)
    meter = CpuMeter(cluster)
    started = time.monotonic()
    cluster.start()
    try:
        cluster.wait_ready(timeout_s=60)
        log(f"meridian: geo3 cluster ({shards} shard{'s' if shards > 1 else ''}) up in "
            f"{time.monotonic() - started:.1f} s (rtt {rtt_ms:g} ms)")

        async def main() -> None:
            client = await Client.connect(config, in_flight_max=max(256, workload.clients * 4))
            try:
                begun = time.monotonic()
                await preload(client, workload)
                log(f"meridian: {workload.keys:,} keys preloaded in {time.monotonic() - begun:.1f} s; "
                    f"{workload.clients} clients")
                if "commit" in modes:
                    log(f"meridian: {workload.duration_s:g} s waiting for commit")
                    await requests_counted(
                        client, commit, drive_commit(client, workload, commit), meter
                    )
                if "certified" in modes:
                    log(f"meridian: {workload.duration_s:g} s going on at certification")
                    await requests_counted(
                        client, certified, drive_certified(client, workload, certified), meter
                    )
            finally:
                await client.close()

        loop = new_event_loop()
        task = loop.create_task(main())
        try:
            loop.run_until_complete(task)
        except BaseException:
            # Ctrl-C: the client closes on its own loop before the cluster stops.
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
            raise
        finally:
            loop.close()
        dead = [name for name, child in zip(cluster.names, cluster.children, strict=True)
                if child.poll() is not None]
        if dead:
            raise RuntimeError(f"Meridian processes ended during the run: {', '.join(dead)}")
    finally:
        cluster.stop()
    with contextlib.suppress(OSError):
        shutil.rmtree(directory)
    results = [r for r, mode in ((commit, "commit"), (certified, "certified")) if mode in modes]
    for result in results:
        if settings:
            result.extra["settings"] = {f"{sec}.{key}": value for sec, key, value in settings}
        result.extra["shards"] = shards
        result.extra["cluster"] = (
            f"cluster/geo3.toml's regions and links, {shards} shard{'s' if shards > 1 else ''} "
            "led from us, followers in eu and ap"
        )
        result.extra["durability"] = (
            "every acceptor syncs its votes to its write-ahead log (fsync) before answering"
            if fsync else "fsync = false: write-ahead logs written, not synced (--meridian-no-fsync)"
        )
    return results

