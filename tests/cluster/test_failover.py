"""A shard leader killed under load, on real processes (issue 10's "Done when", real part).

A 3-region cluster (leaders in us, followers in eu and ap, a configuration manager member in
each region, Paxos through the wan proxy at 50 ms round trips) runs the list-append workload
from 8 clients while one probe client per shard appends to a key of its own shard. The
shard-0 leader is SIGKILLed mid-run. Checked: the history (written as ``history.edn``)
checks clean; every append a client was told COMMITTED is in the final state, on the new
leaders and on every live follower; the failed shard commits again within
``leader_timeout`` + 2 s of the kill; the healthy shard never goes a whole second without a
commit; ``meridian up``'s supervision reports the death, keeps the rest running and
restarts the killed process, which copies a live replica's state and rejoins shard 0 as a
voting follower holding every acknowledged append; ``meridian status`` shows epoch 1 and the
new leader with its process id.

``leader_timeout`` is 500 ms here. A healthy shard's commits wait while a cross-shard
transaction coordinated by the dead leader holds a counter on it (its counter was drawn at
the lock round; nothing settles it before the epoch ends), so the healthy shard's longest
stall is ``leader_timeout`` plus the epoch change (docs/recovery.md, "What a failover costs").
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jepsen.checkers.list_append import check_list_append
from jepsen.history import read_history, write_history
from jepsen.runner import run_workload
from store import config as config_module
from store.client import Client
from store.core.errors import MeridianError
from store.node.up import ProcessCluster
from store.sim.workloads import ListAppend, list_append_key
from tests.cluster.conftest import run

KILL_AT_S = 3.0
RUN_S = 9.0


def acknowledged_appends(ops: list[Any]) -> dict[str, set[int]]:
    """Per key, every value an append a client was told COMMITTED (``ok``) added."""
    acknowledged: dict[str, set[int]] = {}
    for op in ops:
        if op.type == "ok":
            for f, key, value in op.value:
                if f == "append":
                    acknowledged.setdefault(list_append_key(key), set()).add(value)
    return acknowledged


def probe_key(config: config_module.ClusterConfig, shard: int) -> str:
    partitioner = config.partitioner()
    return next(
        key for key in (f"probe/{shard}/{n}" for n in range(1000))
        if partitioner.shard_of(key) == shard
    )


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] with no time in ``times``."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def test_a_killed_shard_leader_is_replaced_and_nothing_committed_is_lost(
    geo_cm: ProcessCluster, tmp_path: Path
) -> None:
    config = geo_cm.config
    leader_timeout_s = config.settings.leader_timeout_ns / 1e9
    probes = {shard: probe_key(config, shard) for shard in (0, 1)}
    committed_at: dict[int, list[float]] = {0: [], 1: []}
    probe_values: dict[int, list[int]] = {0: [], 1: []}
    killed_at: list[float] = []
    probe_errors: list[tuple[int, float, str]] = []
    started = time.monotonic()

    async def probe(shard: int, client: Client) -> None:
        value = 0
        while time.monotonic() - started < RUN_S:
            value += 1
            try:
                await client.run_ops([["append", probes[shard], value]], route=shard)
            except MeridianError as exc:
                probe_errors.append((shard, round(time.monotonic() - started, 3), repr(exc)[:120]))
                continue
            probe_values[shard].append(value)
            committed_at[shard].append(time.monotonic() - started)

    async def nemesis(duration_s: float) -> None:
        clients = [await Client.connect(config) for _ in (0, 1)]
        try:
            tasks = [asyncio.create_task(probe(shard, clients[shard])) for shard in (0, 1)]
            await asyncio.sleep(KILL_AT_S)
            os.kill(geo_cm.pid_of("shard-0"), signal.SIGKILL)
            killed_at.append(time.monotonic() - started)
            await asyncio.gather(*tasks)
        finally:
            for client in clients:
                await client.close()

    workload = ListAppend(random.Random(7), active_keys=10)
    result = run(run_workload(lambda: Client.connect(config), workload, 8, RUN_S, nemesis))

    # The history, as a file a tester can check again, checks clean.
    history = tmp_path / "history.edn"
    write_history(history, result.ops)
    verdict = check_list_append(read_history(history))
    assert verdict["valid"], {k: verdict["anomalies"][k][:2] for k in verdict["anomaly_types"]}
    assert result.counts["ok"] > 100, result.counts

    # Supervision: the death is reported, the rest keeps running, the process restarts.
    killed_pid = geo_cm.pid_of("shard-0")
    reports = geo_cm.supervise()
    assert len(reports) == 1 and "shard-0" in reports[0] and "SIGKILL" in reports[0], reports
    assert "restarting it" in reports[0], reports
    deadline = time.monotonic() + 10
    while not geo_cm.restarts.get("shard-0") and time.monotonic() < deadline:
        reports += geo_cm.supervise()
        time.sleep(0.1)
    assert geo_cm.pid_of("shard-0") != killed_pid, reports

    # The failed shard commits again within leader_timeout + 2 s; the healthy shard never
    # stops committing for a whole second.
    kill = killed_at[0]
    back = [t for t in committed_at[0] if t > kill]
    assert back, "shard 0 never committed again"
    assert back[0] - kill < leader_timeout_s + 2.0, (back[0] - kill, probe_errors)
    gap = longest_gap(committed_at[1], 0.5, RUN_S - 0.5)
    assert gap < 1.0, (gap, kill, probe_errors)

    # Nothing a client was told COMMITTED is missing, on the leaders of the new map and on
    # every live follower.
    acknowledged = acknowledged_appends(result.ops)
    for shard in (0, 1):
        acknowledged[probes[shard]] = set(probe_values[shard])
    run(_final_state_holds(config, acknowledged))
    run(_rejoined(config, acknowledged))

    # meridian status names the epoch and the new leader, with its process id.
    shown = subprocess.run(
        [sys.executable, "-m", "store.cli", "status", "--config", str(config.path)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith("epoch 1 (leaders from the configuration manager)"), shown.stdout
    shard0 = next(line for line in shown.stdout.splitlines() if line.split()[0] == "0")
    address, pid, health = shard0.split()[1:4]
    assert health == "up" and address != config.shards[0].leader_address, shown.stdout
    followers = {f"{h}:{p}": f"shard-0-{r}" for r, (h, p) in config.shards[0].followers}
    assert int(pid) == geo_cm.pid_of(followers[address]), shown.stdout


async def _final_state_holds(config: config_module.ClusterConfig, acknowledged: dict[str, set[int]]) -> None:
    keys = sorted(acknowledged)
    async with await Client.connect(config) as client:
        epoch, leaders = await client.cluster_map()
        assert epoch == 1 and leaders[0] != config.shards[0].leader_address, (epoch, leaders)
        final: dict[str, Any] = {}
        for key in keys:
            final[key] = await client.get(key) or []
            missing = acknowledged[key] - set(final[key])
            assert not missing, (key, sorted(missing))
        # The followers of the new map converge to the leaders' state.
        for shard in (0, 1):
            shard_keys = [k for k in keys if client.partitioner.shard_of(k) == shard]
            for region, address in config.shards[shard].followers:
                if f"{address[0]}:{address[1]}" == leaders[shard]:
                    continue  # promoted: it is the leader now
                deadline = time.monotonic() + 10
                while True:
                    snapshot = await client.read_snapshot(shard_keys, region=region)
                    shown = {k: snapshot.values[k] or [] for k in shard_keys}
                    if shown == {k: final[k] for k in shard_keys} or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                assert shown == {k: final[k] for k in shard_keys}, (shard, region)


async def _rejoined(config: config_module.ClusterConfig, acknowledged: dict[str, set[int]]) -> None:
    """The restarted shard-0 process has copied its state and votes again; a snapshot read
    at it shows every acknowledged append of its shard."""
    old_leader = config.shards[0].leader_address
    async with await Client.connect(config) as client:
        await client.cluster_map()  # snapshot reads go to the replicas the map has follow
        deadline = time.monotonic() + 20
        while True:
            statuses = await client.status(replicas=True)
            status = statuses[0]  # the nodes' order: shard 0's leader in the cluster file first
            if (status is not None and status.get("voting")) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert status is not None and status["address"] == old_leader, status
        assert status["role"] == "follower" and not status["rejoining"] and status["voting"], status
        assert status["epoch"] == 1, status
        keys = sorted(k for k in acknowledged if client.partitioner.shard_of(k) == 0)
        while True:
            snapshot = await client.read_snapshot(keys, region=config.shards[0].region)
            missing = {k: acknowledged[k] - set(snapshot.values[k] or []) for k in keys}
            if not any(missing.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert not any(missing.values()), missing


def test_the_failover_benchmark_reports_what_the_issue_asks(tmp_path: Path) -> None:
    """``bench/failover.py --json`` on a short run: the fields, no committed increment
    lost, the epoch moved, the plot written."""
    import json

    from tests.conftest import REPO

    port = 27000 + (os.getpid() % 200) * 10
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "failover.py"), "--json", "--duration", "8",
         "--kill-at", "3", "--clients", "6", "--keys-per-shard", "200",
         "--base-port", str(port), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["lost_committed"] == 0
    assert report["epoch"] == 1
    assert 0 < report["recovery_s"] < report["leader_timeout_ms"] / 1000 + 3
    assert isinstance(report["healthy_min_ratio"], float)
    assert isinstance(report["rolled_back"], int) and report["committed"] > 100
    assert [kill["shard"] for kill in report["kills"]] == [0]
    assert (tmp_path / "failover.png").stat().st_size > 0
