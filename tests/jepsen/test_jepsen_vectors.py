"""Real Jepsen histories with known verdicts (../shared/test-vectors/jepsen-histories/).

The verdicts are those of Elle and Jepsen's bank checker, as the folder's README.md states
them; a disagreement means our checker is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen.check import main
from jepsen.checkers.bank import check_bank
from jepsen.checkers.list_append import check_list_append
from jepsen.history import read_history


def test_paper_example_is_a_cycle(vectors: Path) -> None:
    # The Elle paper's example: a dependency cycle, so not serializable.
    history = read_history(vectors / "paper-example.edn")
    for models in (["strict-serializable"], ["serializable"]):
        result = check_list_append(history, consistency_models=models)
        assert not result["valid"]
    cycles = [t for t in result["anomaly_types"] if t.startswith(("G0", "G1c", "G-single", "G2"))]
    assert cycles, result["anomaly_types"]


def test_gh_30_two_anti_dependencies(vectors: Path) -> None:
    # No read sees any appended element: the rw edges come only from reads that did not
    # see committed appends, and two of them close a cycle.
    history = read_history(vectors / "list-append-gh-30.edn")
    result = check_list_append(history, consistency_models=["serializable"])
    assert not result["valid"]
    assert result["anomaly_types"] == ["G2-item"]
    steps = result["anomalies"]["G2-item"][0]["steps"]
    assert [step["type"] for step in steps] == ["rw", "rw"]
    assert "serializable" in result["also_not"]


def test_bank_verdicts(vectors: Path) -> None:
    assert check_bank(read_history(vectors / "bank.edn"))["valid"]
    assert not check_bank(read_history(vectors / "bank-tidb.edn"))["valid"]
    assert check_bank(read_history(vectors / "bank-neg.edn"), negative_ok=True)["valid"]


def test_command_line(vectors: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "list-append", str(vectors / "list-append-gh-30.edn")]) == 1
    assert "G2-item" in capsys.readouterr().out
    assert main(["--model", "bank", "--json", str(vectors / "bank.edn")]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    assert main(["--model", "bank", "--negative-ok", str(vectors / "bank-neg.edn")]) == 0


def test_command_line_as_a_module(tmp_path: Path) -> None:
    bad = tmp_path / "bad.edn"
    bad.write_text("{:type :ok")
    completed = subprocess.run(
        [sys.executable, "-m", "jepsen.check", "--model", "bank", str(bad)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert completed.returncode == 2 and "cannot check" in completed.stderr
