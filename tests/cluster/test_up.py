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


def test_servers_exit_when_up_is_killed(tmp_path: Path) -> None:
    path = write_cluster_file(tmp_path)
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
    pids = [int(pid) for pid in re.findall(r"pid (\d+)", output)]
    up.kill()  # no chance to clean up: the servers notice their parent is gone
    up.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if pid_alive(pid)] == []
