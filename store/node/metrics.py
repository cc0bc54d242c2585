"""Prometheus metrics of a server process, served over HTTP on its event loop.

Nothing is counted here: the replica already counts (its coordinator's counters and latency
histograms, its watermarks, its stream; the RPC core's and the replication transport's
statistics). A scrape reads them (``ServerCollector.collect``) and writes the text format of
``prometheus_client``. The HTTP server runs on the server's own event loop, so a scrape
reads the replica between two of its steps, never in the middle of one (a thread, as
``prometheus_client.start_http_server`` uses, would read dictionaries the loop is
changing).

Metric names start with ``meridian_``; every metric carries the process's ``role``,
``shard`` (-1 for a configuration manager member) and ``region``. What each one means is
in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from store.core.metrics import LATENCY_BOUNDS_NS, LatencyHistogram

log = logging.getLogger("meridian.metrics")

# An HTTP request this server reads at most (a scrape is one short GET).
REQUEST_BYTES_MAX = 8192
REQUEST_TIMEOUT_S = 5.0


def _histogram(
    name: str, documentation: str, labels: dict[str, str], histogram: LatencyHistogram
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(LATENCY_BOUNDS_NS, histogram.counts, strict=False):
        running += count
        buckets.append((f"{bound / 1e9:g}", float(running)))
    buckets.append(("+Inf", float(histogram.observations)))
    family.add_metric(list(labels.values()), buckets, histogram.sum_ns / 1e9)
    return family


class ServerCollector(Collector):
    """Reads one server process's state (``snapshot`` returns it) into metric families."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        state = self.snapshot()
        labels = {"role": state["role"], "shard": str(state["shard"]), "region": state["region"]}
        keys, values = list(labels), list(labels.values())

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=keys)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=keys)
            family.add_metric(values, value)
            return family

        yield gauge("meridian_up", "1 while the process serves", 1)
        yield gauge("meridian_epoch", "the epoch of the cluster map this process is in", state["epoch"])
        coordinator = state.get("coordinator")
        if coordinator is not None:
            counters = coordinator["counters"]
            yield counter(
                "meridian_transactions_certified", "transactions certified here (as coordinator)",
                counters["certified"],
            )
            yield counter(
                "meridian_transactions_committed",
                "transactions answered COMMITTED here (as coordinator)", counters["committed"],
            )
            yield counter(
                "meridian_transactions_rolled_back",
                "certified transactions recovery rolled back (answered ROLLED_BACK here)",
                counters["rolled_back"],
            )
            aborted = CounterMetricFamily(
                "meridian_transactions_aborted", "transactions aborted here, by cause",
                labels=[*keys, "cause"],
            )
            for cause, count in sorted(coordinator["aborts_by_cause"].items()):
                aborted.add_metric([*values, cause], count)
            yield aborted
            yield gauge(
                "meridian_transactions_in_flight", "transactions this coordinator is running",
                coordinator["in_flight"],
            )
            yield _histogram(
                "meridian_certify_latency_seconds",
                "from a SUBMIT's arrival to the transaction's certification (server side)",
                labels, coordinator["certify_latency"],
            )
            yield _histogram(
                "meridian_commit_latency_seconds",
                "from a SUBMIT's arrival to the COMMITTED answer (server side)",
                labels, coordinator["commit_latency"],
            )
        watermarks = GaugeMetricFamily(
            "meridian_shard_watermark",
            "what this process knows of each shard's watermark (counter values; the high "
            "bits are the epoch)",
            labels=[*keys, "of_shard"],
        )
        for shard, mark in sorted(state["vector_watermark"].items()):
            watermarks.add_metric([*values, str(shard)], mark)
        yield watermarks
        stream = state.get("stream")
        if stream is not None:
            yield _histogram(
                "meridian_stream_batch_wait_seconds",
                "from a batch's first record to the batch's close (the stream's batch delay)",
                labels, stream["batch_wait"],
            )
            yield _histogram(
                "meridian_stream_choose_seconds",
                "from an entry's proposal to its choice by a majority of regions",
                labels, stream["choose_latency"],
            )
        lag = state.get("follower_lag_slots")
        if lag is not None:
            family = GaugeMetricFamily(
                "meridian_follower_lag_slots",
                "stream slots this leader proposed that the follower has not accepted",
                labels=[*keys, "follower"],
            )
            for follower, slots in sorted(lag.items()):
                family.add_metric([*values, follower], slots)
            yield family
        if "applied_slots" in state:
            yield counter(
                "meridian_applied_slots", "stream slots this follower has applied",
                state["applied_slots"],
            )
        if "keys" in state:
            yield gauge("meridian_keys", "keys in this replica's store", state["keys"])
        replication = state.get("replication")
        if replication is not None:
            yield counter(
                "meridian_replication_messages_sent", "Paxos messages sent over gRPC",
                replication["messages_sent"],
            )
            yield counter(
                "meridian_replication_batches_sent", "gRPC writes (batches of Paxos messages)",
                replication["batches_sent"],
            )
            yield counter(
                "meridian_replication_bytes_sent", "bytes of the batches sent over gRPC",
                replication["bytes_sent"],
            )
            yield counter(
                "meridian_replication_messages_dropped",
                "Paxos messages dropped (queue full, stream ended; Paxos sends them again)",
                replication["dropped"],
            )
            queued = GaugeMetricFamily(
                "meridian_replication_queue_messages",
                "Paxos messages queued for a peer, not yet written", labels=[*keys, "peer"],
            )
            for peer, depth in sorted(replication["queued"].items()):
                queued.add_metric([*values, peer], depth)
            yield queued
        rpc = state["rpc"]
        yield counter(
            "meridian_rpc_retransmissions", "packets the RPC core sent again (go-back-N)",
            rpc["retransmits"],
        )
        yield counter(
            "meridian_rpc_held_sent",
            "requests said held (in their handler) unasked, after hold_ack_ns",
            rpc["held_sent"],
        )
        yield counter("meridian_rpc_packets_sent", "packets the RPC core sent", rpc["tx_pkts"])
        yield counter(
            "meridian_rpc_packets_received", "packets the RPC core received", rpc["rx_pkts"]
        )
        yield counter(
            "meridian_rpc_datagrams_sent",
            "UDP datagrams that carried them (packets for one peer share one, up to the MTU)",
            rpc["tx_datagrams"],
        )
        yield counter(
            "meridian_rpc_datagrams_received", "UDP datagrams received", rpc["rx_datagrams"]
        )
        yield counter(
            "meridian_rpc_requests_handled", "requests this process's RPC core answered",
            rpc["requests_handled"],
        )
        yield counter(
            "meridian_rpc_sessions_refused", "sessions refused for want of credits or room",
            rpc["sessions_refused"],
        )
        yield counter(
            "meridian_rpc_unauthenticated",
            "session packets without a valid cluster-secret MAC (connects refused, others dropped)",
            rpc["sm_unauthenticated"],
        )
        lateness = state.get("timer_lateness")
        if lateness is not None:
            yield counter(
                "meridian_timer_deadlines_run", "the replica's deadlines run (store/rpc/timers.py)",
                lateness["count"],
            )
            yield counter(
                "meridian_timer_lateness_seconds",
                "how late they ran, summed (the instant each callback started minus its deadline)",
                lateness["sum_ns"] / 1e9,
            )


def render(collector: ServerCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text: bytes = generate_latest(registry)
    return text


class MetricsServer:
    """``GET /metrics`` on ``(host, port)``, answered on the event loop."""

    def __init__(self, collector: ServerCollector, host: str, port: int) -> None:
        self.collector = collector
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self.scrapes = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            if len(head) > REQUEST_BYTES_MAX:
                raise ValueError("request too large")
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or parts[0] != b"GET":
                await self._answer(writer, b"405 Method Not Allowed", b"GET /metrics only\n")
            elif parts[1].split(b"?", 1)[0] != b"/metrics":
                await self._answer(writer, b"404 Not Found", b"metrics are at /metrics\n")
            else:
                self.scrapes += 1
                await self._answer(
                    writer, b"200 OK", render(self.collector),
                    b"text/plain; version=0.0.4; charset=utf-8",
                )
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, ConnectionError):
            pass  # a client that went away or sent garbage: nothing to answer
        finally:
            writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, status: bytes, body: bytes,
        content_type: bytes = b"text/plain; charset=utf-8",
    ) -> None:
        writer.write(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
