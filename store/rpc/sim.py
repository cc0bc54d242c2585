"""The simulated datagram network: the same C core on virtual time, no asyncio, no clock.

`SimNetwork` delivers datagrams between named addresses with a latency, jitter, loss,
duplication, reordering and partitions, all drawn from one seeded `random.Random`, so a run is
a pure function of its seed. `SimRpc` is an endpoint on it, driven by explicit
`poll(now_ns)` calls. This module is self-contained so that `store/sim` can use it in either
of two ways:

1. let the network drive its endpoints: `net.run_until(predicate)` / `net.run_for(ns)` jump
   virtual time to the next delivery or core deadline and poll who is concerned; or
2. drive time itself: call `endpoint.poll(now_ns)` for each endpoint whose
   `next_wake_at()` has come (`net.next_event_at()` gives the earliest of all).

Interface summary (everything else is internal):

    net = SimNetwork(random.Random(seed), latency_ns=..., loss=..., duplicate=..., reorder=...)
    ep = SimRpc(nexus, net, "leader-1")            # attach an endpoint at an address
    s = ep.create_session("leader-2")
    p = ep.enqueue_request(s, req_type, payload)   # a Pending, or pass cont=
    net.run_until(p.done)                          # or poll(now_ns) yourself
    net.partition("a", "b"); net.heal()
    ep.crash()                                     # drop the endpoint and its queued datagrams

A handler may be a coroutine function; it runs on a tiny trampoline that resumes it when a
`Pending` it awaits completes (a nested RPC), so the same handler code works here and under
asyncio as long as it awaits only RPCs.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

from store.rpc import _native
from store.rpc.endpoint import Nexus, Payload, ReqHandle, RpcBase, Transport
from store.rpc.errors import RpcError
from store.rpc.settings import RpcSettings

SIM_MTU_BYTES = 65507
ADDRESS_BYTES_MAX = 32


class Pending:
    """The awaitable result of a request on a simulated endpoint (no event loop needed)."""

    __slots__ = ("_callbacks", "_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = False
        self._result: bytes | None = None
        self._error: RpcError | None = None
        self._callbacks: list[Callable[[Pending], None]] = []

    def done(self) -> bool:
        return self._done

    def result(self) -> bytes:
        if not self._done:
            raise RuntimeError("request still pending")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def exception(self) -> RpcError | None:
        return self._error

    def add_done_callback(self, callback: Callable[[Pending], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _set(self, result: bytes | None, error: RpcError | None) -> None:
        assert not self._done, "a request completes exactly once"
        self._done = True
        self._result = result
        self._error = error
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def __await__(self) -> Generator[Pending, None, bytes]:
        if not self._done:
            yield self
        return self.result()


class DatagramNetwork(Protocol):
    """What a simulated endpoint needs of its network: ``SimNetwork`` here, or the cluster
    simulator's network (``store.sim.network.Network``), which also carries other traffic."""

    rng: random.Random
    now_ns: int
    mtu_bytes: int

    def attach(self, address: str, endpoint: SimRpc) -> None: ...

    def detach(self, address: str) -> None: ...

    def send(self, src: str, dst: str, datagram: bytes) -> None: ...

    def take_due(self, address: str, now_ns: int) -> list[tuple[str, bytes]]: ...


