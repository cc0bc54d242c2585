"""The Python API's contract (DESIGN.md section 6; STYLE.md "errors are typed")."""

from __future__ import annotations

import asyncio

import pytest

from store.rpc import (
    HandlerFailed,
    Nexus,
    ReqHandle,
    RequestTimeout,
    RpcSettings,
    SessionClosed,
    UnknownRequestType,
)
from store.rpc.aio import Rpc
from store.rpc.sim import SimRpc
from tests.rpc.helpers import echo_nexus, run, sim_pair


def test_nexus_rejects_bad_registrations() -> None:
    nexus = Nexus()
    nexus.register_req_func(1, lambda _h, p: p)
    with pytest.raises(ValueError, match="already registered"):
        nexus.register_req_func(1, lambda _h, p: p)
    with pytest.raises(ValueError):
        nexus.register_req_func(256, lambda _h, p: p)


def test_settings_are_checked_by_the_core() -> None:
    with pytest.raises(ValueError, match="mtu_bytes"):
        sim_pair(seed=0, settings=RpcSettings(mtu_bytes=10))
    with pytest.raises(ValueError, match="msg_size_max"):
        sim_pair(seed=0, settings=RpcSettings(msg_size_max=1 << 24))


def test_unknown_request_type_and_failing_handler_are_typed() -> None:
    nexus = echo_nexus()

    def broken(_handle: ReqHandle, _payload: bytes) -> bytes:
        raise KeyError("boom")

    nexus.register_req_func(9, broken)
    net, _server, client = sim_pair(seed=1, server_nexus=nexus)
    session = client.create_session("server")
    unknown = client.enqueue_request(session, 200, b"x")
    failing = client.enqueue_request(session, 9, b"x")
    fine = client.enqueue_request(session, 1, b"still served")
    assert net.run_until(lambda: fine.done() and unknown.done() and failing.done())
    with pytest.raises(UnknownRequestType):
        unknown.result()
    with pytest.raises(HandlerFailed, match="boom"):
        failing.result()
    assert fine.result() == b"still served"


def test_destroy_session_fails_outstanding_requests() -> None:
    nexus = Nexus()
    nexus.register_req_func(1, lambda _h, _p: None)  # never answers
    net, _server, client = sim_pair(seed=2, server_nexus=nexus)
    session = client.create_session("server")
    pending = client.enqueue_request(session, 1, b"x")
    net.run_for(10**6)
    client.destroy_session(session)
    assert isinstance(pending.exception(), SessionClosed)
    with pytest.raises(SessionClosed):
        client.enqueue_request(session, 1, b"y")


def test_requests_queue_beyond_the_window_and_while_connecting() -> None:
    net, _server, client = sim_pair(seed=3, settings=RpcSettings(session_req_window=2))
    session = client.create_session("server")
    pendings = [client.enqueue_request(session, 1, bytes([i])) for i in range(50)]
    assert session.state == "connecting"
    assert net.run_until(lambda: all(p.done() for p in pendings))
    assert [p.result() for p in pendings] == [bytes([i]) for i in range(50)]


def test_sim_coroutine_handler_may_await_a_nested_rpc() -> None:
    """A handler that calls another server (as a 2PC coordinator does) runs unchanged on the
    simulator's trampoline."""
    net, _backend, front_client = sim_pair(seed=4, server_nexus=echo_nexus(reverse=True))
    front_nexus = Nexus()
    front = SimRpc(front_nexus, net, "front")
    backend_session = front.create_session("server")

    async def relay(_handle: ReqHandle, payload: bytes) -> bytes:
        inner = await front.enqueue_request(backend_session, 1, payload)
        return b"relayed:" + inner

    front_nexus.register_req_func(5, relay)
    session = front_client.create_session("front")
    pending = front_client.enqueue_request(session, 5, b"abc")
    assert net.run_until(pending.done)
    assert pending.result() == b"relayed:cba"


def test_call_deadlines_share_timers_never_fire_early_and_are_forgotten() -> None:
    """``Rpc.call``'s timeouts are kept in buckets (CALL_DEADLINE_BUCKET_NS), one timer for
    the earliest: an unanswered call times out no earlier than its timeout and at most a
    bucket (and a loop iteration) later; an answered one never does; nothing is kept once
    every bucket has passed."""
    import time

    from store.rpc.aio import CALL_DEADLINE_BUCKET_NS

    async def main() -> None:
        nexus = Nexus()
        nexus.register_req_func(1, lambda _h, _p: None)  # never answers
        nexus.register_req_func(2, lambda _h, p: p)  # answers at once
        server = Rpc.udp(nexus)
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)

        async def timed(timeout: float) -> float:
            began = time.monotonic()
            with pytest.raises(RequestTimeout):
                await client.call(session, 1, b"x", timeout=timeout)
            return time.monotonic() - began

        timeouts = [0.03, 0.03, 0.05, 0.08, 0.08, 0.08]
        answered = [client.call(session, 2, b"y", timeout=0.03) for _ in range(20)]
        results = await asyncio.gather(*(timed(t) for t in timeouts), *answered)
        waited = results[: len(timeouts)]
        assert results[len(timeouts):] == [b"y"] * 20
        slack = CALL_DEADLINE_BUCKET_NS / 1e9 + 0.05  # a bucket, and a busy test machine
        for timeout, took in zip(timeouts, waited, strict=True):
            assert timeout <= took <= timeout + slack, (timeout, took)
        deadline = time.monotonic() + 2.0  # past every answered call's bucket too
        while client._deadlines and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert not client._deadlines and not client._deadline_buckets
        assert client._deadline_timer is None
        client.close()
        server.close()
        await asyncio.sleep(0)

    run(main)


