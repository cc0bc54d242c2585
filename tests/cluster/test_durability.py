"""Two of a shard's three replicas killed at once, on real processes (issue 14).

The 3-region cluster of ``test_failover`` (leaders in us, followers in eu and ap, a
configuration manager member per region, 50 ms round trips through the wan proxy) runs the
list-append workload from 8 clients, plus a probe client appending to a key of shard 0.
Mid-run, shard 0's leader and its eu follower are SIGKILLed together, leaving ap alone:
ap can lead only with the vote of one of them. ``meridian up``'s supervision restarts both
(``serve --rejoin``); each rebuilds its acceptor from its write-ahead log and votes at once,
so ap's phase 1 completes and shard 0 commits again. (Restarted with their memory gone, the
two would wait to catch up with a leader that cannot be elected without them.)

Checked: the history checks clean; every append a client was told COMMITTED is in the final
state and on every live follower; shard 0 commits again after the restarts; each restarted
process reports the records it recovered (``meridian status``: its disk).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from jepsen.checkers.list_append import check_list_append
from jepsen.history import read_history, write_history
from jepsen.runner import run_workload
from store import config as config_module
from store.client import Client
from store.core.errors import MeridianError
from store.node.up import ProcessCluster
from store.sim.workloads import ListAppend
from tests.cluster.conftest import run
from tests.cluster.test_failover import _final_state_holds, acknowledged_appends, probe_key

KILL_AT_S = 3.0
RUN_S = 12.0
VICTIMS = ("shard-0", "shard-0-eu")


def test_a_shards_leader_and_a_follower_killed_together_come_back_from_their_logs(
    geo_cm: ProcessCluster, tmp_path: Path
) -> None:
    config = geo_cm.config
    probe = probe_key(config, 0)
    probe_values: list[int] = []
    committed_at: list[float] = []
    restarted_at: list[float] = []
    reports: list[str] = []
    started = time.monotonic()

    async def probing(client: Client) -> None:
        value = 0
        while time.monotonic() - started < RUN_S:
            value += 1
            try:
                await client.run_ops([["append", probe, value]], route=0)
            except MeridianError:
                continue
            probe_values.append(value)
            committed_at.append(time.monotonic() - started)

    async def nemesis(duration_s: float) -> None:
        client = await Client.connect(config)
        try:
            task = asyncio.create_task(probing(client))
            await asyncio.sleep(KILL_AT_S)
            for name in VICTIMS:
                os.kill(geo_cm.pid_of(name), signal.SIGKILL)
            deadline = time.monotonic() + 20
            while any(not geo_cm.restarts.get(n) for n in VICTIMS) and time.monotonic() < deadline:
                reports.extend(geo_cm.supervise())
                await asyncio.sleep(0.1)
            restarted_at.append(time.monotonic() - started)
            await task
        finally:
            await client.close()

    workload = ListAppend(random.Random(11), active_keys=10)
    result = run(run_workload(lambda: Client.connect(config), workload, 8, RUN_S, nemesis))

    assert all(geo_cm.restarts.get(n) == 1 for n in VICTIMS), reports
    history = tmp_path / "history.edn"
    write_history(history, result.ops)
    verdict = check_list_append(read_history(history))
    assert verdict["valid"], {k: verdict["anomalies"][k][:2] for k in verdict["anomaly_types"]}
    assert result.counts["ok"] > 100, result.counts

    # Shard 0 commits again once the two are back (ap leads, with their votes).
    back = [t for t in committed_at if t > restarted_at[0]]
    assert back, f"shard 0 never committed again after the restarts at {restarted_at[0]:.1f} s"

    acknowledged = {**acknowledged_appends(result.ops), probe: set(probe_values)}
    run(_final_state_holds(config, acknowledged))
    run(_recovered_from_disk(config))

    shown = subprocess.run(
        [sys.executable, "-m", "store.cli", "status", "--config", str(config.path)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "recovered" in shown.stdout, shown.stdout


async def _recovered_from_disk(config: config_module.ClusterConfig) -> None:
    """Each restarted process says what it recovered, and votes in its shard again."""
    names = [node.name for node in config.nodes()]
    async with await Client.connect(config) as client:
        deadline = time.monotonic() + 20
        while True:
            statuses = await client.status(replicas=True)
            victims = [statuses[names.index(name)] for name in VICTIMS]
            if all(s is not None and s.get("voting") for s in victims) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        for name, status in zip(VICTIMS, victims, strict=True):
            assert status is not None and status["voting"] and not status["rejoining"], (name, status)
            assert status["disk"]["recovered_records"] > 0, (name, status["disk"])
            assert status["disk"]["syncs"] > 0, (name, status["disk"])


WHOLE_KILL_AT_S = 4.0
WHOLE_RUN_S = 6.0


def test_every_process_killed_comes_back_with_meridian_up(
    geo_cm: ProcessCluster, tmp_path: Path
) -> None:
    """SIGKILL of every process of the cluster (servers, CM members, the wan proxy) under
    list-append load; ``meridian up`` on the same data directories brings the cluster back:
    every append a client was told COMMITTED is there, both shards commit again, and each
    follower reports the snapshot it came back from (its recovered watermark)."""
    config = geo_cm.config

    async def nemesis(duration_s: float) -> None:
        await asyncio.sleep(WHOLE_KILL_AT_S)
        for pid in geo_cm.pids():
            os.kill(pid, signal.SIGKILL)

    workload = ListAppend(random.Random(12), active_keys=10)
    result = run(run_workload(lambda: Client.connect(config), workload, 8, WHOLE_RUN_S, nemesis))
    for child in geo_cm.children:
        child.wait(timeout=10)
    assert result.counts["ok"] > 100, result.counts
    acknowledged = acknowledged_appends(result.ops)

    up = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "up", "--config", str(config.path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        output = _wait_for_line(up, "ready; Ctrl-C stops the cluster", timeout_s=90)
        assert "restarting the cluster from" in output, output
        run(_whole_cluster_back(config, acknowledged))
        shown = subprocess.run(
            [sys.executable, "-m", "store.cli", "status", "--config", str(config.path)],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "restored at" in shown.stdout, shown.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    history = tmp_path / "history.edn"
    write_history(history, result.ops)
    verdict = check_list_append(read_history(history))
    assert verdict["valid"], {k: verdict["anomalies"][k][:2] for k in verdict["anomaly_types"]}


def _wait_for_line(process: subprocess.Popen[str], line: str, timeout_s: float) -> str:
    """The output of ``process`` up to and including ``line`` (which must come in time)."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    os.set_blocking(process.stdout.fileno(), False)
    while time.monotonic() < deadline:
        chunk = process.stdout.readline()
        if chunk:
            seen.append(chunk)
            if line in chunk:
                return "".join(seen)
            continue
        if process.poll() is not None:
            break
        time.sleep(0.05)  # polling a pipe, not synchronising: the deadline decides
    raise AssertionError(f"no {line!r} within {timeout_s} s:\n{''.join(seen)}")


async def _whole_cluster_back(
    config: config_module.ClusterConfig, acknowledged: dict[str, set[int]]
) -> None:
    async with await Client.connect(config) as client:
        # Both shards commit again (a new epoch each: their leaders died).
        for shard in (0, 1):
            key = probe_key(config, shard)
            deadline = time.monotonic() + 60
            while True:
                try:
                    await client.run_ops([["append", key, 1]], route=shard)
                    break
                except MeridianError:
                    if time.monotonic() > deadline:
                        raise
        for key in sorted(acknowledged):
            final = await client.get(key) or []
            missing = acknowledged[key] - set(final)
            assert not missing, (key, sorted(missing))
        statuses = await client.status(replicas=True)
        restored = [
            s for s in statuses
            if s is not None and s.get("role") in ("follower", "leader")
            and (s.get("disk") or {}).get("recovered")
        ]
        # At least one replica of each shard came back from its own snapshot (the new
        # leaders did: nothing else was alive to copy from).
        assert {s["shard"] for s in restored} == {0, 1}, statuses
