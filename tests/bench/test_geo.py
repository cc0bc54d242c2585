"""bench/geo.py on a real 3-region cluster: certified and committed throughput are reported
apart (issue 12 item 4). Slow: four clusters of server processes are started in turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_geo_reports_committed_beside_certified() -> None:
    port = 43000 + (os.getpid() % 20) * 20
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "geo.py"), "--duration", "2", "--drain", "10",
         "--clients", "4", "--keys-per-shard", "200", "--base-port", str(port), "--json"],
        check=True, capture_output=True, text=True, timeout=300,
    )
    result = json.loads(out.stdout)
    for name in ("rtt0", "rtt50", "nospec_rtt50", "rtt50_nofsync"):
        run = result["runs"][name]
        assert result[f"certified_txn_per_s_{name}"] == run["certified_txn_per_s"] > 0
        assert result[f"committed_txn_per_s_{name}"] == run["committed_txn_per_s"] > 0
        assert run["committed"] <= run["certified"]
        assert run["certified_not_committed_at_window_end"] == run["certified"] - run["committed"]
        assert run["committed_after_window"] + run["never_committed"] == (
            run["certified_not_committed_at_window_end"]
        )
        assert run["rolled_back"] == 0  # no process fails
    assert "txn_per_s_rtt50" not in result  # the ambiguous key is gone
    assert result["wan_ratio_committed"] > 0 and result["speculation_gain_committed"] > 0
    assert result["fsync_ratio_certified"] > 0 and result["committed_p50_over_rtt"] > 0
