"""``meridian up`` starts every process, reports them, and stopping it leaves none behind."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.node.up import pid_alive
from tests.cluster.conftest import write_cluster_file
from tests.conftest import REPO


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_stopping_up_leaves_no_process_behind(tmp_path: Path, stop_signal: int) -> None:
    path = write_cluster_file(tmp_path)
    up = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "up", "--config", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    assert up.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        lines.append(line)
        if "ready" in line or not line:
            break
    output = "".join(lines)
    pids = [int(pid) for pid in re.findall(r"pid (\d+)", output)]
    assert len(pids) == 2, output
    assert all(pid_alive(pid) for pid in pids)
    status = subprocess.run(
        [sys.executable, "-m", "store.cli", "status", "--config", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
    )
    assert status.returncode == 0 and status.stdout.count(" up ") == 2, status.stdout
    up.send_signal(stop_signal)
    rest, _ = up.communicate(timeout=30)
    assert "stopped" in rest
    assert up.returncode == 0
    time.sleep(0.2)
    assert [pid for pid in pids if pid_alive(pid)] == []


def start_up(path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """``meridian up`` in a child process, once it says ready; with its servers' pids."""
    up = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "up", "--config", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert up.stdout is not None
    output = ""
    while "ready" not in output:
        line = up.stdout.readline()
        assert line, output
        output += line
    return up, [int(pid) for pid in re.findall(r"pid (\d+)", output)]


def test_servers_exit_when_up_is_killed(tmp_path: Path) -> None:
    path = write_cluster_file(tmp_path)
    up, pids = start_up(path)
    up.kill()  # no chance to clean up: the servers notice their parent is gone
    up.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if pid_alive(pid)] == []


@pytest.mark.patches_core
def test_a_broken_invariant_stops_the_server_and_up_reports_it(tmp_path: Path) -> None:
    """Fail fast (TigerBeetle): an assertion inside a replica ends its process with status 70
    and the assertion in its log; ``meridian up`` sees it, says which process and why, stops
    the rest and exits non-zero."""
    from store.client import BlockingClient
    from store.config import load
    from store.core.errors import MeridianError
    from tests.cluster.conftest import PROCEDURES
    from tests.cluster.procedures import TRIPWIRE_KEY

    path = write_cluster_file(
        tmp_path, procedures=[*PROCEDURES, "tests.cluster.procedures:register_tripwire"]
    )
    up, pids = start_up(path)
    config = load(path)
    shard = config.partitioner().shard_of(TRIPWIRE_KEY)
    with BlockingClient.connect(path, timeout_s=2.0) as client:
        client.put("fine/1", 1)  # the tripwire lets everything else through
        with pytest.raises(MeridianError):
            client.put(TRIPWIRE_KEY, 1)
    rest, _ = up.communicate(timeout=30)
    assert up.returncode == 1, rest
    assert f"shard-{shard} exited with 70" in rest, rest
    assert "tripwire: an invariant broken on purpose" in rest, rest
    log = (config.run_dir / f"shard-{shard}.log").read_text()
    assert "invariant broken" in log and "AssertionError" in log
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if pid_alive(pid)] == []


def test_up_on_addresses_in_use_fails_before_printing_anything_else(tmp_path: Path) -> None:
    """Issue 13: on ports another cluster holds, ``meridian up`` printed that cluster's
    process ids and "ready". Now it starts nothing and says which addresses are taken."""
    path = write_cluster_file(tmp_path)
    first, pids = start_up(path)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "store.cli", "up", "--config", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
        )
        assert second.returncode == 1
        assert second.stdout == ""  # no process ids, no "ready", no "stopped"
        assert "addresses in use" in second.stderr
        from store import config as config_module

        leader = config_module.load(path).shards[0].leader_address
        assert f"{leader} for leader {leader} (RPC, UDP)" in second.stderr, second.stderr
        assert all(pid_alive(pid) for pid in pids)  # the first cluster is untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)


