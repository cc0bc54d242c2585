"""The proxy against real sockets (issue 5 item 6; DESIGN.md §2: cross-region round trips are
tens of milliseconds). Timing assertions are lower bounds and ratios measured in the same
run, never absolute upper bounds."""

from __future__ import annotations

import hashlib
import socket
import statistics
import threading
import time

import pytest

from store.wan import BUFFER_BYTES_MAX, Address
from tests.wan.helpers import connect, proxy_to, recv_exactly, round_trip_s, server

ROUNDS = 8


def test_round_trip_takes_two_one_way_delays() -> None:
    delay_ms = 20
    with (
        server("echo") as target,
        proxy_to(target, delay_ms) as proxy,
        connect(target) as direct,
        connect(proxy.address("us-eu")) as through,
    ):
        round_trip_s(direct), round_trip_s(through)  # warm up
        direct_s = [round_trip_s(direct) for _ in range(ROUNDS)]
        proxied_s = [round_trip_s(through) for _ in range(ROUNDS)]
    assert min(proxied_s) >= 2 * delay_ms / 1000
    assert statistics.median(proxied_s) > 10 * statistics.median(direct_s)


def test_set_delay_at_run_time() -> None:
    with (
        server("echo") as target,
        proxy_to(target, 0) as proxy,
        connect(proxy.address("us-eu")) as sock,
    ):
        fast_s = min(round_trip_s(sock) for _ in range(ROUNDS))
        assert proxy.set_delay("us-eu", delay_ms=30) == ["us-eu"]
        slow_s = [round_trip_s(sock) for _ in range(3)]
    assert min(slow_s) >= 0.060
    assert min(slow_s) > 10 * fast_s


def _numbered(count: int) -> list[bytes]:
    return [b"%d\n" % i for i in range(count)]


def _stream_in_order(address: Address, count: int) -> None:
    """Send ``count`` numbered lines as separate small writes; read them back intact."""
    lines = _numbered(count)
    expected = b"".join(lines)
    with connect(address) as sock:

        def write() -> None:
            for line in lines:
                sock.sendall(line)

        writer = threading.Thread(target=write)
        writer.start()
        received = recv_exactly(sock, len(expected))
        writer.join()
    assert received == expected


def test_order_kept_under_jitter_with_many_small_writes() -> None:
    # Jitter twice the delay: without the max() rule, chunks would overtake each other.
    with server("echo") as target, proxy_to(target, 2, jitter_ms=4, seed=11) as proxy:
        streams = [
            threading.Thread(target=_stream_in_order, args=(proxy.address("us-eu"), 20_000))
            for _ in range(4)
        ]
        errors: list[BaseException] = []
        for thread in streams:
            thread.run = _catching(thread.run, errors)  # type: ignore[method-assign]
            thread.start()
        for thread in streams:
            thread.join()
    assert not errors, errors


def _catching(run, errors):  # type: ignore[no-untyped-def]
    def wrapped() -> None:
        try:
            run()
        except BaseException as error:
            errors.append(error)

    return wrapped


