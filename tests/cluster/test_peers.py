"""bench/peers/run.py end to end, briefly: Meridian (geo3's cluster), PostgreSQL with a
synchronous standby and a 3-member etcd, each at a 0 ms round trip, 8 clients, 5 s.

Every system whose package is installed must commit transactions and appear in the report;
Meridian's run that goes on at certification must see every one of its transactions commit;
a peer whose package is absent is skipped here, with the reason the report gives. About
45-60 s in all (three clusters started, loaded with 100,000 keys, run and stopped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.peers.common import share_at_least
from tests.conftest import REPO

# Away from geo3's own ports and from the other cluster tests' ranges (17000-30000).
MERIDIAN_PORT_SHIFT = 3000 + (os.getpid() % 20) * 100  # geo3's 7200-9300 -> 10200-14300
BASE_PORT = 15000 + (os.getpid() % 50) * 20  # etcd BASE..BASE+3, PostgreSQL BASE+10..+12


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("peers") / "report"
    command = [
        sys.executable, str(REPO / "bench" / "peers" / "run.py"), "--duration", "5",
        "--rtt-ms", "0", "--clients", "8", "--json", "--out", str(out),
        "--base-port", str(BASE_PORT), "--meridian-port-shift", str(MERIDIAN_PORT_SHIFT),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    return {"report": report, "out": out, "stderr": done.stderr}


def run_of(report: dict[str, Any], system: str) -> dict[str, Any]:
    runs = [r for r in report["runs"] if r["system"] == system and r["rtt_ms"] == 0]
    assert len(runs) == 1, report["runs"]
    run: dict[str, Any] = runs[0]
    return run


def committed_something(run: dict[str, Any]) -> None:
    assert run["status"] == "ok", run
    assert run["committed"] > 0 and run["txn_per_s"] > 0, run
    assert run["committed_by_kind"]["read_only"] > 0 and run["committed_by_kind"]["rmw"] > 0, run
    assert run["p50_ms"] is not None and run["p99_ms"] >= run["p50_ms"], run


def test_the_report_files_are_written_and_the_json_on_stdout_is_report_json(
    peers: dict[str, Any],
) -> None:
    out: Path = peers["out"]
    for name in ("report.md", "report.json", "throughput.png", "latency-cdf-rtt0.png"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "report.json").read_text()) == peers["report"]
    text = (out / "report.md").read_text()
    assert "| system | RTT ms | committed txn/s | p50 ms | p99 ms |" in text
    assert set(peers["report"]["ratios"]["0"]) >= {
        "meridian_commit_over_postgres", "meridian_certified_over_postgres"
    }


def test_nothing_started_is_left_running(peers: dict[str, Any]) -> None:
    scratch = peers["report"]["scratch"]
    assert not Path(scratch).exists()
    marks = [scratch, f"127.0.0.1:{BASE_PORT + 3}", f"127.0.0.1:{BASE_PORT + 12}",
             f"127.0.0.1:{9199 + MERIDIAN_PORT_SHIFT}"]
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in cmdline for mark in marks):
            left.append(cmdline)
    assert not left, left


def test_meridian_commits_in_both_modes_and_every_certified_transaction_commits(
    peers: dict[str, Any],
) -> None:
    commit = run_of(peers["report"], "meridian-commit")
    certified = run_of(peers["report"], "meridian-certified")
    committed_something(commit)
    committed_something(certified)
    assert certified["certified"] > 0
    assert certified["committed_in_end"] == certified["certified"], certified
    assert certified["not_committed"] == 0, certified
    assert peers["report"]["meridian_certified_commits"]["0"]["not_committed"] == 0


def test_meridian_says_where_a_read_modify_write_waits(peers: dict[str, Any]) -> None:
    """Waiting for commit, each committed read-modify-write's time is split into its
    certification and its wait for the commit; the two together are at most its whole
    latency (which also counts the attempts before a conflict retry)."""
    commit = run_of(peers["report"], "meridian-commit")
    split = commit["rmw_breakdown"]
    assert split["certified_p50_ms"] > 0 and split["certified_mean_ms"] > 0, split
    assert 0 <= split["commit_wait_p10_ms"] <= split["commit_wait_p50_ms"], split
    assert split["commit_wait_p50_ms"] <= split["commit_wait_p90_ms"], split
    whole = commit["by_kind"]["rmw"]["mean_ms"]
    assert split["certified_mean_ms"] + split["commit_wait_mean_ms"] <= whole * 1.001 + 0.01, (
        split, whole,
    )
    # And most of it: the retried attempts are few.
    assert split["certified_mean_ms"] + split["commit_wait_mean_ms"] >= whole * 0.5, (split, whole)
    text = (peers["out"] / "report.md").read_text()
    assert "where a read-modify-write's time goes" in text


def test_each_kind_says_what_share_of_it_took_10_ms_or_more(peers: dict[str, Any]) -> None:
    """The tail that a read-only transaction's wait for a version not yet durable makes: a
    share, consistent with the kind's percentiles, and in report.md's by-kind table."""
    for run in peers["report"]["runs"]:
        if run["status"] != "ok":
            continue
        for kind, figures in run["by_kind"].items():
            share = figures["over_10ms_share"]
            assert 0 <= share <= 1, (run["system"], kind, figures)
            if figures["p99_ms"] < 10:
                assert share <= 0.01, (run["system"], kind, figures)
            if figures["p50_ms"] >= 10:
                assert share >= 0.5, (run["system"], kind, figures)
    assert "read-only at 10 ms or more" in (peers["out"] / "report.md").read_text()


def test_share_at_least_counts_values_at_the_limit() -> None:
    assert share_at_least([0.001, 0.010, 0.020, 0.005], 0.010) == 0.5
    assert share_at_least([], 0.010) is None


def test_meridian_says_where_the_machine_cpu_went(peers: dict[str, Any]) -> None:
    """Each Meridian run reports the cores its leaders, followers and configuration managers
    kept busy, and the whole machine's busy fraction, over the run."""
    for system in ("meridian-commit", "meridian-certified"):
        shares = run_of(peers["report"], system)["cpu_share"]
        assert shares["leaders"] > 0 and shares["followers"] > 0 and shares["cm"] >= 0, shares
        assert 0 < shares["machine_busy"] <= 1, shares
        assert 0 <= shares["machine_steal"] <= 1, shares
        processes = sum(v for k, v in shares.items() if not k.startswith("machine_"))
        # The cluster's processes cannot keep more cores busy than the machine has.
        assert processes <= (os.cpu_count() or 1) * shares["machine_busy"] * 1.1 + 0.05, shares
    assert "where the machine's CPU went" in (peers["out"] / "report.md").read_text()