def test_call_timeout_is_typed() -> None:
    async def main() -> None:
        nexus = Nexus()
        nexus.register_req_func(1, lambda _h, _p: None)  # never answers
        server = Rpc.udp(nexus)
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)
        with pytest.raises(RequestTimeout):
            await client.call(session, 1, b"x", timeout=0.02)
        client.close()
        server.close()
        await asyncio.sleep(0)

    run(main)


def test_continuation_style_on_asyncio() -> None:
    async def main() -> None:
        server = Rpc.udp(echo_nexus())
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)
        done = asyncio.get_running_loop().create_future()
        count = 0

        def cont(payload: bytes | None, error: object) -> None:
            nonlocal count
            assert error is None and payload == b"again"
            count += 1
            if count < 100:
                client.enqueue_request(session, 1, b"again", cont)
            else:
                done.set_result(None)

        client.enqueue_request(session, 1, b"again", cont)
        await done
        client.close()
        server.close()

    run(main)


def test_late_response_never_reaches_a_new_session_with_the_same_number() -> None:
    """A deferred handle outlives its session; the session number is reused by the next
    connect. The late answer is dropped, not delivered to the newcomer (the handle carries the
    session's generation)."""
    nexus = Nexus()
    held: list[ReqHandle] = []
    nexus.register_req_func(1, lambda handle, _p: held.append(handle))
    # One session slot, so the number must be reused (numbers are otherwise round-robin).
    net, server, client = sim_pair(seed=5, server_nexus=nexus,
                                   settings=RpcSettings(sessions_max=1))
    old = client.create_session("server")
    first = client.enqueue_request(old, 1, b"first")
    assert net.run_until(lambda: len(held) == 1)
    client.destroy_session(old)
    net.run_for(10**7)
    new = client.create_session("server")
    second = client.enqueue_request(new, 1, b"second")
    assert net.run_until(lambda: len(held) == 2)
    assert held[0].session == held[1].session and held[0].req_num == held[1].req_num
    server.enqueue_response(held[0], b"answer to first")  # silently dropped
    net.run_for(10**7)
    assert not second.done()
    server.enqueue_response(held[1], b"answer to second")
    assert net.run_until(second.done)
    assert second.result() == b"answer to second"
    assert isinstance(first.exception(), SessionClosed)


def test_reassembly_memory_is_bounded() -> None:
    """Requests being received may hold at most rx_reassembly_bytes_max at a server; others
    wait (their first packet is dropped and retransmitted) instead of exhausting memory."""
    settings = RpcSettings(msg_size_max=100_000, rx_reassembly_bytes_max=100_000,
                           rto_ns=500_000)
    net, server, client = sim_pair(seed=6, settings=settings)
    sessions = [client.create_session("server") for _ in range(3)]
    pendings = [client.enqueue_request(s, 1, bytes([i]) * 80_000) for i, s in enumerate(sessions)]
    assert net.run_until(lambda: all(p.done() for p in pendings))
    assert [p.result() for p in pendings] == [bytes([i]) * 80_000 for i in range(3)]
    assert server.stats()["rx_no_buffer"] > 0


def test_delayed_packet_of_an_earlier_session_is_not_taken_for_the_current_one() -> None:
    """The session number is reused (one slot) by the same client address, and a request
    packet of the earlier session arrives late: the session tag tells it apart, so the old
    request does not run twice and cannot stand in for the new session's request number 8."""
    runs: list[bytes] = []
    nexus = Nexus()

    def handler(_handle: ReqHandle, payload: bytes) -> bytes:
        runs.append(payload)
        return payload[::-1]

    nexus.register_req_func(1, handler)
    net, _server, client = sim_pair(seed=7, server_nexus=nexus,
                                    settings=RpcSettings(sessions_max=1))
    sent: list[bytes] = []
    send = net.send

    def recording_send(src: str, dst: str, datagram: bytes) -> None:
        if src == "client":
            sent.append(datagram)
        send(src, dst, datagram)

    net.send = recording_send  # type: ignore[method-assign]
    old = client.create_session("server")
    first = client.enqueue_request(old, 1, b"first")
    assert net.run_until(first.done)
    ghost = sent[-1]  # the request packet of "first"
    client.destroy_session(old)
    net.run_for(10**7)
    new = client.create_session("server")
    assert net.run_until(lambda: new.connected)
    send("client", "server", ghost)  # arrives now, long after its session ended
    net.run_for(10**6)
    second = client.enqueue_request(new, 1, b"second")
    assert net.run_until(second.done)
    assert second.result() == b"dnoces"
    assert runs == [b"first", b"second"]
