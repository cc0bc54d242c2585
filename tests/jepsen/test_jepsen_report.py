"""The run report (jepsen.report): faults and latencies read off a history, results.edn that
any EDN reader takes, the plots and timeline a person looks at, and the end-of-run summary."""

from __future__ import annotations

import re
from pathlib import Path

import edn_format
import pytest

from jepsen import edn
from jepsen.edn import Keyword
from jepsen.history import Op
from jepsen.report import (
    Fault,
    faults_from_history,
    latencies,
    plot_latency,
    plot_rate,
    summary,
    write_results,
    write_timeline,
)

MS = 1_000_000
S = 1_000_000_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def nemesis(
    f: str, time_ns: int, value: object = None, invocation_type: str = "invoke"
) -> list[Op]:
    """One fault action as Jepsen writes it: the invocation, then the :info completion."""
    return [
        Op(invocation_type, f, None, "nemesis", time_ns),
        Op("info", f, value, "nemesis", time_ns + 50 * MS),
    ]


def synthetic_history() -> list[Op]:
    """Two processes appending and reading for ~3 s, a partition healed and a kill not."""
    ops: list[Op] = []
    ops += nemesis("start-partition", 200 * MS, ["us", "eu|ap"])
    for step in range(30):
        start = step * 100 * MS
        ops.append(Op("invoke", "txn", [["append", 1, step]], 0, start))
        ops.append(Op("invoke", "read", None, 1, start + 10 * MS))
        ops.append(
            Op("ok" if step % 5 else "fail", "txn", [["append", 1, step]], 0, start + 40 * MS)
        )
        ops.append(Op("ok" if step % 7 else "info", "read", {0: 100}, 1, start + 90 * MS))
    ops += nemesis("stop-partition", 1200 * MS, ["us", "eu|ap"])
    ops += nemesis("start-kill", 2000 * MS, "shard-0 leader 10.213.1.2:7200")
    return ops


@pytest.mark.parametrize("invocation_type", ["invoke", "info"])
def test_faults_pair_starts_with_stops_and_keep_an_unhealed_one_open(invocation_type: str) -> None:
    # Jepsen itself writes the nemesis's invocation as :info; our harness writes :invoke.
    history = [
        *nemesis("start-partition", 1 * S, ["us", "eu|ap"], invocation_type),
        *nemesis("start-kill", 2 * S, "shard-0 leader 10.213.1.2:7200", invocation_type),
        *nemesis("stop-partition", 3 * S, None, invocation_type),
        *nemesis("restart", 4 * S, "node-3", invocation_type),
    ]

    assert faults_from_history(history) == [
        Fault("partition", "us, eu|ap", 1.05, 3.05),
        Fault("kill", "shard-0 leader 10.213.1.2:7200", 2.05, None),
        Fault("restart", "node-3", 4.05, 4.05),
    ]


def test_a_stop_heals_the_fault_it_names_else_every_open_one_of_its_kind() -> None:
    history = [
        *nemesis("start-pause", 1 * S, "node-1"),
        *nemesis("start-pause", 2 * S, "node-2"),
        *nemesis("stop-pause", 3 * S, "node-2"),
        *nemesis("start-pause", 4 * S, "node-3"),
        *nemesis("stop-pause", 5 * S, "all paused nodes"),
        *nemesis("stop-kill", 6 * S, "nothing was killed"),
    ]

    assert faults_from_history(history) == [
        Fault("pause", "node-1", 1.05, 5.05),
        Fault("pause", "node-2", 2.05, 3.05),
        Fault("pause", "node-3", 4.05, 5.05),
    ]


def test_latencies_pair_each_completion_with_its_own_process_invocation() -> None:
    history = [
        Op("invoke", "txn", None, 0, 0),
        Op("invoke", "read", None, 1, 1 * MS),
        *nemesis("start-kill", 2 * MS, "node-1"),
        Op("ok", "read", {0: 1}, 1, 3 * MS),
        Op("invoke", "read", None, 1, 4 * MS),
        Op("invoke", "txn", None, 2, 5 * MS),  # never completes
        Op("fail", "read", None, 1, 6 * MS),
        Op("info", "txn", None, 0, 10 * MS),  # timed out: counted, with how long it waited
    ]

    rows = latencies(history)

    assert [(type_, f) for *_, type_, f in rows] == [
        ("ok", "read"),
        ("fail", "read"),
        ("info", "txn"),
    ]
    expected = [(0.001, 0.002), (0.004, 0.002), (0.0, 0.010)]
    for (invoke_s, latency_s, _, _), (want_invoke_s, want_latency_s) in zip(
        rows, expected, strict=True
    ):
        assert invoke_s == pytest.approx(want_invoke_s)
        assert latency_s == pytest.approx(want_latency_s)


def results_example() -> dict[str, object]:
    return {
        "valid?": False,
        "checkers": {
            "list-append": {"valid?": False, "anomaly-types": [Keyword("G-single")]},
            "bank": {"valid?": True, "read-count": 12},
        },
        "anomaly-types": [Keyword("G-single")],
        "anomalies": {"G-single": [{"explanation": "T1 < T2 (rw) < T1 (wr)", "cycle": [1, 2]}]},
        "ops": {"ok": 90, "fail": 8, "info": 2},
        "nemesis": {
            "faults": [Fault("kill", "shard-0 leader", 1.5, None)],
            "counts": {"kill": 1},
        },
        "model": Keyword("strict-serializable"),
        "workload": "list-append",
        "balances": {0: 100, 1: 0},
        "groups": {"us", "eu"},
        "a key with spaces": 1.5,
        "dir": "runs/jepsen/geo3/20261130T120000",
    }


