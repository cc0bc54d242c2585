"""What a replica's host answers to client requests it cannot serve: a typed Outcome a
client can decode and act on, never an empty reply."""

from __future__ import annotations

from typing import Any

from store import wire
from store.core.errors import Status
from store.core.follower import ShardFollower
from store.node.host import ReplicaHost
from store.protocol import codec
from store.protocol.messages import Outcome, SnapshotRead
from store.rpc import ReqHandle
from tests.node.helpers import idle_endpoint


class _Timers:
    def clock_ns(self) -> int:
        return 0

    def call_at(self, at_ns: int, callback: Any) -> Any:
        return None


def _host(replica: Any) -> ReplicaHost:
    return ReplicaHost(
        replica, rpc=idle_endpoint(), timers=_Timers(),
        peer_address=lambda address: address, stream_send=None, request_bytes_max=1 << 20,
        on_fatal=lambda exc: None,
    )


def _answer(host: ReplicaHost, payload: bytes) -> Outcome:
    handle = ReqHandle(host.rpc, session=0, generation=0, req_num=0, req_type=wire.SNAPSHOT)
    reply = host._on_snapshot(handle, payload)
    assert reply is not None
    outcome = codec.decode(reply)
    assert isinstance(outcome, Outcome)
    return outcome


def test_a_rejoining_follower_refuses_snapshot_reads_as_unavailable() -> None:
    host = _host(ShardFollower(0, "f/0", rejoining=True))
    refused = _answer(host, codec.encode(SnapshotRead(1, ["t/a"], [])))
    assert refused.status == Status.UNAVAILABLE and "rejoining" in refused.detail


def test_a_malformed_snapshot_request_is_invalid() -> None:
    host = _host(ShardFollower(0, "f/0"))
    assert _answer(host, b"\xc1garbage").status == Status.INVALID
    assert host.counters["bad_requests"] == 1
