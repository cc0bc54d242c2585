"""Credit-based flow control: a session never has more packets in flight than its credits
(DESIGN.md section 6; eRPC NSDI '19 section 5.2.2, eRPC's kSessionCredits)."""

from __future__ import annotations

from typing import Any

import pytest

from store.rpc import RpcSettings
from store.rpc._native import MAGIC_DATA, decode_header
from tests.rpc.helpers import echo_nexus, pattern, sim_pair

PKT_REQ, PKT_RFR = 0, 1


@pytest.mark.parametrize("credits", [1, 4, 32])
def test_in_flight_never_exceeds_credits(credits: int) -> None:
    settings = RpcSettings(session_credits=credits, session_req_window=8)
    net, _server, client = sim_pair(seed=credits, settings=settings, server_nexus=echo_nexus())
    # Observe the wire independently of the core: data packets sent by the client (request and
    # RFR packets) minus those delivered to it (credit returns and responses).
    in_flight = 0
    in_flight_max = 0
    send, take_due = net.send, net.take_due

    def observed_send(src: str, dst: str, datagram: bytes) -> None:
        nonlocal in_flight, in_flight_max
        header = decode_header(datagram)
        if src == "client" and header is not None and header[6] == MAGIC_DATA:
            assert header[3] in (PKT_REQ, PKT_RFR)
            in_flight += 1
            in_flight_max = max(in_flight_max, in_flight)
            assert in_flight <= credits, f"{in_flight} packets in flight with {credits} credits"
        send(src, dst, datagram)

    def observed_take_due(address: str, now_ns: int) -> list[tuple[str, bytes]]:
        nonlocal in_flight
        due = take_due(address, now_ns)
        if address == "client":
            for _src, datagram in due:
                header = decode_header(datagram)
                if header is not None and header[6] == MAGIC_DATA:
                    in_flight -= 1
        return due

    net.send = observed_send  # type: ignore[method-assign]
    net.take_due = observed_take_due  # type: ignore[method-assign]
    session = client.create_session("server")
    sizes = [0, 10, 5000, 40_000, 200_000] * 4
    pendings: list[Any] = [client.enqueue_request(session, 1, pattern(n)) for n in sizes]
    assert net.run_until(lambda: all(p.done() for p in pendings))
    assert [p.result() for p in pendings] == [pattern(n) for n in sizes]
    assert in_flight_max == credits  # the window was actually used
    info = session.info()
    assert info["in_flight_max"] == credits
    assert info["credits"] == credits  # every credit came back


def test_credits_hold_under_faults_too() -> None:
    settings = RpcSettings(session_credits=4, rto_ns=200_000)
    net, _server, client = sim_pair(
        seed=5, settings=settings, loss=0.2, duplicate=0.2, reorder=0.2
    )
    session = client.create_session("server")
    pendings = [client.enqueue_request(session, 1, pattern(n)) for n in [3000, 9000, 0, 70_000]]
    assert net.run_until(lambda: all(p.done() for p in pendings))
    assert session.info()["in_flight_max"] <= 4
    assert client.stats()["in_flight_max"] <= 4


def test_server_refuses_when_out_of_credits() -> None:
    """The connect handshake is refused once the server has granted all its credits
    (eRPC's kRingExhausted)."""
    from store.rpc import SessionRefused

    settings = RpcSettings(session_credits=32, server_credits_max=64)
    net, _server, client = sim_pair(seed=9, settings=settings)
    sessions = [client.create_session("server") for _ in range(3)]
    assert net.run_until(lambda: all(s.state != "connecting" for s in sessions))
    assert [s.state for s in sessions] == ["connected", "connected", "failed"]
    assert isinstance(sessions[2].error, SessionRefused)
    with pytest.raises(SessionRefused):
        client.enqueue_request(sessions[2], 1, b"x")
    # Closing one session gives its credits back.
    client.destroy_session(sessions[0])
    net.run_for(10**8)
    again = client.create_session("server")
    assert net.run_until(lambda: again.state != "connecting")
    assert again.connected
