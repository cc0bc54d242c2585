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

This module is compiled with the RPC core's Python side (setup.py): the cluster simulator
runs the endpoint production runs. `SimNetwork` lives in `store/rpc/simnet.py`, which stays
interpreted so that tests can wrap its methods to lose, delay or watch datagrams.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

from store.rpc import _native
from store.rpc.endpoint import Nexus, Payload, ReqHandle, RpcBase, Transport
from store.rpc.errors import RpcError
from store.rpc.settings import RpcSettings
from store.rpc.simnet import SIM_MTU_BYTES, SimNetwork

__all__ = ["SIM_MTU_BYTES", "DatagramNetwork", "Pending", "SimNetwork", "SimRpc", "SimTransport"]

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
        wake: Callable[[str], None] | None = None,
    ) -> None:
        """``wake``: called with this endpoint's address whenever it sends outside a
        dispatch, for a network that schedules each endpoint's next timer itself (the
        cluster simulator's)."""
        transport = SimTransport(network, address)
        if settings is None:
            settings = RpcSettings()
        if seed is None:
            seed = network.rng.getrandbits(64)
        super().__init__(nexus, transport, settings, seed=seed)
        self.network = network
        self.address = address
        self._wake = wake
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
            if self._wake is not None:
                self._wake(self.address)

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
