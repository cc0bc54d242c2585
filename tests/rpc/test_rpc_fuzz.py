"""The packet parser's fuzz target runs for a few seconds in the suite (docs/rpc.md gives
the longer command). A crash or sanitizer report fails the test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TARGET = Path(__file__).with_name("fuzz_rpc_packet.py")
REPO = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 3


def test_fuzz_target_runs_briefly_without_findings(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is in the test extra; not installed here")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(TARGET), f"-max_total_time={FUZZ_SECONDS}", "-rss_limit_mb=4096",
         f"-artifact_prefix={tmp_path}/"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert "Done" in tail and "runs in" in tail, tail