class SimNetwork:
    """In-memory datagram network with virtual time and seeded faults."""

    def __init__(
        self,
        rng: random.Random,
        *,
        latency_ns: int = 5_000,
        jitter_ns: int = 1_000,
        loss: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        reorder_delay_ns: int = 50_000,
        mtu_bytes: int = SIM_MTU_BYTES,
    ) -> None:
        self.rng = rng
        self.now_ns = 0
        self.latency_ns = latency_ns
        self.jitter_ns = jitter_ns
        self.loss = loss
        self.duplicate = duplicate
        self.reorder = reorder
        self.reorder_delay_ns = reorder_delay_ns
        self.mtu_bytes = mtu_bytes
        self._queues: dict[str, list[tuple[int, int, str, bytes]]] = {}
        self._endpoints: dict[str, SimRpc] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._link_last_at: dict[tuple[str, str], int] = {}
        self._seq = 0
        self.delivered = 0
        self.dropped = 0

    # --- topology ------------------------------------------------------------------------------

    def attach(self, address: str, endpoint: SimRpc) -> None:
        if address in self._endpoints:
            raise ValueError(f"address {address!r} is in use")
        self._endpoints[address] = endpoint
        self._queues.setdefault(address, [])

    def detach(self, address: str) -> None:
        """Forget the endpoint at `address` and every datagram queued for it (a crash)."""
        self._endpoints.pop(address, None)
        self._queues.pop(address, None)

    def partition(self, a: str, b: str) -> None:
        """Drop datagrams between a and b, both ways, until heal()."""
        self._blocked.add((a, b))
        self._blocked.add((b, a))

    def heal(self) -> None:
        self._blocked.clear()

    # --- datagrams -----------------------------------------------------------------------------

    def send(self, src: str, dst: str, datagram: bytes) -> None:
        if len(datagram) > self.mtu_bytes or (src, dst) in self._blocked:
            self.dropped += 1
            return
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            self.dropped += 1
            return
        copies = 2 if self.duplicate and rng.random() < self.duplicate else 1
        queue = self._queues.get(dst)
        if queue is None:
            self.dropped += 1  # nobody there
            return
        link = (src, dst)
        for _ in range(copies):
            at = self.now_ns + self.latency_ns
            if self.jitter_ns:
                at += rng.randrange(self.jitter_ns + 1)
            # Jitter alone keeps a link first-in first-out, like a real path; only the
            # reorder fault lets a datagram overtake another.
            at = max(at, self._link_last_at.get(link, 0))
            self._link_last_at[link] = at
            if self.reorder and rng.random() < self.reorder:
                at += rng.randrange(1, self.reorder_delay_ns + 1)
            self._seq += 1
            heapq.heappush(queue, (at, self._seq, src, datagram))

    def take_due(self, address: str, now_ns: int) -> list[tuple[str, bytes]]:
        """Datagrams for `address` whose delivery time has come, in delivery order."""
        queue = self._queues.get(address)
        out: list[tuple[str, bytes]] = []
        while queue and queue[0][0] <= now_ns:
            _, _, src, data = heapq.heappop(queue)
            out.append((src, data))
        self.delivered += len(out)
        return out

    def next_delivery_at(self, address: str) -> int | None:
        queue = self._queues.get(address)
        return queue[0][0] if queue else None

    # --- driver --------------------------------------------------------------------------------

    def next_event_at(self) -> int | None:
        """Earliest time at which some endpoint has a delivery or a timer due."""
        best: int | None = None
        for address, endpoint in self._endpoints.items():
            for at in (self.next_delivery_at(address), endpoint.next_wake_at()):
                if at is not None and (best is None or at < best):
                    best = at
        return best

    def step(self, until_ns: int | None = None) -> bool:
        """Advance to the next event (not past until_ns) and poll the endpoints it concerns.
        Returns False if nothing is scheduled (or the next event is after until_ns)."""
        at = self.next_event_at()
        if at is None or (until_ns is not None and at > until_ns):
            if until_ns is not None:
                self.now_ns = max(self.now_ns, until_ns)
            return False
        self.now_ns = max(self.now_ns, at)
        for address, endpoint in list(self._endpoints.items()):
            delivery = self.next_delivery_at(address)
            wake = endpoint.next_wake_at()
            if (delivery is not None and delivery <= self.now_ns) or (
                wake is not None and wake <= self.now_ns
            ):
                endpoint.poll(self.now_ns)
        return True

    def run_until(self, predicate: Callable[[], bool], *, steps_max: int = 10_000_000,
                  until_ns: int | None = None) -> bool:
        """Step until predicate() holds; False if time ran out or nothing is left to do."""
        for _ in range(steps_max):
            if predicate():
                return True
            if not self.step(until_ns):
                return predicate()
        raise AssertionError(f"simulation did not settle in {steps_max} steps")

    def run_for(self, duration_ns: int, *, steps_max: int = 10_000_000) -> None:
        end = self.now_ns + duration_ns
        for _ in range(steps_max):
            if not self.step(end):
                return
        raise AssertionError(f"simulation did not settle in {steps_max} steps")