def test_logs_are_per_run_the_startup_names_them_and_status_shows_every_process(
    tmp_path: Path,
) -> None:
    """Issue 13: logs were appended across runs and the startup named a pattern; status
    showed leaders only. Now each run starts fresh files (the previous run's are set aside),
    the startup lines name every log file and each process's metrics endpoint, and status
    lists every process with its pid, role, region and metrics endpoint."""
    from store import config as config_module

    path = write_cluster_file(tmp_path)
    config = config_module.load(path)
    first, first_pids = start_up(path)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=30)
    up = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "up", "--config", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert up.stdout is not None
        output = ""
        while "ready" not in output:
            line = up.stdout.readline()
            assert line, output
            output += line
        for name in ("shard-0", "shard-1"):
            for suffix in (".log", ".out"):
                assert str(config.run_dir / f"{name}{suffix}") in output
        assert output.count("metrics http://127.0.0.1:") == 2
        log = (config.run_dir / "shard-0.log").read_text()
        assert str(first_pids[0]) not in log  # this run's file, not the first run's
        aside = (config.run_dir / "previous-run" / "shard-0.log").read_text()
        assert f'"pid": {first_pids[0]}' in aside
        status = subprocess.run(
            [sys.executable, "-m", "store.cli", "status", "--config", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        rows = [line for line in status.stdout.splitlines() if line.startswith("shard-")]
        assert len(rows) == 2 and all("leader" in row and "/metrics" in row for row in rows), rows
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=30)


def test_up_starts_only_this_hosts_processes_and_serve_finds_its_own(tmp_path: Path) -> None:
    """Issue 13: a cluster file spans hosts. ``meridian up`` starts the processes whose
    address is this machine's and names the others; ``meridian serve --role ROLE`` finds
    the one process of that role this machine runs, or says which to choose between."""
    from store import config as config_module

    path = write_cluster_file(tmp_path, shards=2)
    # Shard 1's leader on another host: an address no interface of this machine has
    # (TEST-NET-1, RFC 5737; nothing is ever sent to it).
    text = path.read_text()
    remote = config_module.load(path).shards[1].leader_address
    path.write_text(text.replace(f'leader = "{remote}"', 'leader = "192.0.2.1:7100"'))
    up = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "up", "--config", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert up.stdout is not None
        output = ""
        while "ready" not in output:
            line = up.stdout.readline()
            assert line, output
            output += line
        assert len(re.findall(r"pid (\d+)", output)) == 1, output
        assert "on other hosts" in output and "shard-1 192.0.2.1:7100" in output, output
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=30)
    # serve --role leader: one leader of this file is on this machine: it is the one served.
    serve = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "serve", "--config", str(path), "--role", "leader"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert serve.stdout is not None
        assert "shard 0 leader" in serve.stdout.readline()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    # Both leaders local: serve must be told which.
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", "serve", "--config", str(path), "--role", "leader"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode != 0 and "2 processes of that role on this machine" in done.stderr


def test_a_followers_lag_is_its_shards_least_worker_claim_less_its_entry() -> None:
    """`meridian status` with workers: each leader process reports its worker's claim, a
    follower its shard's entry; the lag is the shard's watermark (the least of its workers'
    claims) less that entry. A shard with a worker down has no known watermark: lag '?'."""
    from store.config import ReplicaNode
    from store.node.up import format_processes

    def leader(unit: int, mark: int) -> dict[str, object]:
        return {"role": "leader", "shard": unit, "watermark": mark, "pid": 1, "follower_lag_slots": {}}

    follower = {"role": "follower", "shard": 0, "watermark": 40, "pid": 2}
    nodes = [
        ReplicaNode("leader", 0, "us", ("127.0.0.1", 7000), 2),
        ReplicaNode("leader", 1, "us", ("127.0.0.1", 7010), 2),
        ReplicaNode("follower", 0, "eu", ("127.0.0.2", 7000), 2),
    ]
    text = format_processes(nodes, [leader(0, 100), leader(1, 70), follower])
    assert "30 behind" in text  # min(100, 70) - 40, not 100 - 40
    text = format_processes(nodes, [leader(0, 100), None, follower])
    assert "? behind" in text


def test_the_servers_run_under_the_scheduling_policy_the_cluster_file_names(tmp_path: Path) -> None:
    """``cluster.sched_policy = "idle"``: every thread of every server process runs under
    Linux's SCHED_IDLE (threads started after the policy was set inherit it); a policy
    Meridian does not know is refused when the file is read."""
    import os

    from store import config as config_module
    from store.config import ConfigError, from_dict
    from store.node.up import ProcessCluster

    assert from_dict({"shards": [{"leader": "h:1"}]}).sched_policy == "other"
    with pytest.raises(ConfigError, match="'other' or 'idle'"):
        from_dict({"shards": [{"leader": "h:1"}], "cluster": {"sched_policy": "fifo"}})
    path = write_cluster_file(tmp_path, shards=1)
    path.write_text(path.read_text().replace("[cluster]\n", '[cluster]\nsched_policy = "idle"\n', 1))
    config = config_module.load(path)
    assert config.sched_policy == "idle"
    running = ProcessCluster(config)
    running.start()
    try:
        running.wait_ready()
        (server,) = running.children
        threads = [int(tid) for tid in os.listdir(f"/proc/{server.pid}/task")]
        assert len(threads) > 1  # gRPC's and the write-ahead log's threads among them
        assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_IDLE}
    finally:
        running.stop()
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this process's is its own