def test_results_edn_reads_back_with_a_standard_reader_and_with_ours(tmp_path: Path) -> None:
    path = tmp_path / "results.edn"
    write_results(path, results_example())
    text = path.read_text(encoding="utf-8")

    ours = edn.loads(text)
    assert all(type(key) is Keyword for key in ours if key != "a key with spaces")
    assert ours["valid?"] is False
    assert type(ours["model"]) is Keyword
    assert type(ours["workload"]) is str
    assert ours["groups"] == frozenset({"us", "eu"})
    assert ours["balances"] == {0: 100, 1: 0}
    assert type(next(key for key in ours if key == "a key with spaces")) is str
    list_append = ours["checkers"]["list-append"]
    assert all(type(key) is Keyword for key in list_append)
    assert list_append["valid?"] is False
    assert type(list_append["anomaly-types"][0]) is Keyword
    fault = ours["nemesis"]["faults"][0]
    assert fault == {"kind": "kill", "target": "shard-0 leader", "start-s": 1.5, "end-s": None}
    assert type(fault["kind"]) is Keyword

    standard = edn_format.loads(text)
    valid = edn_format.Keyword("valid?")
    assert standard[valid] is False
    checkers = standard[edn_format.Keyword("checkers")]
    assert checkers[edn_format.Keyword("bank")][valid] is True
    assert standard[edn_format.Keyword("model")] == edn_format.Keyword("strict-serializable")
    assert standard[edn_format.Keyword("workload")] == "list-append"
    assert standard[edn_format.Keyword("dir")] == "runs/jepsen/geo3/20261130T120000"


def test_results_edn_puts_each_top_level_key_on_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "results.edn"
    write_results(path, results_example())
    lines = path.read_text(encoding="utf-8").splitlines()

    starts = [re.match(r'^[{ ](:\S+|"[^"]*")', line) for line in lines]
    assert [match.group(1) for match in starts if match] == [
        ":valid?", ":checkers", ":anomaly-types", ":anomalies", ":ops", ":nemesis", ":model",
        ":workload", ":balances", ":groups", '"a key with spaces"', ":dir",
    ]  # fmt: skip


def test_results_refuse_a_keyword_no_reader_could_read(tmp_path: Path) -> None:
    with pytest.raises(edn.EdnError):
        write_results(tmp_path / "results.edn", {"model": Keyword("not a keyword")})


def assert_png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000
    return data


@pytest.mark.parametrize("plot", [plot_latency, plot_rate])
def test_plots_shade_faults_including_one_still_open_at_the_end(tmp_path: Path, plot) -> None:
    history = synthetic_history()
    faults = faults_from_history(history)
    assert faults[-1].end_s is None

    plot(history, faults, tmp_path / "with-faults.png", "geo3 list-append")
    plot(history, [], tmp_path / "without-faults.png", "geo3 list-append")

    assert assert_png(tmp_path / "with-faults.png") != assert_png(tmp_path / "without-faults.png")


@pytest.mark.parametrize("plot", [plot_latency, plot_rate])
def test_plots_of_an_empty_history_are_still_written(tmp_path: Path, plot) -> None:
    plot([], [], tmp_path / "empty.png", "nothing happened")

    assert_png(tmp_path / "empty.png")


def test_timeline_has_a_box_per_completed_op_and_a_nemesis_column(tmp_path: Path) -> None:
    history = synthetic_history()
    history.append(Op("invoke", "txn", None, 0, 3200 * MS))  # never completed: no box
    history += [
        Op("invoke", "txn", None, 5, 3100 * MS),
        Op("ok", "txn", "<script>alert(1)</script>", 5, 3150 * MS),
    ]
    faults = faults_from_history(history)
    path = tmp_path / "timeline.html"

    write_timeline(history, faults, path, "geo3 <list-append>")
    page = path.read_text(encoding="utf-8")

    assert page.count('class="op ') == len(latencies(history)) == 61
    assert page.count('class="fault ') == len(faults) == 2
    assert ">nemesis</div>" in page
    assert "shard-0 leader 10.213.1.2:7200" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page
    assert "geo3 &lt;list-append&gt;" in page
    assert "http://" not in page
    assert "https://" not in page


def test_summary_of_an_invalid_run_names_the_anomaly_and_the_completed_share() -> None:
    text = summary(results_example())

    assert "INVALID" in text
    assert "G-single" in text
    assert "T1 < T2 (rw) < T1 (wr)" in text
    assert "90.0%" in text
    assert "kill 1" in text
    assert re.search(r"bank\s+valid", text)
    assert re.search(r"list-append\s+INVALID", text)
    assert "runs/jepsen/geo3/20261130T120000" in text


def test_summary_of_a_valid_run_and_of_an_empty_one() -> None:
    valid = summary({"valid?": True, "ops": {"ok": 3, "fail": 1, "info": 0}})
    assert "valid" in valid
    assert "INVALID" not in valid
    assert "75.0%" in valid

    assert "unknown" in summary({})
