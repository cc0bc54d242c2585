"""Every server serves Prometheus metrics (issue 13): they parse with prometheus_client's
own parser, and the committed-transactions counters add up to what clients were told."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from store import config as config_module
from store.client import Client
from store.node.scrape import scrape_cluster, total
from store.node.up import ProcessCluster
from tests.cluster.conftest import run, write_cluster_file


def test_metrics_parse_and_committed_counters_sum_to_what_clients_heard(tmp_path: Path) -> None:
    config = config_module.load(write_cluster_file(tmp_path))
    cluster = ProcessCluster(config)
    cluster.start()
    try:
        cluster.wait_ready()
        before = scrape_cluster(config)
        assert all(samples is not None for samples in before.values()), before

        async def load() -> int:
            committed = 0
            async with await Client.connect(config) as client:
                for i in range(300):
                    keys = [f"m/{i}", f"m/{i + 1}", f"m/{i + 7}"]
                    await client.run_ops([["increment", key, 1] for key in keys])
                    committed += 1
                    await client.run_ops([["get", key] for key in keys])
                    committed += 1
            return committed

        committed = run(load())
        after = scrape_cluster(config)
        counted = sum(
            total(after[a], "meridian_transactions_committed_total")
            - total(before[a], "meridian_transactions_committed_total")
            for a in after
        )
        assert counted == committed
        certified = sum(
            total(after[a], "meridian_transactions_certified_total") for a in after
        )
        assert certified >= committed
        # Latency histograms: one observation per COMMITTED answer, in buckets that add up.
        observations = sum(total(after[a], "meridian_commit_latency_seconds_count") for a in after)
        assert observations >= committed
        for samples in after.values():
            infinite = [v for labels, v in samples["meridian_commit_latency_seconds_bucket"]
                        if labels["le"] == "+Inf"]
            assert infinite == [total(samples, "meridian_commit_latency_seconds_count")]
            assert {labels["role"] for labels, _ in samples["meridian_up"]} == {"leader"}
            causes = {labels["cause"] for labels, _ in samples["meridian_transactions_aborted_total"]}
            assert {"conflict", "validation", "unreachable", "epoch"} <= causes
            assert total(samples, "meridian_rpc_requests_handled_total") > 0
            datagrams = total(samples, "meridian_rpc_datagrams_sent_total")
            assert 0 < datagrams <= total(samples, "meridian_rpc_packets_sent_total")
            assert samples["meridian_shard_watermark"]
            # The replica's deadlines (a batch's close among them) ran, and none before its time.
            run_count = total(samples, "meridian_timer_deadlines_run_total")
            assert run_count > 0 and len(samples["meridian_timer_lateness_seconds_total"]) == 1
            # Mean lateness under a second: not a sum of nanoseconds read as seconds.
            assert 0 <= total(samples, "meridian_timer_lateness_seconds_total") / run_count < 1
    finally:
        cluster.stop()


def test_the_endpoint_answers_only_get_metrics_and_survives_garbage(tmp_path: Path) -> None:
    config = config_module.load(write_cluster_file(tmp_path, shards=1))
    cluster = ProcessCluster(config)
    cluster.start()
    try:
        cluster.wait_ready()
        host, port = config.metrics_listen(config.nodes()[0])  # type: ignore[misc]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{host}:{port}/other", timeout=5)
        assert missing.value.code == 404
        for garbage in (b"\x00\xff" * 100 + b"\r\n\r\n", b"POST /metrics HTTP/1.1\r\n\r\n", b"GET"):
            with socket.create_connection((host, port), timeout=5) as conn:
                conn.sendall(garbage)
                conn.shutdown(socket.SHUT_WR)
                conn.recv(4096)  # an error answer, or the connection closed: never a crash
        assert scrape_cluster(config)[config.nodes()[0].address] is not None
    finally:
        cluster.stop()