class SimTransport(Transport):
    """The endpoint side of SimNetwork: addresses are names (UTF-8, at most 32 bytes)."""

    def __init__(self, network: DatagramNetwork, address: str) -> None:
        raw = address.encode()
        if not 1 <= len(raw) <= ADDRESS_BYTES_MAX:
            raise ValueError(f"address must be 1..{ADDRESS_BYTES_MAX} bytes of UTF-8")
        self.network = network
        self.address = address
        self.mtu_bytes = network.mtu_bytes

    def encode_address(self, address: Any) -> bytes:
        raw = str(address).encode()
        if not 1 <= len(raw) <= ADDRESS_BYTES_MAX:
            raise ValueError(f"address must be 1..{ADDRESS_BYTES_MAX} bytes of UTF-8")
        return raw

    def decode_address(self, raw: bytes) -> str:
        return raw.decode("utf-8", "replace")

    def receive(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        feed = core.feed
        for src, data in self.network.take_due(self.address, now_ns):
            feed(src.encode(), data, now_ns)
        events: list[tuple[Any, ...]] = core.take_events()
        return events

    def flush(self, core: _native.Core) -> None:
        if not core.pending_packets():
            return
        send = self.network.send
        for raw, data in core.take_packets():
            send(self.address, raw.decode("utf-8", "replace"), data)


class SimRpc(RpcBase):
    """An endpoint on a SimNetwork, driven by poll(now_ns)."""

    def __init__(
        self,
        nexus: Nexus,
        network: DatagramNetwork,
        address: str,
        settings: RpcSettings | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        transport = SimTransport(network, address)
        if settings is None:
            settings = RpcSettings()
        if seed is None:
            seed = network.rng.getrandbits(64)
        super().__init__(nexus, transport, settings, seed=seed)
        self.network = network
        self.address = address
        network.attach(address, self)

    def _now(self) -> int:
        return self.network.now_ns

    def _new_waiter(self) -> Pending:
        return Pending()

    def _resolve(self, waiter: Any, payload: bytes) -> None:
        if isinstance(waiter, Pending):
            waiter._set(payload, None)
        else:
            self._run_continuation(waiter, payload, None)

    def _reject(self, waiter: Any, error: RpcError) -> None:
        if isinstance(waiter, Pending):
            waiter._set(None, error)
        else:
            self._run_continuation(waiter, None, error)

    def _request_flush(self) -> None:
        if not self._in_dispatch and not self._closed:
            self.transport.flush(self._core)

    def _spawn(self, handle: ReqHandle, awaitable: Awaitable[Payload]) -> None:
        coro = awaitable.__await__()

        def step(value: Any = None, error: BaseException | None = None) -> None:
            try:
                yielded = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as stop:
                self._finish_spawned(handle, stop.value, None)
                return
            except Exception as exc:
                self._finish_spawned(handle, None, exc)
                return
            if not isinstance(yielded, Pending):
                self._finish_spawned(
                    handle, None, TypeError(f"simulated handlers may await only RPCs, got {yielded!r}")
                )
                return

            def resume(p: Pending) -> None:
                if self._closed:
                    return
                error = p.exception()
                step(None if error is not None else p.result(), error)
                self._request_flush()

            yielded.add_done_callback(resume)

        step()

    def poll(self, now_ns: int) -> None:
        """Receive what is due, run timers, dispatch, send: one event-loop round at now_ns."""
        if self._closed:
            return
        self.network.now_ns = max(self.network.now_ns, now_ns)
        self.run_event_loop_once(now_ns)

    def next_wake_at(self) -> int | None:
        return self.next_deadline_ns()

    def crash(self) -> None:
        """Vanish without a word (process crash): nothing is sent, nothing completes."""
        self._closed = True
        self._pending.clear()
        self.network.detach(self.address)

    def close(self) -> None:
        """Disconnect sessions politely, then leave the network."""
        if self._closed:
            return
        for session in list(self._sessions.values()):
            self.destroy_session(session)
        self._closed = True
        self._fail_all_pending(RpcError("endpoint closed"))
        self.network.detach(self.address)