def test_settings_and_modes_given_on_the_command_line_are_checked_and_applied(
    tmp_path: Path,
) -> None:
    """``--meridian-set SECTION.NAME=VALUE`` lands in the cluster file the runs use (and the
    cluster file's loader refuses an unknown name); a malformed one, one the run sets itself
    or an unknown mode stops the command before anything starts, saying why."""
    sys.path.insert(0, str(REPO))
    try:
        from bench.peers import meridian
    finally:
        sys.path.remove(str(REPO))
    from store import config as config_module

    assert meridian.parse_setting("stream.batch_delay_awaited_ns = 3000000") == (
        "stream", "batch_delay_awaited_ns", 3_000_000,
    )
    assert meridian.parse_setting('client.name="x"') == ("client", "name", "x")
    for bad in ("stream.batch_delay_ns", "batch_delay_ns=5", "stream.x=[1]", "stream.x=fast"):
        with pytest.raises(ValueError, match=r"stream\.|SECTION|TOML|one value"):
            meridian.parse_setting(bad)
    path = meridian.cluster_file(
        tmp_path, tmp_path / "logs", 50.0, 1.0,
        settings=[("stream", "batch_delay_awaited_ns", 3_000_000), ("settings", "gossip_fanout", 2)],
    )
    loaded = config_module.load(path)
    assert loaded.stream["batch_delay_awaited_ns"] == 3_000_000
    assert loaded.settings.gossip_fanout == 2
    with pytest.raises(ValueError, match="set by the run itself"):
        meridian.cluster_file(tmp_path, tmp_path / "logs", 50.0, 1.0,
                              settings=[("wan", "rtt_ms", 0.0)])
    unknown = meridian.cluster_file(tmp_path, tmp_path / "logs", 50.0, 1.0,
                                    settings=[("stream", "no_such_setting", 1)])
    with pytest.raises(config_module.ConfigError, match="no_such_setting: unknown setting"):
        config_module.load(unknown)
    for argument in (["--meridian-set", "stream.x"], ["--meridian-modes", "fast"]):
        done = subprocess.run(
            [sys.executable, str(REPO / "bench" / "peers" / "run.py"), *argument],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )
        assert done.returncode == 2 and argument[0] in done.stderr, done.stderr


@pytest.mark.parametrize("system", ["postgres", "etcd"])
def test_a_peer_commits_transactions_or_is_skipped_with_the_reason(
    peers: dict[str, Any], system: str
) -> None:
    info = peers["report"]["systems"][system]
    run = run_of(peers["report"], system)
    if info["status"] == "unavailable":
        assert run["status"] == "unavailable" and run["reason"] == info["reason"]
        assert info["reason"] in (peers["out"] / "report.md").read_text()
        pytest.skip(f"{system}: {info['reason']}")
    committed_something(run)
    assert run["errors"] == 0, run
    if system == "postgres":
        assert run["isolation"] == "serializable"
        assert run["pgbench"]["transactions"] == run["committed"]


def test_meridian_runs_one_of_geo3s_shards_unless_asked_for_more(tmp_path: Path) -> None:
    """Like PostgreSQL's one primary and etcd's one group, Meridian keeps the keys on one
    shard by default (docs/peers.md, "What each system does"); --meridian-shards takes
    geo3's first N, and one it does not have is refused before anything starts."""
    import tomllib

    from bench.peers import meridian
    from bench.peers.run import parse_args

    def shards_of(**options: Any) -> list[str]:
        path = meridian.cluster_file(tmp_path, tmp_path, 50.0, 1.0, **options)
        return [shard["leader"] for shard in tomllib.loads(path.read_text())["shards"]]

    geo3 = [shard["leader"] for shard in meridian.geo3()["shards"]]
    assert len(geo3) == 2
    assert parse_args([]).meridian_shards == meridian.SHARDS_DEFAULT == 1
    assert shards_of(shards=1) == geo3[:1]
    assert shards_of(shards=2) == shards_of() == geo3
    with pytest.raises(ValueError, match="1 to 2"):
        shards_of(shards=3)
    for wrong in ("0", "3"):
        with pytest.raises(SystemExit):
            parse_args(["--meridian-shards", wrong])


def test_the_report_says_how_many_shards_meridian_ran(peers: dict[str, Any]) -> None:
    for system in ("meridian-commit", "meridian-certified"):
        assert run_of(peers["report"], system)["shards"] == 1
    assert peers["report"]["systems"]["meridian"]["shards"] == 1
    text = (peers["out"] / "report.md").read_text()
    assert "Meridian: cluster/geo3.toml's regions and links, 1 shard led from us" in text
