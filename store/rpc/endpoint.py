"""The transport-independent half of an RPC endpoint: handlers, sessions, continuations.

Shaped like eRPC's API (Kalia et al., NSDI '19; DESIGN.md section 6):

- a `Nexus` holds the request handlers, by request type (0..255);
- an endpoint (`Rpc` for asyncio, `SimRpc` for the simulator) owns one protocol core and one
  transport, and is driven by one event loop;
- `create_session(address)` starts the connect handshake; requests may be enqueued at once
  and are sent when it completes;
- `enqueue_request(session, req_type, payload, cont)` queues a request; the continuation
  `cont(payload, error)` runs exactly once, from the event loop, with the response bytes or a
  typed `RpcError`;
- a handler is called as `handler(handle, payload)` and either returns the response bytes, or
  returns None and later calls `enqueue_response(handle, payload)`; a coroutine function
  handler's result is the response;
- `run_event_loop_once(now_ns)` does one round of receive, timers, dispatch and send.

Everything per packet happens in C (native/); this module only sees whole messages. It imports
no asyncio, so the simulator can drive it on virtual time.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from store.rpc import _native
from store.rpc.errors import (
    ERR_STALE,
    STATUS_HANDLER_FAILED,
    STATUS_OK,
    STATUS_UNKNOWN_REQ_TYPE,
    MessageTooLarge,
    RpcError,
    SessionClosed,
    error_for_code,
    error_for_status,
)
from store.rpc.settings import RpcSettings

log = logging.getLogger("store.rpc")

# Event kinds produced by the core (MR_EV_* in native/mr_core.h).
EV_REQUEST = 0
EV_RESPONSE = 1
EV_FAILED = 2
EV_SESSION = 3

REQ_TYPE_MAX = 255
Payload = bytes | bytearray | memoryview
Continuation = Callable[[bytes | None, RpcError | None], None]
HandlerResult = Payload | None | Awaitable[Payload]
Handler = Callable[["ReqHandle", bytes], HandlerResult]


class Nexus:
    """Request handlers by request type, shared by the endpoints of one process (eRPC's Nexus)."""

    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}

    def register_req_func(self, req_type: int, handler: Handler) -> None:
        if not 0 <= req_type <= REQ_TYPE_MAX:
            raise ValueError(f"req_type must be in [0, {REQ_TYPE_MAX}], got {req_type}")
        if req_type in self._handlers:
            raise ValueError(f"a handler for req_type {req_type} is already registered")
        self._handlers[req_type] = handler

    def handler(self, req_type: int) -> Handler | None:
        return self._handlers.get(req_type)


class ReqHandle:
    """A request being served. Answer it once, now (return bytes) or later (respond)."""

    __slots__ = ("_endpoint", "generation", "req_num", "req_type", "responded", "session")

    def __init__(
        self, endpoint: RpcBase, session: int, generation: int, req_num: int, req_type: int
    ) -> None:
        self._endpoint = endpoint
        self.session = session
        self.generation = generation
        self.req_num = req_num
        self.req_type = req_type
        self.responded = False

    def respond(self, payload: Payload) -> None:
        self._endpoint.enqueue_response(self, payload)

    def __repr__(self) -> str:
        return f"ReqHandle(session={self.session}, req_num={self.req_num}, req_type={self.req_type})"


class Session:
    """A client session to one server endpoint. Its failure is final: make a new one."""

    __slots__ = ("_endpoint", "_on_connect", "address", "error", "num", "state")

    def __init__(self, endpoint: RpcBase, num: int, address: Any) -> None:
        self._endpoint = endpoint
        self.num = num
        self.address = address
        self.state = "connecting"  # -> connected -> failed | closed
        self.error: RpcError | None = None
        self._on_connect: list[Callable[[RpcError | None], None]] = []

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def on_connect(self, callback: Callable[[RpcError | None], None]) -> None:
        """Run callback(None) once connected, or callback(error) if the session fails."""
        if self.state == "connected":
            callback(None)
        elif self.state in ("failed", "closed"):
            callback(self.error)
        else:
            self._on_connect.append(callback)

    def info(self) -> dict[str, Any]:
        """The core's view: state, credits, in_flight_max, busy slots, backlog, and (a
        client's) the round-trip estimate and retransmission timeout (srtt_ns, rto_ns)."""
        if self.state in ("failed", "closed"):
            return {"state": self.state}
        info: dict[str, Any] = self._endpoint._core.session_info(self.num)
        return info

    def __repr__(self) -> str:
        return f"Session(num={self.num}, address={self.address!r}, state={self.state})"


