"""A shard-leader server process: the pure ``ShardLeader`` adapted to the RPC core.

This module adds no protocol logic (DESIGN.md §7). It decodes what arrives, hands it to the
replica with the current monotonic time, and carries out the replica's ``Ready``:

* an ``Outcome`` for a client answers the RPC requests waiting for that (client, seq);
* a message to another leader is sent as a ``PEER`` request on that leader's session, and
  the reply that comes back as the RPC response is handed to the replica;
* a reply to a ``PEER`` request this server received is that request's RPC response;
* the wake-up time becomes one event-loop timer.

Bad input never reaches the replica: the codec validates every field, and a request that
fails to decode is answered with a typed error (``INVALID``) or ignored (peer traffic).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
import time
from typing import Any

import msgpack

from store import wire
from store.config import ClusterConfig, ReplicaNode
from store.core import codec
from store.core.errors import InvalidRequest, Status
from store.core.follower import ShardFollower, SnapshotRead
from store.core.messages import Message, Outcome, Submit
from store.core.paxos import DEFAULT_STREAM_SETTINGS, PaxosMessage
from store.core.replica import ShardLeader
from store.core.txn import Procedures
from store.core.vclock import EMPTY
from store.node.replication import ReplicationTransport
from store.rpc import Nexus, ReqHandle, RpcError, Session
from store.rpc.aio import Rpc, new_event_loop

log = logging.getLogger("meridian.server")

CLIENT_PREFIX = "c\x00"
PEER_REPLY_PREFIX = "p\x00"


def load_procedures(config: ClusterConfig) -> Procedures:
    """Imports every ``module:function`` of the cluster file and lets it register."""
    for path in config.python_path:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    procedures = Procedures()
    for spec in config.procedures:
        module_name, function_name = spec.split(":")
        register = getattr(importlib.import_module(module_name), function_name)
        register(procedures)
    return procedures


class ShardServer:
    """One server process: a shard's leader, or one of its followers (``node.role``)."""

    def __init__(
        self,
        config: ClusterConfig,
        shard: int,
        loop: asyncio.AbstractEventLoop,
        node: ReplicaNode | None = None,
    ) -> None:
        self.config = config
        self.shard = shard
        self.loop = loop
        self.node = node or config.node("leader", shard)
        self.procedures = load_procedures(config)
        stream_settings = DEFAULT_STREAM_SETTINGS.with_overrides(**config.stream)
        self.replica: ShardLeader | ShardFollower
        if self.node.role == "leader":
            self.replica = ShardLeader(
                shard,
                config.leader_addresses(),
                config.partitioner(),
                self.procedures,
                config.settings,
                now_ns=time.monotonic_ns(),
                followers=[f"{host}:{port}" for _, (host, port) in config.shards[shard].followers],
                stream_settings=stream_settings,
            )
        else:
            self.replica = ShardFollower(
                shard, self.node.address, stream_settings, now_ns=time.monotonic_ns()
            )
        nexus = Nexus()
        nexus.register_req_func(wire.SUBMIT, self._on_submit)
        nexus.register_req_func(wire.PEER, self._on_peer)
        nexus.register_req_func(wire.STATUS, self._on_status)
        nexus.register_req_func(wire.SNAPSHOT, self._on_snapshot)
        host, port = self.node.rpc
        self.rpc = Rpc.udp(nexus, host, port, settings=config.rpc, loop=loop)
        routes = config.replication_routes(self.node)
        self.transport: ReplicationTransport | None = None
        if routes:
            self.transport = ReplicationTransport(
                self.node.address,
                config.replication_listen(self.node),
                routes,
                self._on_paxos,
                loop=loop,
            )
        self._peer_sessions: dict[str, Session] = {}
        self._client_waiters: dict[tuple[str, int], list[tuple[ReqHandle, bool]]] = {}
        self._peer_replies: dict[str, ReqHandle] = {}
        self._next_token = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self.started_at = time.time()
        self.counters: dict[str, Any] = {
            "submits": 0, "peer_messages": 0, "bad_requests": 0, "errors": 0,
        }
        self.transport_routes = set(routes)
        self._flush()

    # ---- request handlers ----------------------------------------------------------------

    async def start(self) -> None:
        if self.transport is not None:
            await self.transport.start()

    def _on_paxos(self, src: str, message: PaxosMessage) -> None:
        self._handle(src, message)

    def _on_snapshot(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        try:
            message = codec.decode(payload)
            if not isinstance(message, SnapshotRead):
                raise InvalidRequest("a SNAPSHOT request carries a SnapshotRead")
            if not isinstance(self.replica, ShardFollower):
                raise InvalidRequest("snapshot reads are served by followers")
        except InvalidRequest:
            self.counters["bad_requests"] += 1
            return b""
        return self._answer_synchronously(handle, message)

    def _answer_synchronously(self, handle: ReqHandle, message: Message) -> bytes | None:
        self._next_token += 1
        token = f"{PEER_REPLY_PREFIX}{self._next_token}"
        self._peer_replies[token] = handle
        self._handle(token, message)
        # A request the replica answers does so synchronously; anything else (gossip) gets
        # an empty response so the sender's slot is freed.
        if self._peer_replies.pop(token, None) is not None:
            return b""
        return None

    def _on_submit(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        self.counters["submits"] += 1
        if not isinstance(self.replica, ShardLeader):
            return codec.encode(Outcome(0, Status.INVALID, None, EMPTY, "not a shard leader"))
        try:
            if len(payload) > self.config.settings.request_bytes_max:
                raise InvalidRequest(
                    f"request larger than {self.config.settings.request_bytes_max} bytes"
                )
            message = codec.decode(payload)
            if not isinstance(message, Submit):
                raise InvalidRequest("a SUBMIT request carries a Submit message")
        except InvalidRequest as exc:
            self.counters["bad_requests"] += 1
            return codec.encode(Outcome(0, Status.INVALID, None, EMPTY, str(exc)))
        key = (message.client_id, message.seq)
        self._client_waiters.setdefault(key, []).append((handle, message.want_certified))
        self._handle(CLIENT_PREFIX + message.client_id, message)
        return None

    def _on_peer(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        self.counters["peer_messages"] += 1
        try:
            message = codec.decode(payload)
        except InvalidRequest:
            self.counters["bad_requests"] += 1
            return b""
        if isinstance(message, Outcome | Submit) or not isinstance(self.replica, ShardLeader):
            self.counters["bad_requests"] += 1
            return b""
        return self._answer_synchronously(handle, message)

    def _on_status(self, handle: ReqHandle, payload: bytes) -> bytes:
        replica = self.replica
        if isinstance(replica, ShardFollower):
            follower_status = {
                "shard": self.shard,
                "address": replica.address,
                "region": self.node.region,
                "role": "follower",
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started_at, 3),
                "watermark": replica.vw[self.shard],
                "vector_watermark": {str(k): v for k, v in sorted(replica.vw.items())},
                "keys": replica.store.key_count(),
                "applied_slots": replica.applied_slots,
                "counters": {
                    "applied_records": replica.applied_records,
                    **self.counters,
                    **(self.transport.stats() if self.transport else {}),
                },
            }
            return bytes(msgpack.packb(follower_status))
        coordinator = replica.coordinator
        status = {
            "shard": self.shard,
            "address": replica.address,
            "region": self.config.shards[self.shard].region,
            "role": "leader",
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "watermark": replica.durable_watermark(),
            "vector_watermark": {str(k): v for k, v in sorted(replica.vw.entries.items())},
            "keys": replica.store.key_count(),
            "locks_held": replica.store.locked_count(),
            "in_flight": coordinator.in_flight(),
            "counters": {
                **coordinator.counters,
                **self.counters,
                **(self.transport.stats() if self.transport else {}),
            },
            "procedures": self.procedures.names(),
        }
        packed: bytes = msgpack.packb(status)
        return packed

    # ---- the replica ---------------------------------------------------------------------

    def _handle(self, src: str, message: Message) -> None:
        try:
            self.replica.handle(time.monotonic_ns(), src, message)
        except Exception:
            self.counters["errors"] += 1
            log.exception("replica failed on a message", extra={"fields": {"type": type(message).__name__}})
        self._flush()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        try:
            self.replica.tick(time.monotonic_ns())
        except Exception:
            self.counters["errors"] += 1
            log.exception("replica failed on a timer")
        self._flush()

    def _flush(self) -> None:
        ready = self.replica.ready()
        for dst, message in ready.messages:
            if dst.startswith(CLIENT_PREFIX):
                assert isinstance(message, Outcome)
                self._answer_client(dst[len(CLIENT_PREFIX) :], message)
            elif dst.startswith(PEER_REPLY_PREFIX):
                handle = self._peer_replies.pop(dst, None)
                if handle is not None:
                    self.rpc.enqueue_response(handle, codec.encode(message))
            elif isinstance(message, PaxosMessage):
                if self.transport is not None and dst in self.transport_routes:
                    self.transport.send(dst, message)
            else:
                self._send_peer(dst, message)
        wake_at = ready.wake_at
        if wake_at is not None and (self._timer_at is None or wake_at < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = wake_at
            delay = max(0.0, (wake_at - time.monotonic_ns()) / 1e9)
            self._timer = self.loop.call_later(delay, self._on_timer)

    def _answer_client(self, client_id: str, outcome: Outcome) -> None:
        key = (client_id, outcome.seq)
        waiters = self._client_waiters.get(key)
        if not waiters:
            return
        payload = codec.encode(outcome)
        if outcome.status == Status.CERTIFIED:
            remaining = []
            for handle, want_certified in waiters:
                if want_certified:
                    self.rpc.enqueue_response(handle, payload)
                else:
                    remaining.append((handle, want_certified))
            if remaining:
                self._client_waiters[key] = remaining
            else:
                del self._client_waiters[key]
            return
        del self._client_waiters[key]
        for handle, _ in waiters:
            self.rpc.enqueue_response(handle, payload)

    def _send_peer(self, address: str, message: Message) -> None:
        session = self._peer_sessions.get(address)
        if session is None or session.error is not None:
            host, port = address.rsplit(":", 1)
            session = self.rpc.create_session((host, int(port)))
            self._peer_sessions[address] = session

        def on_reply(payload: bytes | None, error: RpcError | None) -> None:
            # A lost or failed request is retransmitted by the coordinator's own timer.
            if error is not None or not payload:
                return
            try:
                reply = codec.decode(payload)
            except InvalidRequest:
                self.counters["bad_requests"] += 1
                return
            self._handle(address, reply)

        try:
            self.rpc.enqueue_request(session, wire.PEER, codec.encode(message), on_reply)
        except RpcError as exc:
            log.warning("peer send failed", extra={"fields": {"peer": address, "error": repr(exc)}})
            self._peer_sessions.pop(address, None)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.transport is not None:
            await self.transport.close()
        self.rpc.close()


class PauseMonitor:
    """Measures what stalls the process: the cyclic garbage collector's pauses and the event
    loop's lag (a callback scheduled every 50 ms that runs late). Logged when long, and
    reported in the status counters.

    It also keeps the collector's pauses short. A server holds millions of long-lived objects
    (versions, chains) and CPython's full collection scans them all: measured here, 50 ms to
    1.1 s pauses under TPC-C, long enough for clients' sessions to time out. The store's
    data holds no reference cycles (reference counting frees it), so every second the
    objects that survived are moved to the permanent generation (``gc.freeze``), and a
    collection only scans what is younger than that.
    """

    FREEZE_EVERY_TICKS = 20  # 50 ms ticks: once a second

    def __init__(self, loop: asyncio.AbstractEventLoop, counters: dict[str, Any]) -> None:
        self.loop = loop
        self.counters = counters
        counters.update(gc_pause_max_ms=0.0, gc_pauses_over_50ms=0, loop_lag_max_ms=0.0)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self._expected = loop.time() + 0.05
        self._ticks = 0
        loop.call_later(0.05, self._tick)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._gc_started) * 1000
        self.counters["gc_pause_max_ms"] = max(self.counters["gc_pause_max_ms"], round(pause_ms, 2))
        if pause_ms > 50:
            self.counters["gc_pauses_over_50ms"] += 1
            log.warning("long gc pause", extra={"fields": {"ms": round(pause_ms, 1), **info}})

    def _tick(self) -> None:
        now = self.loop.time()
        lag_ms = (now - self._expected) * 1000
        if lag_ms > self.counters["loop_lag_max_ms"]:
            self.counters["loop_lag_max_ms"] = round(lag_ms, 2)
        if lag_ms > 100:
            log.warning("event loop stalled", extra={"fields": {"ms": round(lag_ms, 1)}})
        self._expected = now + 0.05
        self._ticks += 1
        if self._ticks % self.FREEZE_EVERY_TICKS == 0:
            gc.freeze()
        self.loop.call_later(0.05, self._tick)


async def _serve(config: ClusterConfig, node: ReplicaNode) -> None:
    loop = asyncio.get_running_loop()
    server = ShardServer(config, node.shard, loop, node)
    await server.start()
    PauseMonitor(loop, server.counters)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    log.info("serving", extra={"fields": {"shard": node.shard, "role": node.role, "address": node.address, "pid": os.getpid()}})
    print(f"shard {node.shard} {node.role} ({node.region}) serving on {node.address}", flush=True)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            if os.getppid() != parent:  # the process that started us is gone: so are we
                log.info("parent exited; stopping")
                break
    log.info("stopping", extra={"fields": {"counters": server.counters}})
    await server.close()


def log_name(node: ReplicaNode) -> str:
    if node.role == "leader":
        return f"shard-{node.shard}"
    return f"shard-{node.shard}-{node.region}"


def serve(config: ClusterConfig, shard: int, role: str = "leader", region: str | None = None) -> None:
    from store.node import logs

    node = config.node(role, shard, region)
    logs.setup(config.run_dir / f"{log_name(node)}.log")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(config, node))
    finally:
        loop.close()
