"""The asyncio endpoint: one `Rpc` per event loop, no thread hop per message.

The socket is watched with `loop.add_reader`; a readable socket is drained by recvmmsg in C,
which returns whole messages; the handlers and continuations they complete run right there,
and everything they send leaves in one sendmmsg at the end of the callback. Requests enqueued
from coroutines are flushed together by one `call_soon` per loop iteration. The core's next
deadline (retransmission, handshake retry, session timeout) is one `call_later` timer; the
timeouts of `Rpc.call` share another, in buckets (CALL_DEADLINE_BUCKET_NS).

Use uvloop where latency matters (`store.rpc.aio.new_event_loop()` prefers it): on this
project's machines it halves a loopback round trip compared with the default loop.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import time
from collections.abc import Awaitable
from typing import Any

from store.rpc.endpoint import Nexus, Payload, ReqHandle, RpcBase, Session, Transport
from store.rpc.errors import RequestTimeout, RpcError
from store.rpc.settings import RpcSettings
from store.rpc.udp import UdpTransport

_monotonic_ns = time.monotonic_ns

# A deadline this close is treated as due: the next loop iteration serves it.
TIMER_SOON_NS = 50_000
_MS = 1_000_000
# Call deadlines (``Rpc.call``'s timeout) are kept in buckets this wide: a call times out at
# the end of the bucket its deadline falls in, up to this much late and never early, and one
# timer serves every call of the earliest bucket. (A timer per call, armed and cancelled,
# was 5% of a busy client's CPU: perf, bench/micro.py, 2026-12-05.)
CALL_DEADLINE_BUCKET_NS = 10 * _MS
# Every receive also runs the core's due timers (retransmissions, "held" answers, handshake
# retries: udp_recv ticks the core), so on a busy endpoint they are served on time without
# the loop's timer, which is armed this long after the core's deadline as a back-up for a
# quiet endpoint (whose timeouts are served up to this much late). A back-up that finds
# nothing due (a receive served it) only re-arms itself. (bench/micro.py's client, with
# the adaptive retransmission timeout: 0.005 full timer wakes per transaction, against
# 0.076 armed at the deadline with a fixed 5 ms timeout; throughput the same.)
TIMER_SLACK_NS = 1 * _MS


def timer_delay_s(when_ns: int, now_ns: int) -> float:
    """The delay to give ``call_later`` for a deadline at ``when_ns``, never one that fires
    it early over and over.

    uvloop (libuv) keeps timers in whole milliseconds, rounded, against a clock read at the
    start of the loop iteration: a delay under 0.5 ms fires at once, and any timer may fire
    up to an iteration early. A callback that finds its deadline not yet due and asks again
    for the little that is left then runs on every iteration until it is (measured: a client
    of 64 concurrent transactions woke 10,800 times a second, 2.6 times per transaction, each
    time reading its socket). So a deadline within TIMER_SOON_NS is due now (0); any other
    waits whole milliseconds, at least one: it fires up to a millisecond late, and an early
    wake-up asks again for at least a millisecond."""
    remaining = when_ns - now_ns
    if remaining <= TIMER_SOON_NS:
        return 0.0
    return -(-remaining // _MS) / 1e3


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop if uvloop is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class Rpc(RpcBase):
    """An RPC endpoint owned by one asyncio event loop (eRPC's Rpc)."""

    def __init__(
        self,
        nexus: Nexus,
        transport: Transport,
        settings: RpcSettings | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        seed: int | None = None,
    ) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        super().__init__(nexus, transport, settings, seed=seed)
        self._loop = loop or asyncio.get_running_loop()
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = -1
        # How often the core's timer woke this endpoint (retransmissions, connects, session
        # timeouts, packets held by fault injection): a client with requests outstanding
        # must not turn into a busy loop.
        self.timer_wakes = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        # Rpc.call's deadlines: bucket number -> the calls whose deadline falls in it, the
        # bucket numbers in a heap, and the one timer, armed for the earliest bucket.
        self._deadlines: dict[int, list[tuple[asyncio.Future[bytes], int, Session]]] = {}
        self._deadline_buckets: list[int] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_timer_bucket = -1
        self._fd = transport.fileno()
        if self._fd is not None:
            self._loop.add_reader(self._fd, self._on_readable)
        else:
            # A transport without a descriptor (RDMA: a completion queue) is busy-polled
            # once per loop iteration, as eRPC's event loop polls its NIC queues.
            self._loop.call_soon(self._poll)

    @classmethod
    def udp(
        cls,
        nexus: Nexus,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: RpcSettings | None = None,
        **kwargs: Any,
    ) -> Rpc:
        """An endpoint on a new UDP socket bound to (host, port)."""
        chosen = settings if settings is not None else RpcSettings()
        transport = UdpTransport(
            host, port, mtu_bytes=chosen.mtu_bytes,
            rx_datagrams_per_poll=chosen.rx_datagrams_per_poll,
        )
        return cls(nexus, transport, settings, **kwargs)

    @property
    def address(self) -> Any:
        return getattr(self.transport, "address", None)

    # --- hooks -----------------------------------------------------------------------------

    def _now(self) -> int:
        return _monotonic_ns()

    def _new_waiter(self) -> asyncio.Future[bytes]:
        return self._loop.create_future()

    def _resolve(self, waiter: Any, payload: bytes) -> None:
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_result(payload)
        else:
            self._run_continuation(waiter, payload, None)

    def _reject(self, waiter: Any, error: RpcError) -> None:
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_exception(error)
        else:
            self._run_continuation(waiter, None, error)

    def _spawn(self, handle: ReqHandle, awaitable: Awaitable[Payload]) -> None:
        async def run() -> Payload:
            return await awaitable

        task = self._loop.create_task(run())
        self._tasks.add(task)

        def done(t: asyncio.Task[Payload]) -> None:
            self._tasks.discard(t)
            if self._closed:
                return
            if t.cancelled():
                self._finish_spawned(handle, None, asyncio.CancelledError())
            else:
                self._finish_spawned(handle, t.result() if t.exception() is None else None,
                                     t.exception())

        task.add_done_callback(done)

    def _request_flush(self) -> None:
        if self._in_dispatch or self._flush_scheduled or self._closed:
            return  # a dispatching callback flushes when it ends; or a flush is coming
        # Everything the coroutines of this loop iteration enqueue leaves together, in one
        # sendmmsg from the callback scheduled here. (Sending the first request at once
        # saved a lone request an iteration, microseconds, but cost a client of 64
        # concurrent transactions a system call per request: ~8% of its time.)
        self._flush_scheduled = True
        self._loop.call_soon(self._flush_soon)

    # --- loop callbacks --------------------------------------------------------------------

    def _flush_soon(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        if self._core.pending_packets():
            self.transport.flush(self._core)
        # Armed even when nothing was sent: what was enqueued may wait on a timer alone (a
        # request held for credits, or a packet the fault injection delays).
        self._arm_timer(_monotonic_ns())

    def _on_readable(self) -> None:
        now = _monotonic_ns()
        events = self.transport.receive(self._core, now)
        if events:
            self._dispatch(events, now)
        self.transport.flush(self._core)
        self._arm_timer(now)

    def _poll(self) -> None:
        if self._closed:
            return
        self._on_readable()
        self._loop.call_soon(self._poll)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = -1
        if self._closed:
            return
        now = _monotonic_ns()
        deadline = self._core.next_deadline()
        if deadline < 0 or deadline - now > TIMER_SOON_NS:
            self._arm_timer(now)  # a receive served it meanwhile (TIMER_SLACK_NS)
            return
        self.timer_wakes += 1
        # Read what has arrived before judging timeouts: after a stall of the loop (GC, a slow
        # handler), responses are already waiting in the socket and must not be mistaken for
        # losses: all of them, past rx_datagrams_per_poll. The transport's receive also runs
        # the core's due timers.
        events = self.transport.receive_all(self._core, now)
        self._core.tick(now)
        events += self._core.take_events()
        if events:
            self._dispatch(events, now)
        self.transport.flush(self._core)
        self._arm_timer(now)

    def _arm_timer(self, now: int) -> None:
        deadline = self._core.next_deadline()
        if deadline < 0 or (self._timer is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_later(
            timer_delay_s(deadline + TIMER_SLACK_NS, now), self._on_timer
        )

    # --- conveniences ----------------------------------------------------------------------

    async def connect(self, address: Any, timeout: float | None = None) -> Session:
        """Create a session and wait until it is connected (or raise its SessionError)."""
        session = self.create_session(address)
        await self.wait_connected(session, timeout)
        return session

    async def wait_connected(self, session: Session, timeout: float | None = None) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(error: RpcError | None) -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

        session.on_connect(done)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise RequestTimeout(f"connect to {session.address!r} timed out") from exc

    async def call(
        self, session: Session, req_type: int, payload: Payload, timeout: float | None = None
    ) -> bytes:
        """enqueue_request and await the response; `timeout` in seconds raises RequestTimeout
        (the request may still run at the server)."""
        fut = self.enqueue_request(session, req_type, payload)
        if timeout is not None:
            # Not asyncio.wait_for (which wraps the wait in more futures and callbacks), and
            # not a timer per call: the deadline joins its bucket (CALL_DEADLINE_BUCKET_NS).
            deadline = _monotonic_ns() + int(timeout * 1e9) + TIMER_SOON_NS
            bucket = deadline // CALL_DEADLINE_BUCKET_NS + 1
            calls = self._deadlines.get(bucket)
            if calls is None:
                calls = self._deadlines[bucket] = []
                heapq.heappush(self._deadline_buckets, bucket)
                if self._deadline_timer is None or bucket < self._deadline_timer_bucket:
                    self._arm_deadlines(bucket)
            calls.append((fut, req_type, session))
        answer: bytes = await fut
        return answer

    def _arm_deadlines(self, bucket: int) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_timer_bucket = bucket
        delay_s = timer_delay_s(bucket * CALL_DEADLINE_BUCKET_NS, _monotonic_ns())
        self._deadline_timer = self._loop.call_later(delay_s, self._on_deadlines)

    def _on_deadlines(self) -> None:
        """Times out the calls of every bucket that has ended (those still unanswered)."""
        self._deadline_timer = None
        # A bucket ending within TIMER_SOON_NS has ended (timer_delay_s); its calls' deadlines
        # are at least that far before its end.
        now_bucket = (_monotonic_ns() + TIMER_SOON_NS) // CALL_DEADLINE_BUCKET_NS
        buckets = self._deadline_buckets
        while buckets and buckets[0] <= now_bucket:
            for fut, req_type, session in self._deadlines.pop(heapq.heappop(buckets)):
                _expire(fut, req_type, session)
        if buckets and not self._closed:
            self._arm_deadlines(buckets[0])

    def close(self) -> None:
        """Stop watching the socket, fail everything outstanding, release the transport."""
        if self._closed:
            return
        for session in list(self._sessions.values()):
            self.destroy_session(session)
        self.transport.flush(self._core)
        self._closed = True
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
        if self._timer is not None:
            self._timer.cancel()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        for task in list(self._tasks):
            task.cancel()
        self._fail_all_pending(RpcError("endpoint closed"))
        self.transport.close()


def _expire(fut: asyncio.Future[bytes], req_type: int, session: Session) -> None:
    """A call's deadline: the request may still run at the server; a late answer is dropped
    (``_resolve`` finds the future done)."""
    if not fut.done():
        fut.set_exception(RequestTimeout(f"req_type {req_type} on {session!r} timed out"))
