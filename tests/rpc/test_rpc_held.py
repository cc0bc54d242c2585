"""Requests whose handler takes long: the server says it holds them, and the client then asks
again only every ``rto_held_ns`` (docs/rpc.md "Slow handlers"; native/mr_core.h). A client
waiting for a commit holds its request for a wide-area round trip: before this, each such
request was retransmitted every ``rto_ns`` (5 ms), 15 packets and a ping for a 75 ms wait."""

from __future__ import annotations

from typing import Any

import pytest

from store.rpc import Nexus, ReqHandle, RpcSettings
from store.rpc._native import MAGIC_DATA, decode_header
from tests.rpc.helpers import pattern, sim_pair

PKT_RESP = 3
SETTINGS = RpcSettings(rto_ns=5_000_000, rto_held_ns=50_000_000)
MS = 1_000_000


def _slow_pair(seed: int, settings: RpcSettings = SETTINGS, **network: Any) -> tuple[Any, ...]:
    """A server whose handler answers only when the test says so."""
    held: list[tuple[ReqHandle, bytes]] = []
    runs: list[bytes] = []

    def handler(handle: ReqHandle, payload: bytes) -> None:
        held.append((handle, payload))
        runs.append(payload)

    nexus = Nexus()
    nexus.register_req_func(1, handler)
    net, server, client = sim_pair(seed, settings, server_nexus=nexus, **network)
    return net, server, client, held, runs


@pytest.mark.parametrize("size", [10, 5000])
def test_a_held_request_is_asked_for_every_rto_held_not_every_rto(size: int) -> None:
    net, _server, client, held, runs = _slow_pair(seed=1)
    session = client.create_session("server")
    pending = client.enqueue_request(session, 1, pattern(size))
    net.run_for(300 * MS)  # the handler holds the request for 300 ms
    assert len(held) == 1
    stats = client.stats()
    # One retransmission at rto_ns draws the "held" answer, then one per rto_held_ns: 1 + 6.
    # Without it: one every rto_ns, 60.
    assert stats["rx_held"] >= 1
    assert 1 <= stats["retransmits"] <= 8, stats
    handle, payload = held.pop()
    handle.respond(payload[::-1])
    assert net.run_until(pending.done)
    assert pending.result() == pattern(size)[::-1]
    assert runs == [pattern(size)]  # the handler ran once


def test_a_lost_response_to_a_held_request_is_recovered() -> None:
    net, _server, client, held, runs = _slow_pair(seed=2)
    session = client.create_session("server")
    pending = client.enqueue_request(session, 1, b"wait for me")
    net.run_for(30 * MS)
    assert client.stats()["rx_held"] >= 1
    send = net.send
    dropped: list[bytes] = []

    def lose_first_response(src: str, dst: str, datagram: bytes) -> None:
        header = decode_header(datagram)
        if (
            not dropped and src == "server" and header is not None
            and header[6] == MAGIC_DATA and header[3] == PKT_RESP
        ):
            dropped.append(datagram)
            return
        send(src, dst, datagram)

    net.send = lose_first_response  # type: ignore[method-assign]
    handle, _payload = held.pop()
    handle.respond(b"done")
    answered_at = net.now_ns
    assert net.run_until(pending.done)
    assert dropped, "the response was not dropped: the test proves nothing"
    assert pending.result() == b"done"
    # Recovered by the held slot's retransmission, answered from the server's cache.
    assert net.now_ns - answered_at <= SETTINGS.rto_held_ns + 5 * MS
    assert runs == [b"wait for me"]


@pytest.mark.parametrize("seed", range(3))
def test_held_requests_under_loss_duplication_and_reordering(seed: int) -> None:
    """Exactly one answer each, one handler run each, whatever the network does to the
    held answers, the retransmissions and the responses."""
    net, _server, client, held, runs = _slow_pair(
        seed, loss=0.2, duplicate=0.2, reorder=0.2
    )
    session = client.create_session("server")
    sizes = [0, 10, 1500, 5000, 20_000, 3]
    pendings = [client.enqueue_request(session, 1, pattern(n, salt=i)) for i, n in enumerate(sizes)]
    assert net.run_until(lambda: len(held) == len(sizes), until_ns=10**10)
    net.run_for(200 * MS)
    for handle, payload in held:
        handle.respond(payload[::-1])
    assert net.run_until(lambda: all(p.done() for p in pendings), until_ns=net.now_ns + 10**10)
    for i, (pending, size) in enumerate(zip(pendings, sizes, strict=True)):
        assert pending.exception() is None, f"seed={seed}: {pending.exception()!r}"
        assert pending.result() == pattern(size, salt=i)[::-1]
    assert sorted(runs) == sorted(pattern(n, salt=i) for i, n in enumerate(sizes))


def test_rto_held_below_rto_is_refused() -> None:
    from store.rpc import _native

    with pytest.raises(ValueError, match="rto_held_ns"):
        _native.Core(**RpcSettings(rto_ns=10 * MS, rto_held_ns=MS).core_kwargs(), seed=1)