class Transport(abc.ABC):
    """What an endpoint needs from a datagram network. UDP, RDMA UD and the simulator's network
    implement it; the protocol core is the same for all three.

    Addresses are whatever the transport's users find natural ((host, port) for UDP, a name in
    the simulator); `encode_address` turns one into the opaque bytes (at most 32) the core
    compares and hands back with each packet to send.
    """

    mtu_bytes: int

    @abc.abstractmethod
    def encode_address(self, address: Any) -> bytes: ...

    @abc.abstractmethod
    def decode_address(self, raw: bytes) -> Any: ...

    @abc.abstractmethod
    def receive(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        """Feed datagrams that have arrived into the core (all of them, or a UDP endpoint's
        rx_datagrams_per_poll: the rest wait for the next call) and run its due timers
        (not when datagrams may be left unread); return the core's events."""

    def receive_all(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        """``receive``, reading everything that has arrived: before timeouts are judged."""
        return self.receive(core, now_ns)

    @abc.abstractmethod
    def flush(self, core: _native.Core) -> None:
        """Send every datagram the core has queued."""

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when datagrams arrive, if there is one."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the transport's resources."""


class RpcBase:
    """One endpoint: a protocol core, a transport and the Python side of dispatch.

    Subclasses say where time comes from (`_now`), how a request without continuation is
    awaited (`_new_waiter`, `_resolve`, `_reject`), how awaitable handler results are run
    (`_spawn`) and when queued packets are sent (`_request_flush`).
    """

    def __init__(
        self,
        nexus: Nexus,
        transport: Transport,
        settings: RpcSettings | None = None,
        *,
        seed: int,
    ) -> None:
        self.nexus = nexus
        self.transport = transport
        self.settings = settings or RpcSettings(mtu_bytes=transport.mtu_bytes)
        if self.settings.mtu_bytes > transport.mtu_bytes:
            raise ValueError(
                f"mtu_bytes {self.settings.mtu_bytes} exceeds the transport's {transport.mtu_bytes}"
            )
        self._core = _native.Core(**self.settings.core_kwargs(), seed=seed & (2**64 - 1))
        self._pending: dict[int, Any] = {}
        self._sessions: dict[int, Session] = {}
        self._next_tag = 1
        self._in_dispatch = False
        self._closed = False
        # Called once after each batch of received events has been handled (not per event):
        # a host hands a whole batch to its replica and carries out what it produced once.
        self.after_dispatch: list[Callable[[], None]] = []

    @property
    def dispatching(self) -> bool:
        """True inside the handling of received events (``after_dispatch`` follows)."""
        return self._in_dispatch

    # --- hooks -----------------------------------------------------------------------------

    def _now(self) -> int:
        raise NotImplementedError

    def _new_waiter(self) -> Any:
        raise NotImplementedError

    def _resolve(self, waiter: Any, payload: bytes) -> None:
        self._run_continuation(waiter, payload, None)

    def _reject(self, waiter: Any, error: RpcError) -> None:
        self._run_continuation(waiter, None, error)

    def _run_continuation(
        self, cont: Continuation, payload: bytes | None, error: RpcError | None
    ) -> None:
        # A failing continuation must not lose the other events of the batch being
        # dispatched (their requests would never complete): log it and carry on.
        try:
            cont(payload, error)
        except Exception:
            log.exception("continuation %r raised", cont)

    def _spawn(self, handle: ReqHandle, awaitable: Awaitable[Payload]) -> None:
        raise TypeError("this endpoint cannot run awaitable handlers")

    def _request_flush(self) -> None:
        raise NotImplementedError

    # --- sessions --------------------------------------------------------------------------

    def create_session(self, address: Any) -> Session:
        """Start connecting to the endpoint at `address`. Requests may be enqueued at once."""
        self._check_open()
        raw = self.transport.encode_address(address)
        num = self._core.create_session(raw, self._now())
        if num < 0:
            raise error_for_code(-num, "cannot create a session")
        session = Session(self, num, address)
        self._sessions[num] = session
        self._request_flush()
        return session

    def destroy_session(self, session: Session) -> None:
        """Close the session: its outstanding requests fail with SessionClosed."""
        if session.state in ("failed", "closed"):
            return
        self._core.destroy_session(session.num, self._now())
        session.state = "closed"
        session.error = SessionClosed("session closed")
        self._sessions.pop(session.num, None)
        self._drain_events(self._now())
        self._notify_connect(session, session.error)
        self._request_flush()

    # --- requests --------------------------------------------------------------------------

    def enqueue_request(
        self,
        session: Session,
        req_type: int,
        payload: Payload,
        cont: Continuation | None = None,
    ) -> Any:
        """Queue a request. With `cont`, it is called as cont(response, error) and None is
        returned; without, an awaitable for the response bytes is returned. Raises
        MessageTooLarge, BacklogFull or the session's SessionError at once if it cannot queue."""
        if session.error is not None:
            raise session.error
        tag = self._next_tag
        self._next_tag = tag + 1
        r = self._core.enqueue_request(session.num, req_type, payload, tag, self._now())
        if r:
            raise error_for_code(-r, f"session {session.num}")
        waiter = cont if cont is not None else self._new_waiter()
        self._pending[tag] = waiter
        self._request_flush()
        return None if cont is not None else waiter

    def enqueue_response(self, handle: ReqHandle, payload: Payload) -> None:
        """Answer a request whose handler returned None. A response for a session the client
        has since dropped is discarded silently: nobody is waiting for it."""
        self._respond(handle, STATUS_OK, payload)

    def _respond(self, handle: ReqHandle, status: int, payload: Payload) -> None:
        if handle.responded:
            raise RuntimeError(f"{handle!r} already answered")
        handle.responded = True
        r = self._core.respond(
            handle.session, handle.generation, handle.req_num, status, payload, self._now()
        )
        if r == -ERR_STALE:
            return
        if r:
            err = error_for_code(-r, "response")
            if isinstance(err, MessageTooLarge):
                handle.responded = False
            raise err
        self._request_flush()

    # --- dispatch --------------------------------------------------------------------------

    def _dispatch(self, events: list[tuple[Any, ...]], now: int) -> None:
        outer = self._in_dispatch  # dispatch may nest (a continuation destroys a session)
        self._in_dispatch = True
        try:
            pending = self._pending
            for ev in events:
                kind = ev[0]
                if kind == EV_RESPONSE:
                    waiter = pending.pop(ev[1], None)
                    if waiter is None:
                        continue
                    if ev[2] == STATUS_OK:
                        self._resolve(waiter, ev[3])
                    else:
                        self._reject(waiter, error_for_status(ev[2], ev[3]))
                elif kind == EV_REQUEST:
                    self._handle_request(ev[1], ev[5], ev[2], ev[3], ev[4])
                elif kind == EV_FAILED:
                    waiter = pending.pop(ev[1], None)
                    if waiter is not None:
                        self._reject(waiter, error_for_code(ev[2]))
                else:
                    self._session_event(ev[1], ev[2], now)
        finally:
            self._in_dispatch = outer
        if not outer:
            for hook in self.after_dispatch:
                hook()

    def _handle_request(
        self, session: int, generation: int, req_num: int, req_type: int, payload: bytes
    ) -> None:
        handle = ReqHandle(self, session, generation, req_num, req_type)
        handler = self.nexus.handler(req_type)
        if handler is None:
            self._respond(handle, STATUS_UNKNOWN_REQ_TYPE, b"no handler for req_type %d" % req_type)
            return
        try:
            result = handler(handle, payload)
        except Exception as exc:
            # A handler bug must not take the server down; the client gets HandlerFailed.
            log.exception("handler for req_type %d raised", req_type)
            if not handle.responded:
                self._respond(handle, STATUS_HANDLER_FAILED, repr(exc).encode()[:1024])
            return
        if result is None:
            return
        if isinstance(result, bytes | bytearray | memoryview):
            self._respond_result(handle, result)
        else:
            self._spawn(handle, result)

    def _respond_result(self, handle: ReqHandle, result: Payload) -> None:
        try:
            self._respond(handle, STATUS_OK, result)
        except MessageTooLarge as exc:
            self._respond(handle, STATUS_HANDLER_FAILED, repr(exc).encode())

    def _finish_spawned(self, handle: ReqHandle, result: Any, exc: BaseException | None) -> None:
        """Answer a request whose handler was awaitable, once it has finished."""
        if handle.responded:
            return
        if exc is not None:
            log.error("handler for req_type %d raised", handle.req_type, exc_info=exc)
            self._respond(handle, STATUS_HANDLER_FAILED, repr(exc).encode()[:1024])
        elif isinstance(result, bytes | bytearray | memoryview):
            self._respond_result(handle, result)
        else:
            self._respond(
                handle, STATUS_HANDLER_FAILED, b"handler returned %s" % type(result).__name__.encode()
            )

    def _session_event(self, num: int, code: int, now: int) -> None:
        session = self._sessions.get(num)
        if session is None:
            return
        if code == 0:
            session.state = "connected"
            self._notify_connect(session, None)
            return
        session.state = "failed"
        session.error = error_for_code(code, f"session to {session.address!r}")
        self._sessions.pop(num, None)
        # The core keeps a failed session's number until told to let it go.
        self._core.destroy_session(num, now)
        self._notify_connect(session, session.error)

    def _notify_connect(self, session: Session, error: RpcError | None) -> None:
        callbacks, session._on_connect = session._on_connect, []
        for callback in callbacks:
            try:
                callback(error)
            except Exception:
                log.exception("session callback %r raised", callback)

    def _drain_events(self, now: int) -> None:
        events = self._core.take_events()
        if events:
            self._dispatch(events, now)

    # --- driving ---------------------------------------------------------------------------

    def run_event_loop_once(self, now_ns: int | None = None) -> None:
        """One round: receive what arrived, run due timers, dispatch, send."""
        self._check_open()
        now = self._now() if now_ns is None else now_ns
        events = self.transport.receive_all(self._core, now)
        self._core.tick(now)
        events += self._core.take_events()
        if events:
            self._dispatch(events, now)
        self.transport.flush(self._core)

    def next_deadline_ns(self) -> int | None:
        """When the core next needs `run_event_loop_once` even if nothing arrives."""
        d: int = self._core.next_deadline()
        return None if d < 0 else d

    def set_fault(
        self,
        peer: Any = None,
        *,
        drop: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        delay_ns: int = 0,
        reorder_delay_ns: int = 0,
        partitioned: bool = False,
    ) -> None:
        """Inject faults into what this endpoint sends to `peer` (None: to everyone without a
        rule of its own); a partition also drops what it receives from `peer`. Applied in the
        C core, so every transport gets them. Probabilities are per packet, in [0, 1]."""
        raw = None if peer is None else self.transport.encode_address(peer)
        self._core.set_fault(
            raw,
            drop=drop,
            duplicate=duplicate,
            reorder=reorder,
            delay_ns=delay_ns,
            reorder_delay_ns=reorder_delay_ns,
            partitioned=partitioned,
        )

    def clear_faults(self) -> None:
        self._core.clear_faults()

    def set_secret(self, secret: bytes) -> None:
        """The cluster secret (16 to 64 bytes; b"": none): sessions are made only with
        endpoints that have it (``mr_core_set_secret``; docs/rpc.md "Authentication")."""
        self._core.set_secret(secret)

    def stats(self) -> dict[str, int]:
        """Counters of the core: packets, drops by reason, retransmissions, ..."""
        counters: dict[str, int] = self._core.stats()
        return counters

    @property
    def incarnation(self) -> int:
        """Random per-endpoint number; a restarted peer has a different one."""
        value: int = self._core.incarnation
        return value

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("endpoint closed")

    def _fail_all_pending(self, error: RpcError) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            self._reject(waiter, error)
