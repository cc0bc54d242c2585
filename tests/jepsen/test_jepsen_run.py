"""``python -m jepsen run`` end to end, as a tester runs it (docs/jepsen.md).

The smoke test is the issue's: 60 s of list-append with kills and partitions on real
processes in network namespaces, checked valid, its files readable by a standard EDN reader
and laid out as Jepsen lays them out. The mutant test shows the same harness reports a
server built without validation as invalid. Both check that the run leaves nothing behind:
no namespace, no process, no temporary file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import edn_format
import pytest

REPO = Path(__file__).resolve().parents[2]
JEPSEN_OPS_KEYS = ("type", "f", "value", "process", "time", "index")


def _netns_names() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _temp_entries() -> set[str]:
    return set(os.listdir(tempfile.gettempdir()))


def _plain(value: Any) -> Any:
    """edn_format's immutable maps and keywords as plain Python (keywords as names)."""
    if isinstance(value, edn_format.Keyword):
        return value.name
    if hasattr(value, "items"):  # ImmutableDict
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | edn_format.ImmutableList | frozenset):
        return [_plain(v) for v in value]
    return value


def _jepsen(args: list[str], runs: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "jepsen", "run", "--runs-dir", str(runs), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, check=False,
        stdin=subprocess.DEVNULL,
    )