def _send_to_sink(address: Address, total_bytes: int, chunk: bytes, vary: bool = False) -> float:
    """Stream ``total_bytes`` as writes of ``chunk`` (numbered if ``vary``); check the sink's
    count and digest; return the seconds from connect to the answer."""
    digest = hashlib.sha256()
    started = time.perf_counter()
    with connect(address) as sock:
        for i in range(total_bytes // len(chunk)):
            data = i.to_bytes(8, "big") + chunk[8:] if vary else chunk
            digest.update(data)
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = recv_exactly(sock, 40)
    assert int.from_bytes(answer[:8], "big") == total_bytes
    assert answer[8:] == digest.digest()
    return time.perf_counter() - started


def test_throughput_not_capped_at_one_chunk_per_delay() -> None:
    delay_ms, chunk_bytes, total_bytes = 25, 64 * 1024, 20 * 1024 * 1024
    chunk = b"z" * chunk_bytes
    with server("sink") as target, proxy_to(target, delay_ms) as proxy:
        direct_s = _send_to_sink(target, total_bytes, chunk)
        proxied_s = _send_to_sink(proxy.address("us-eu"), total_bytes, chunk)
    one_chunk_per_delay_s = (total_bytes / chunk_bytes) * delay_ms / 1000
    print(f"20 MiB: direct {direct_s * 1000:.0f} ms, through 25 ms link {proxied_s * 1000:.0f} ms")
    assert proxied_s >= 2 * delay_ms / 1000  # data one way, the count back
    assert proxied_s < one_chunk_per_delay_s / 10


def test_buffer_limit_applies_backpressure_and_loses_nothing() -> None:
    """While a link holds, the proxy buffers at most its limit and the sender blocks."""
    assert BUFFER_BYTES_MAX >= 16 * 1024 * 1024
    buffer_bytes_max, total_bytes = 256 * 1024, 64 * 1024 * 1024
    results: list[float] = []
    with server("sink") as target, proxy_to(target, 1, buffer_bytes_max=buffer_bytes_max) as proxy:
        proxy.partition("us-eu", mode="hold")
        sender = threading.Thread(
            target=lambda: results.append(
                _send_to_sink(proxy.address("us-eu"), total_bytes, b"b" * (1 << 20))
            )
        )
        sender.start()
        time.sleep(0.5)
        queued = proxy.status()[0]["queued_bytes"]
        assert sender.is_alive()  # blocked: kernel buffers and the proxy's are full
        # One read may overshoot the limit before reading pauses.
        assert 0 < queued <= buffer_bytes_max + 1024 * 1024
        proxy.heal("us-eu")
        sender.join(timeout=30)
    assert results, "the sender did not finish after heal"


def test_slow_receiver_pauses_the_proxy_and_loses_nothing() -> None:
    """The target stalls; the proxy's writes back up, it stops writing, then resumes."""
    with server("stalling-sink") as target, proxy_to(target, 2) as proxy:
        _send_to_sink(proxy.address("us-eu"), 48 * 1024 * 1024, b"s" * 65536, vary=True)


def _assert_silent(sock: socket.socket, wait_s: float) -> None:
    sock.settimeout(wait_s)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(15)


def test_hold_partition_delivers_everything_in_order_after_heal() -> None:
    lines = _numbered(5000)
    expected = b"".join(lines)
    with (
        server("echo") as target,
        proxy_to(target, 5) as proxy,
        connect(proxy.address("us-eu")) as old,
    ):
        round_trip_s(old)
        assert proxy.partition("us-eu", mode="hold") == ["us-eu"]
        for line in lines:
            old.sendall(line)
        with connect(proxy.address("us-eu")) as new:  # its SYN is held too
            new.sendall(b"hello")
            _assert_silent(old, 0.2)
            _assert_silent(new, 0.01)
            assert proxy.status()[0]["partition"] == "hold"
            healed_at = time.perf_counter()
            proxy.heal("us-eu")
            assert recv_exactly(old, len(expected)) == expected
            assert recv_exactly(new, 5) == b"hello"
            assert time.perf_counter() - healed_at >= 2 * 0.005
            round_trip_s(new)


def _read_one_byte(address: Address) -> None:
    with connect(address) as sock:
        sock.sendall(b"anyone?")
        if not sock.recv(1):
            raise ConnectionResetError("closed without a reset")


def test_drop_partition_resets_and_new_connection_works_after_heal() -> None:
    with server("echo") as target, proxy_to(target, 5) as proxy:
        with connect(proxy.address("us-eu")) as old:
            round_trip_s(old)
            proxy.partition("us-eu", mode="drop")
            with pytest.raises(ConnectionError):
                old.sendall(b"lost")
                if not old.recv(1):
                    raise ConnectionResetError("closed")
        with pytest.raises(ConnectionError):  # at connect or at the first read
            _read_one_byte(proxy.address("us-eu"))
        status = proxy.status()[0]
        assert status["partition"] == "drop" and status["resets"] >= 2
        proxy.heal("us-eu")
        with connect(proxy.address("us-eu")) as after:
            assert round_trip_s(after, b"back") >= 0.010


def test_bad_commands_get_an_error_and_change_nothing() -> None:
    with server("echo") as target, proxy_to(target, 5) as proxy:
        before = proxy.status()
        for command in [
            {"op": "partition", "link": "no-such-link", "mode": "drop"},
            {"op": "partition", "link": "us-eu", "mode": "sideways"},
            {"op": "set_delay", "link": "us-eu", "delay_ms": -3},
            {"op": "set_delay", "link": "us-eu", "delay_ms": 9, "extra": 1},
            {"op": "heal"},
            ["not", "an", "object"],
        ]:
            reply = proxy.execute(command)
            assert reply["ok"] is False and reply["error"], command
        assert proxy.status() == before
        with connect(proxy.address("us-eu")) as sock:
            round_trip_s(sock)


def test_target_down_resets_the_client() -> None:
    with server("echo") as target:
        pass  # now nothing listens there
    with proxy_to(target, 1) as proxy, pytest.raises(ConnectionError):
        _read_one_byte(proxy.address("us-eu"))


def test_half_close_travels_after_the_data() -> None:
    with server("sink") as target, proxy_to(target, 3) as proxy:
        assert _send_to_sink(proxy.address("us-eu"), 1 << 20, b"q" * 4096) >= 0.006
        # The sink's FIN may still be in the delay line when its answer has arrived.
        for _ in range(200):
            if proxy.status()[0]["connections"] == 0:
                break
            time.sleep(0.01)
        assert proxy.status()[0]["connections"] == 0
