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
    """A server whose handler of type 1 answers only when the test says so; type 2 echoes."""
    held: list[tuple[ReqHandle, bytes]] = []
    runs: list[bytes] = []

    def handler(handle: ReqHandle, payload: bytes) -> None:
        held.append((handle, payload))
        runs.append(payload)

    nexus = Nexus()
    nexus.register_req_func(1, handler)
    nexus.register_req_func(2, lambda _h, p: p)
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


def _held_among_traffic(settings: RpcSettings) -> tuple[dict[str, int], dict[str, int]]:
    """A slow request held 20 ms by a server that meanwhile answers a quick request every
    0.5 ms (a busy server: it receives, so its core runs, without a timer of its own)."""
    net, server, client, held, _runs = _slow_pair(seed=3, settings=settings)
    session = client.create_session("server")
    slow = client.enqueue_request(session, 1, b"slow")
    quick = []
    for i in range(40):
        quick.append(client.enqueue_request(session, 2, b"quick %d" % i))
        net.run_for(MS // 2)
    assert all(p.done() and p.result() == b"quick %d" % i for i, p in enumerate(quick))
    handle, payload = held.pop()
    handle.respond(payload)
    assert net.run_until(slow.done)
    assert slow.result() == b"slow"
    return client.stats(), server.stats()


def test_a_busy_server_says_held_unasked_so_a_slow_request_is_not_retransmitted() -> None:
    client, server = _held_among_traffic(SETTINGS)
    # "held" said once, at hold_ack_ns (2.5 ms), before the client's rto_ns (5 ms): no
    # retransmission, no duplicate at the server.
    assert server["held_sent"] == 1, server
    assert client["rx_held"] == 1, client
    assert client["retransmits"] == 0, client
    assert server["rx_dup_in_handler"] == 0, server
    # Without it (hold_ack_ns=0) the same 20 ms wait costs a retransmission and a duplicate.
    client, server = _held_among_traffic(SETTINGS.replace(hold_ack_ns=0))
    assert server["held_sent"] == 0, server
    assert client["retransmits"] >= 1 and server["rx_dup_in_handler"] >= 1, (client, server)


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


def _slow_path(settings: RpcSettings) -> tuple[dict[str, int], dict[str, Any]]:
    """400 requests, 8 at a time, over a path whose round trip is 3 to 7 ms (half of them
    longer than rto_ns, 5 ms), to a server that answers at once: a request waiting behind a
    busy server's other handlers looks like this."""
    net, _server, client = sim_pair(7, settings, latency_ns=3 * MS // 2, jitter_ns=2 * MS)
    session = client.create_session("server")
    for burst in range(400 // 8):
        pendings = [
            client.enqueue_request(session, 1, pattern(30, salt=burst * 8 + i)) for i in range(8)
        ]
        assert net.run_until(
            lambda pendings=pendings: all(p.done() for p in pendings), until_ns=net.now_ns + 10**10
        )
        assert [p.result() for p in pendings] == [pattern(30, salt=burst * 8 + i) for i in range(8)]
    return client.stats(), session.info()


def test_the_retransmission_timeout_adapts_to_round_trips_around_rto() -> None:
    """RFC 6298 per session: the round trips of requests answered within the timeout in use
    (Karn's rule) set it to srtt + 4 rttvar, between rto_ns and rto_max_ns, and requests
    stop being sent twice. A fixed rto_ns (rto_max_ns at or below it) sends every request
    slower than 5 ms twice."""
    stats, info = _slow_path(SETTINGS)
    assert stats["retransmits"] <= 40, stats
    assert 3 * MS <= info["srtt_ns"] <= 7 * MS, info
    assert 7 * MS <= info["rto_ns"] <= SETTINGS.rto_max_ns, info
    fixed, info = _slow_path(SETTINGS.replace(rto_max_ns=0))
    assert fixed["retransmits"] >= 120, fixed
    assert info["rto_ns"] == SETTINGS.rto_ns, info
