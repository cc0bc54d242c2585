"""Batched peer requests at the host (store/node/host.py; wire.PEER_MANY): what a leader
sends another in one ``ready()`` goes as one request, each message handed to the replica as
if it came alone, the replies in order in the response. Run on the simulated cluster, whose
servers are the production host on the real RPC core."""

from __future__ import annotations

from typing import Any

import pytest

from store import wire
from store.node.host import ReplicaHost
from store.protocol import codec
from store.protocol.messages import Gossip, ReadReply, ReadRequest
from store.rpc import Nexus
from store.sim.cluster import sim_endpoint
from store.sim.local import LocalCluster
from store.sim.network import MS
from store.sim.run import SimOptions, run_many


def _settle(cluster: LocalCluster, done: Any) -> None:
    for _ in range(10_000):
        if done():
            return
        cluster.run_for(1 * MS)
    raise AssertionError("did not settle")


@pytest.mark.patches_core  # counts by patching the host, which runs compiled elsewhere
def test_peer_batches_are_sent_in_simulated_runs_and_every_history_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader's gossip, prepares, installs and reads to one peer made in one step go as
    one PEER_MANY: the simulator's runs (loss, duplication, reordering) send them, and the
    histories stay clean."""
    batches: list[int] = []
    on_peer_many = ReplicaHost._on_peer_many

    def counted(self: ReplicaHost, handle: Any, payload: bytes) -> bytes | None:
        batches.append(len(codec.decode_batch(payload)))
        return on_peer_many(self, handle, payload)

    monkeypatch.setattr(ReplicaHost, "_on_peer_many", counted)
    summary = run_many([0, 1, 2], SimOptions(loss=0.05))
    assert summary["anomalies"] == 0, summary.get("first_failure")
    assert len(batches) > 10 and max(batches) >= 2, batches


def test_a_malformed_peer_batch_is_answered_empty_and_a_bad_item_alone_is_refused() -> None:
    cluster = LocalCluster(shards=1)
    cluster.preload({"t/a": 1})
    cluster.network.add("peer/raw", "us")
    rpc = sim_endpoint(Nexus(), cluster.network, "peer/raw", cluster.cluster.rpc_settings)
    session = rpc.create_session(cluster.leaders[0])
    answers: list[bytes | None] = []
    read = codec.encode(ReadRequest(7, 1, ["t/a"], []))
    for payload in (b"\xc1", codec.encode_batch([read])[:-3], read):
        rpc.enqueue_request(session, wire.PEER_MANY, payload, lambda p, e: answers.append(p))
    _settle(cluster, lambda: len(answers) == 3)
    assert answers == [b"", b"", b""]
    host = cluster.cluster.server(cluster.leaders[0]).host
    assert host.counters["bad_requests"] == 3
    # Garbage, a one-way message and a request: refused, taken, answered, in that order.
    gossip = codec.encode(Gossip(0, {0: 0}))
    rpc.enqueue_request(
        session, wire.PEER_MANY, codec.encode_batch([b"\xc1", gossip, read]),
        lambda p, e: answers.append(p),
    )
    _settle(cluster, lambda: len(answers) == 4)
    bad, one_way, reply = codec.decode_batch(answers[3], 3)  # type: ignore[arg-type]
    assert bad == b"" and one_way == b""
    decoded = codec.decode(reply)
    assert isinstance(decoded, ReadReply) and decoded.txn_id == 7
    assert [item[2] for item in decoded.items] == [1]
    assert host.counters["bad_requests"] == 4