def _leftovers(runs: Path, namespaces_before: set[str], temp_before: set[str]) -> list[str]:
    problems = []
    made = {n for n in _netns_names() - namespaces_before if n.startswith("mjep-")}
    if made:
        problems.append(f"namespaces left: {sorted(made)}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    veths = [line for line in links.stdout.splitlines() if ": mj" in line]
    if veths:
        problems.append(f"links left in the root namespace: {veths}")
    alive = _processes_mentioning(str(runs))
    if alive:
        problems.append(f"processes left: {alive}")
    temp = _temp_entries() - temp_before
    if temp:
        problems.append(f"temporary files left: {sorted(temp)}")
    return problems


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@needs_root
def test_a_minute_of_kills_and_partitions_checks_valid_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    namespaces_before, temp_before = _netns_names(), _temp_entries()
    done = _jepsen(
        ["--workload", "list-append", "--nemesis", "kill,partition", "--time-limit", "60",
         "--concurrency", "8", "--seed", "3", "--fault-s", "4", "--quiet-s", "4",
         "--clear-fraction", "0.05"],
        runs, timeout_s=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Result: valid" in done.stdout, done.stdout[-2000:]

    directory = runs / "list-append-kill+partition" / "latest"
    assert directory.is_symlink()
    for name in ("history.edn", "results.edn", "latency-raw.png", "rate.png", "timeline.html",
                 "cluster.toml", "logs/shard-0.out", "logs/cm-us.log"):
        assert (directory / name).is_file(), name

    # Issue 13: the regions' links are mutual TLS and every session needs the secret.
    from store import config as config_module

    security = config_module.load(directory / "cluster.toml").security
    assert security is not None and security.tls and security.secret() is not None
    assert (directory / "certs" / "shard-0-eu.pem").is_file()

    # results.edn, by a standard EDN reader.
    results = _plain(edn_format.loads((directory / "results.edn").read_text()))
    assert results["valid?"] is True
    assert results["hosts"] == "netns"
    assert all(checker["valid?"] for checker in results["checkers"].values())
    assert set(results["checkers"]) >= {"elle", "committed-kept", "rolled-back", "recovery"}
    # Clears (clear_range of retired keys) ran under the faults, and were judged.
    assert results["checkers"]["committed-kept"].get("keys-cleared", 0) > 10
    counts = results["nemesis"]["counts"]
    assert counts.get("kill", 0) >= 3 and counts.get("partition", 0) >= 3, counts
    assert results["nemesis"]["leader-kills"] >= 2, results["nemesis"]
    ops = results["ops"]
    assert ops["ok"] > 500 and ops["completed-share"] >= 0.7, ops

    # history.edn: one operation per line, in Jepsen's shape, nemesis operations included.
    history = [
        _plain(edn_format.loads(line))
        for line in (directory / "history.edn").read_text().splitlines() if line.strip()
    ]
    for position, op in enumerate(history):
        assert tuple(op)[:6] == JEPSEN_OPS_KEYS, op
        assert op["type"] in ("invoke", "ok", "fail", "info"), op
        assert op["index"] == position
        assert isinstance(op["time"], int) and op["time"] >= 0
    nemesis = [op for op in history if op["process"] == "nemesis"]
    fs = {op["f"] for op in nemesis}
    assert {"start-kill", "stop-kill", "start-partition", "stop-partition"} <= fs, fs
    assert all(op["type"] in ("invoke", "info") for op in nemesis)
    assert sum(op["type"] == "ok" and op["f"] == "txn" for op in history) == ops["ok"] + sum(
        1 for op in history if op.get("final") is True
    )

    assert _leftovers(runs, namespaces_before, temp_before) == []


@needs_root
def test_killing_single_workers_of_shard_leaders_checks_valid(tmp_path: Path) -> None:
    """Issue 16: shards of two worker processes each (units with their own streams and
    followers); the kill nemesis kills single workers, leaders among them, and the shard's
    watermark (the least of its workers' claims) must carry every worker through."""
    runs = tmp_path / "runs"
    done = _jepsen(
        ["--workload", "list-append", "--nemesis", "kill", "--workers", "2", "--time-limit",
         "30", "--concurrency", "8", "--seed", "5", "--fault-s", "4", "--quiet-s", "3"],
        runs, timeout_s=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Result: valid" in done.stdout, done.stdout[-2000:]
    directory = runs / "list-append-kill" / "latest"
    results = _plain(edn_format.loads((directory / "results.edn").read_text()))
    assert results["valid?"] is True
    assert results["nemesis"]["leader-kills"] >= 1, results["nemesis"]
    assert (directory / "logs" / "shard-1.1.out").is_file()  # a worker's own process
    assert results["ops"]["ok"] > 200, results["ops"]


@needs_root
def test_tpcc_on_shards_of_workers_under_kills_checks_valid(tmp_path: Path) -> None:
    """Issue 16: TPC-C with each shard two workers (a warehouse per worker) while the kill
    nemesis kills workers, leaders among them: afterwards every replica set holds the
    twelve consistency conditions. Runs of it failed (seeds 2 and 3, not every time) while a
    leader converted the replication backlog queued for a follower that came back in one go:
    its event loop stopped for up to 17 s, the configuration manager failed it over, and the
    check's reads failed; tests/node/test_replication_transport.py and
    test_replication_tls.py test the bounded writes themselves."""
    runs = tmp_path / "runs"
    done = _jepsen(
        ["--workload", "tpcc", "--nemesis", "kill", "--workers", "2", "--time-limit", "30",
         "--concurrency", "8", "--seed", "3"],
        runs, timeout_s=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Result: valid" in done.stdout, done.stdout[-3000:]
    results = _plain(
        edn_format.loads((runs / "tpcc-kill" / "latest" / "results.edn").read_text())
    )
    assert results["valid?"] is True
    assert results["nemesis"]["counts"].get("kill", 0) >= 2, results["nemesis"]
    replica_sets = results["checkers"]["tpcc"]["replica-sets"]
    assert set(replica_sets) == {"us", "eu", "ap"}
    for name, checks in replica_sets.items():
        assert all(checks["after-run"].values()), (name, checks)


@needs_root
def test_servers_without_validation_are_reported_invalid(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = _jepsen(
        ["--workload", "list-append", "--nemesis", "none", "--time-limit", "15",
         "--concurrency", "8", "--break", "validation"],
        runs, timeout_s=300,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Result: INVALID" in done.stdout
    results = _plain(edn_format.loads(
        (runs / "list-append-none-break-validation" / "latest" / "results.edn").read_text()
    ))
    assert results["valid?"] is False
    assert results["checkers"]["elle"]["valid?"] is False
    assert {"G-single", "G2-item", "G1c"} & set(results["anomaly-types"]), results["anomaly-types"]


@needs_root
def test_an_interrupted_run_removes_its_namespaces_and_processes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    namespaces_before, temp_before = _netns_names(), _temp_entries()
    command = [
        sys.executable, "-m", "jepsen", "run", "--runs-dir", str(runs), "--time-limit", "60",
        "--nemesis", "kill", "--concurrency", "4",
    ]
    child = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        for line in child.stdout:  # wait for the first fault: the cluster is up and loaded
            lines.append(line)
            if "killed" in line or time.monotonic() > deadline:
                break
        assert any("killed" in line for line in lines), "".join(lines)
        assert _netns_names() - namespaces_before, "the run made no namespace"
        child.send_signal(signal.SIGTERM)
        rest, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest
    assert _leftovers(runs, namespaces_before, temp_before) == []


def test_the_tpcc_cluster_file_keeps_one_copy_of_item_on_every_shard(tmp_path: Path) -> None:
    """`--workload tpcc` places warehouses by prefix and ITEM on every shard, as
    bench/tpcc.py's own cluster file does (issue 15)."""
    from jepsen.hosts import LoopbackHosts
    from jepsen.run import REGIONS, Options, cluster_file
    from store import config as config_module
    from store.core.keys import pack

    path = cluster_file(tmp_path, LoopbackHosts(list(REGIONS)), Options(workload="tpcc"))
    partitioner = config_module.load(path).partitioner()
    assert partitioner.is_replicated(pack(("item", 7)))
    assert partitioner.shard_of(pack(("stock", 3, 7))) == 1
