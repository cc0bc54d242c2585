"""A peer that restarts is detected and the session can be re-created; a dead peer surfaces
as PeerUnavailable within the session timeout instead of a hang (DESIGN.md section 6)."""

from __future__ import annotations

import asyncio

import pytest

from store.rpc import Nexus, PeerRestarted, PeerUnavailable, RpcSettings
from store.rpc.aio import Rpc
from store.rpc.sim import SimRpc
from tests.rpc.helpers import echo_nexus, run, sim_pair

SIM_SETTINGS = RpcSettings(rto_ns=1_000_000, session_timeout_ns=100_000_000)


def test_sim_restarted_server_is_detected_and_session_recreated() -> None:
    net, server, client = sim_pair(seed=1, settings=SIM_SETTINGS)
    session = client.create_session("server")
    first = client.enqueue_request(session, 1, b"before")
    assert net.run_until(first.done)
    assert first.result() == b"before"
    old_incarnation = server.incarnation

    server.crash()
    restarted = SimRpc(echo_nexus(), net, "server", SIM_SETTINGS)
    assert restarted.incarnation != old_incarnation
    pending = client.enqueue_request(session, 1, b"after")
    assert net.run_until(pending.done)
    with pytest.raises(PeerRestarted):
        pending.result()
    assert session.state == "failed"
    # Detected by a reset and a ping, long before the session timeout.
    assert net.now_ns < SIM_SETTINGS.session_timeout_ns

    again = client.create_session("server")
    pending = client.enqueue_request(again, 1, b"again")
    assert net.run_until(pending.done)
    assert pending.result() == b"again"


def test_sim_dead_server_times_out() -> None:
    net, server, client = sim_pair(seed=2, settings=SIM_SETTINGS)
    session = client.create_session("server")
    assert net.run_until(lambda: session.connected)
    server.crash()
    start = net.now_ns
    pending = client.enqueue_request(session, 1, b"x")
    assert net.run_until(pending.done)
    with pytest.raises(PeerUnavailable) as info:
        pending.result()
    assert not isinstance(info.value, PeerRestarted)
    assert net.now_ns - start >= SIM_SETTINGS.session_timeout_ns
    with pytest.raises(PeerUnavailable):
        client.enqueue_request(session, 1, b"y")


def test_sim_connect_to_nobody_fails() -> None:
    net, _server, client = sim_pair(seed=3, settings=SIM_SETTINGS)
    session = client.create_session("nobody")
    pending = client.enqueue_request(session, 1, b"x")
    assert net.run_until(pending.done)
    assert isinstance(pending.exception(), PeerUnavailable)


def test_sim_slow_handler_is_not_a_dead_peer() -> None:
    """A handler that answers after several RTOs (and after the session timeout) keeps its
    session: pings prove the server alive while it drops duplicates of the request."""
    nexus = Nexus()
    held = []
    nexus.register_req_func(1, lambda handle, _p: held.append(handle))
    net, server, client = sim_pair(seed=4, settings=SIM_SETTINGS, server_nexus=nexus)
    session = client.create_session("server")
    pending = client.enqueue_request(session, 1, b"slow")
    net.run_for(3 * SIM_SETTINGS.session_timeout_ns)
    assert not pending.done() and len(held) == 1
    server.enqueue_response(held[0], b"finally")
    assert net.run_until(pending.done)
    assert pending.result() == b"finally"
    assert server.stats()["rx_dup_in_handler"] > 0


def test_udp_restarted_server_is_detected_and_session_recreated() -> None:
    settings = RpcSettings(rto_ns=2_000_000, session_timeout_ns=500_000_000)

    async def main() -> None:
        server = Rpc.udp(echo_nexus(), settings=settings)
        address = server.address
        client = Rpc.udp(Nexus(), settings=settings)
        session = await client.connect(address)
        assert await client.call(session, 1, b"one") == b"one"
        server.close()
        server = Rpc.udp(echo_nexus(), port=address[1], settings=settings)
        with pytest.raises(PeerRestarted):
            await client.call(session, 1, b"two")
        session = await client.connect(address)
        assert await client.call(session, 1, b"three") == b"three"
        server.close()
        with pytest.raises(PeerUnavailable):
            await client.call(session, 1, b"four")
        client.close()

    run(main)


def test_udp_connect_timeout_is_typed() -> None:
    settings = RpcSettings(rto_ns=2_000_000, session_timeout_ns=100_000_000)

    async def main() -> None:
        import socket

        # A bound socket that never answers.
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        client = Rpc.udp(Nexus(), settings=settings)
        with pytest.raises(PeerUnavailable):
            await client.connect(silent.getsockname())
        client.close()
        silent.close()
        await asyncio.sleep(0)

    run(main)


def test_sim_partition_fails_the_session_then_heals_for_a_new_one() -> None:
    net, _server, client = sim_pair(seed=8, settings=SIM_SETTINGS)
    session = client.create_session("server")
    assert net.run_until(lambda: session.connected)
    net.partition("client", "server")
    pending = client.enqueue_request(session, 1, b"cut off")
    assert net.run_until(pending.done)
    assert isinstance(pending.exception(), PeerUnavailable)
    net.heal()
    again = client.create_session("server")
    pending = client.enqueue_request(again, 1, b"healed")
    assert net.run_until(pending.done)
    assert pending.result() == b"healed"
