"""The inter-region transport of the Paxos streams: gRPC (grpc.aio) batches (DESIGN.md §4).

Theory of operation (see also docs/replication.md, "gRPC transport"):

* **One outgoing stream per destination.** Each node dials the replicas it sends to: one
  long-lived bidirectional ``Replicate`` call per destination, opened lazily on the first
  message and reopened after a failure, at least ``connect_backoff_s`` (doubling up to
  ``connect_backoff_max_s``) after the previous attempt. Each direction of a region pair has
  its own connection, so in a local multi-region cluster each has its own wan-proxy link:
  ``routes[dst]`` is whatever address reaches ``dst`` (a proxy listener, usually), never
  assumed to equal ``dst``.
* **Batching.** ``send`` only appends to the destination's queue and wakes its writer task.
  The writer resumes on a later loop iteration, so everything queued during one iteration
  (and everything queued while the previous write was in flight) goes out as one
  ``ReplicationBatch``. grpc.aio moves a few thousand writes per second per stream; batching
  is what lets a stream carry far more messages than that.
* **Never block, drop the oldest.** A queue holds at most ``queue_messages_max`` messages;
  beyond that the oldest is dropped and counted, and so is a message that waited longer than
  ``queue_age_max_s``: Paxos retransmits what matters (Accepts every ``accept_retry_ns``,
  Fetches for gaps), so loss is safe; blocking a Paxos role on a slow or partitioned region
  is not, and neither is sending it a backlog of retransmissions it no longer needs. A batch
  whose write fails is dropped too (it may or may not have arrived; Paxos tolerates either).
* **Bounded work per write.** A batch is converted one message at a time up to
  ``batch_bytes_target`` (or ``batch_messages_max`` messages), written, and only then is the
  next one converted: converting is the sender's CPU, on the event loop, and a backlog taken
  whole stopped a TPC-C shard leader for 17 s when a follower came back (its heartbeats
  stopped with it, and the configuration manager failed it over). With TLS a write to a
  peer that is down fails at once (without, it waits for the connection): a fresh call waits
  for its channel to connect before anything is taken from the queue, and while it cannot,
  one message per attempt is written, which fails and says why.
* **Incoming.** The server side parses each batch from raw bytes with
  ``store.proto.convert.parse_batch`` and hands every message, in order, to
  ``on_message(src, message)`` on the event loop. A malformed batch raises only
  ``InvalidRequest``: it is counted in ``bad_batches`` and the stream goes on, so no input
  from another region can take the server down. The response direction stays unused.

Everything runs on the one event loop passed as ``loop``: call every method from it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc  # GRPC_EXPERIMENTS is set before, by store/node/__init__.py
import grpc.aio

from store.core.errors import InvalidRequest
from store.core.paxos import PaxosMessage
from store.proto import replication_pb2 as pb
from store.proto import replication_pb2_grpc as pb_grpc
from store.proto.convert import BATCH_MESSAGES_MAX, message_to_pb, parse_batch

logger = logging.getLogger(__name__)

# A batch of Accepts whose entries hold 400 records each runs to megabytes; gRPC's 4 MiB
# default would refuse it.
MESSAGE_BYTES_MAX = 64 * 1024 * 1024
QUEUE_MESSAGES_MAX = 100_000
# A message that waited longer is dropped: Paxos has retransmitted it meanwhile if it matters.
QUEUE_AGE_MAX_S = 1.0
# Bytes of one batch (one gRPC write), the conversion done between two awaits.
BATCH_BYTES_TARGET = 4 * 1024 * 1024
CONNECT_BACKOFF_S = 0.05
CONNECT_BACKOFF_MAX_S = 1.0
# Loopback links (through the wan-proxy) rarely die silently, but a held partition can
# stall one: a ping unanswered for KEEPALIVE_TIMEOUT_MS ends the call and we redial.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000

_SERVICE = pb.DESCRIPTOR.services_by_name["Replication"]
_METHOD = _SERVICE.methods_by_name["Replicate"]
_METHOD_PATH = f"/{_SERVICE.full_name}/{_METHOD.name}"

# A link refused by TLS is said so at most this often (it is dialed again every backoff).
TLS_LOG_INTERVAL_S = 10.0

STATS_KEYS = (
    "tls_refused",
    "bytes_sent",
    "batches_sent",
    "messages_sent",
    "batches_received",
    "messages_received",
    "dropped",
    "reconnects",
    "bad_batches",
)


def channel_options(
    message_bytes_max: int = MESSAGE_BYTES_MAX,
    connect_backoff_s: float = CONNECT_BACKOFF_S,
    connect_backoff_max_s: float = CONNECT_BACKOFF_MAX_S,
) -> list[tuple[str, Any]]:
    """Client options: large messages, keepalive, and a reconnect backoff that follows ours
    (gRPC's own starts at 1 s and grows to 120 s, far too slow to notice a region that
    came back)."""
    backoff_ms = max(1, int(connect_backoff_s * 1000))
    backoff_max_ms = max(backoff_ms, int(connect_backoff_max_s * 1000))
    return [
        ("grpc.max_send_message_length", message_bytes_max),
        ("grpc.max_receive_message_length", message_bytes_max),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", backoff_ms),
        ("grpc.min_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_reconnect_backoff_ms", backoff_max_ms),
        # Each destination gets its own connection even when two routes share an address.
        ("grpc.use_local_subchannel_pool", 1),
    ]


def server_options(message_bytes_max: int = MESSAGE_BYTES_MAX) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", message_bytes_max),
        ("grpc.max_receive_message_length", message_bytes_max),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Clients ping every KEEPALIVE_TIME_MS; accept that (the default minimum is 5 min).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        # gRPC sets SO_REUSEPORT by default: two servers misconfigured onto one port would
        # then both bind and share its connections. Fail the second one instead.
        ("grpc.so_reuseport", 0),
    ]


def _report_writer_death(task: asyncio.Task[None]) -> None:
    # A writer only ends by cancellation (close). Anything else is a bug that would leave
    # its destination silently cut off: make it loud.
    if not task.cancelled() and task.exception() is not None:
        logger.critical(
            "%s died; its destination gets nothing more", task.get_name(), exc_info=task.exception()
        )


class _Peer:
    """The outgoing side for one destination: its queue, channel, call and writer task."""

    def __init__(self, dst: str, target: str, queue_messages_max: int) -> None:
        self.dst = dst
        self.target = target
        # (when queued, message), oldest first.
        self.queue: collections.deque[tuple[float, PaxosMessage]] = collections.deque(
            maxlen=queue_messages_max
        )
        # A message converted for a batch it did not fit: the first of the next one.
        self.carry: tuple[Any, int] | None = None
        self.wakeup = asyncio.Event()
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None  # grpc.aio.StreamStreamCall
        self.writer: asyncio.Task[None] | None = None
        self.calls_opened = 0
        self.tls_logged_at = -float("inf")  # when a TLS refusal was last logged
        self.tls_refusals = 0  # refusals not logged since


@dataclass(frozen=True)
class TlsIdentity:
    """Mutual TLS for every replication link: this process's key and certificate (PEM), the
    cluster's CA certificate, and the name each destination's certificate carries (its
    process name, as ``meridian certs`` writes it): the name is checked rather than the
    address dialed, since a link may go through a proxy (``meridian wan-proxy``)."""

    key: bytes
    certificate: bytes
    ca: bytes
    peer_names: dict[str, str]  # destination address -> the name its certificate must carry


class ReplicationTransport:
    """Carries Paxos stream messages between regions over gRPC; see the module docstring."""

    def __init__(
        self,
        address: str,
        listen: tuple[str, int],
        routes: dict[str, tuple[str, int]],
        on_message: Callable[[str, PaxosMessage], None],
        *,
        loop: asyncio.AbstractEventLoop,
        queue_messages_max: int = QUEUE_MESSAGES_MAX,
        connect_backoff_s: float = CONNECT_BACKOFF_S,
        connect_backoff_max_s: float = CONNECT_BACKOFF_MAX_S,
        batch_messages_max: int = BATCH_MESSAGES_MAX,
        message_bytes_max: int = MESSAGE_BYTES_MAX,
        close_grace_s: float = 0.0,
        tls: TlsIdentity | None = None,
        queue_age_max_s: float = QUEUE_AGE_MAX_S,
        batch_bytes_target: int = BATCH_BYTES_TARGET,
    ) -> None:
        assert queue_messages_max >= 1
        assert batch_messages_max >= 1
        assert 0 < connect_backoff_s <= connect_backoff_max_s
        assert message_bytes_max >= 1024
        assert queue_age_max_s > 0 and batch_bytes_target >= 1
        assert address not in routes, "a node does not dial itself"
        self.address = address
        self.listen = listen
        self.routes = dict(routes)
        self.on_message = on_message
        self.loop = loop
        self.queue_messages_max = queue_messages_max
        self.connect_backoff_s = connect_backoff_s
        self.connect_backoff_max_s = connect_backoff_max_s
        self.batch_messages_max = batch_messages_max
        self.message_bytes_max = message_bytes_max
        self.queue_age_max_s = queue_age_max_s
        # What a batch's messages may weigh: the limit less room for the batch's own fields.
        self._batch_room = message_bytes_max - 256
        self.batch_bytes_target = min(batch_bytes_target, self._batch_room)
        self.close_grace_s = close_grace_s
        self.tls = tls
        self.port: int | None = None  # the bound port once started (``listen`` may say 0)
        self._server: grpc.aio.Server | None = None
        self._peers: dict[str, _Peer] = {}
        self._closed = False
        self._stats = dict.fromkeys(STATS_KEYS, 0)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Serve ``Replicate`` on ``listen``."""
        assert asyncio.get_running_loop() is self.loop
        assert self._server is None and not self._closed
        server = grpc.aio.server(options=server_options(self.message_bytes_max))
        # Registered by hand rather than with pb_grpc.add_ReplicationServicer_to_server so
        # that requests arrive as raw bytes: the generated deserializer would end the call on
        # unparsable bytes, while parse_batch turns them into InvalidRequest, which we count
        # and survive. The method path comes from the generated descriptor.
        handler = grpc.stream_stream_rpc_method_handler(self._serve_replicate)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE.full_name, {_METHOD.name: handler}),)
        )
        host, port = self.listen
        if self.tls is None:
            self.port = server.add_insecure_port(f"{host}:{port}")
        else:
            # Mutual: a peer must show a certificate the cluster's CA signed.
            credentials = grpc.ssl_server_credentials(
                [(self.tls.key, self.tls.certificate)], root_certificates=self.tls.ca,
                require_client_auth=True,
            )
            self.port = server.add_secure_port(f"{host}:{port}", credentials)
        if self.port == 0:
            raise OSError(f"replication transport cannot listen on {host}:{port}")
        await server.start()
        self._server = server

    async def close(self) -> None:
        """Stop sending (queued messages are discarded) and stop serving."""
        assert asyncio.get_running_loop() is self.loop
        if self._closed:
            return
        self._closed = True
        peers = list(self._peers.values())
        for peer in peers:
            if peer.writer is not None:
                peer.writer.cancel()
        for peer in peers:
            if peer.writer is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await peer.writer
            if peer.call is not None:
                peer.call.cancel()
            if peer.channel is not None:
                await peer.channel.close()
            peer.queue.clear()
            peer.carry = None
        if self._server is not None:
            await self._server.stop(self.close_grace_s)

    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def queued(self) -> dict[str, int]:
        """Messages waiting to be written, per destination."""
        return {
            dst: len(peer.queue) + (peer.carry is not None) for dst, peer in self._peers.items()
        }

    # ---- sending -----------------------------------------------------------------------

    def send(self, dst: str, message: PaxosMessage) -> None:
        """Queue ``message`` for replica ``dst``; never blocks. Call from the loop's thread."""
        assert isinstance(message, PaxosMessage), message
        if self._closed:
            self._stats["dropped"] += 1
            return
        peer = self._peers.get(dst)
        if peer is None:
            if dst not in self.routes:
                raise KeyError(f"no route to replica {dst!r}")
            host, port = self.routes[dst]
            peer = _Peer(dst, f"{host}:{port}", self.queue_messages_max)
            self._peers[dst] = peer
            peer.writer = self.loop.create_task(self._write_loop(peer), name=f"replicate-{dst}")
            peer.writer.add_done_callback(_report_writer_death)
        if len(peer.queue) == self.queue_messages_max:
            self._stats["dropped"] += 1  # the deque's maxlen pushes out the oldest
        peer.queue.append((self.loop.time(), message))
        peer.wakeup.set()

    def _take_batch(self, peer: _Peer, count_max: int) -> Any | None:
        """The next batch: queued messages in order, converted one at a time, up to
        ``count_max`` of them and ``batch_bytes_target`` bytes (one message alone may go up
        to ``message_bytes_max``); None if every queued message was dropped (too old, or too
        large for any write)."""
        queue = peer.queue
        stale_before = self.loop.time() - self.queue_age_max_s
        while queue and queue[0][0] < stale_before:
            queue.popleft()
            self._stats["dropped"] += 1
        messages: list[Any] = []
        size = 0
        while len(messages) < count_max:
            if peer.carry is not None:
                converted, bytes_ = peer.carry
                peer.carry = None
            elif queue:
                converted = message_to_pb(queue.popleft()[1])
                bytes_ = converted.ByteSize() + 8  # with its field tag and length
                if bytes_ > self._batch_room:
                    # Too large for any write: the receiver could not take it either.
                    logger.error(
                        "a replication message to %s over %d bytes was dropped",
                        peer.dst, self.message_bytes_max,
                    )
                    self._stats["dropped"] += 1
                    continue
            else:
                break
            if messages and size + bytes_ > self.batch_bytes_target:
                peer.carry = (converted, bytes_)
                break
            messages.append(converted)
            size += bytes_
        if not messages:
            return None
        return pb.ReplicationBatch(src=self.address, messages=messages)

    async def _connected(self, peer: _Peer, timeout_s: float) -> bool:
        """Whether ``peer``'s channel connects within ``timeout_s``."""
        assert peer.channel is not None
        try:
            await asyncio.wait_for(peer.channel.channel_ready(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _open_channel(self, peer: _Peer) -> None:
        if peer.channel is None:
            options = channel_options(
                self.message_bytes_max, self.connect_backoff_s, self.connect_backoff_max_s
            )
            if self.tls is None:
                peer.channel = grpc.aio.insecure_channel(peer.target, options=options)
            else:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=self.tls.ca, private_key=self.tls.key,
                    certificate_chain=self.tls.certificate,
                )
                name = self.tls.peer_names[peer.dst]
                options.append(("grpc.ssl_target_name_override", name))
                peer.channel = grpc.aio.secure_channel(peer.target, credentials, options=options)

    def _open_call(self, peer: _Peer) -> None:
        self._open_channel(peer)
        stub = pb_grpc.ReplicationStub(peer.channel)  # type: ignore[no-untyped-call]
        # wait_for_ready: while the peer is down the call waits for the channel to connect
        # (gRPC redials with the backoff set above) instead of failing at once. Not with
        # TLS: a refused handshake would then wait forever, silently; failing, the call says
        # why (_log_ended) and the write loop dials again after its own backoff.
        peer.call = stub.Replicate(wait_for_ready=self.tls is None)
        if peer.calls_opened:
            self._stats["reconnects"] += 1
        peer.calls_opened += 1
        peer.call.add_done_callback(lambda _call: peer.wakeup.set())

    async def _write_loop(self, peer: _Peer) -> None:
        backoff_s = self.connect_backoff_s
        opened_at = -float("inf")
        wrote = False  # on the current call
        while True:
            if not peer.queue and peer.carry is None:
                peer.wakeup.clear()
                await peer.wakeup.wait()
                continue
            if peer.call is not None and peer.call.done():
                # The stream ended (the peer went away, or a write failed). Redial at least
                # backoff_s after the previous attempt; the pause doubles while calls keep
                # ending before carrying a single batch.
                peer.call = None
                backoff_s = (
                    self.connect_backoff_s
                    if wrote
                    else min(backoff_s * 2, self.connect_backoff_max_s)
                )
                pause_s = opened_at + backoff_s - self.loop.time()
                if pause_s > 0:
                    await asyncio.sleep(pause_s)
            count_max = self.batch_messages_max
            if peer.call is None:
                if self.tls is not None:
                    self._open_channel(peer)
                    if not await self._connected(peer, backoff_s):
                        # Down (or refusing the handshake): one message, whose write fails
                        # and says why, rather than a batch converted only to be dropped.
                        count_max = 1
                self._open_call(peer)
                opened_at = self.loop.time()
                wrote = False
            batch = self._take_batch(peer, count_max)
            if batch is not None and await self._write(peer, batch):
                wrote = True

    async def _write(self, peer: _Peer, batch: Any) -> bool:
        """Write one batch on ``peer``'s call; False (batch dropped, call ended) on failure."""
        try:
            await peer.call.write(batch)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
            self._stats["dropped"] += len(batch.messages)
            self._log_ended(peer, error)
            peer.call.cancel()  # makes done() true whatever the error was
            return False
        self._stats["batches_sent"] += 1
        self._stats["messages_sent"] += len(batch.messages)
        self._stats["bytes_sent"] += batch.ByteSize()
        return True

    def _log_ended(self, peer: _Peer, error: BaseException) -> None:
        details = str(error.details() if isinstance(error, grpc.aio.AioRpcError) else error)
        lowered = details.lower()
        if self.tls is not None and any(
            word in lowered
            for word in ("ssl", "tls", "handshake", "certificate", "verification")
        ):
            # Refused by TLS: the peer's certificate is not signed by the cluster's CA, has
            # expired, or names another process (or ours is refused there). Said plainly,
            # since gRPC's own words are those of its TLS library; once per peer every
            # TLS_LOG_INTERVAL_S, with how many refusals since.
            self._stats["tls_refused"] += 1
            now = self.loop.time()
            if now < peer.tls_logged_at + TLS_LOG_INTERVAL_S:
                peer.tls_refusals += 1
                return
            logger.warning(
                "replication link to %s via %s refused by TLS (is its certificate signed by "
                "this cluster's CA, valid now, and for %s? %d more refusals since the last "
                "line): %s",
                peer.dst, peer.target, self.tls.peer_names.get(peer.dst), peer.tls_refusals,
                details,
            )
            peer.tls_logged_at = now
            peer.tls_refusals = 0
            return
        logger.info("replication stream to %s via %s ended: %s", peer.dst, peer.target, details)

    # ---- receiving ---------------------------------------------------------------------

    async def _serve_replicate(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        async for data in requests:
            if self._closed:
                return  # no on_message once close() has begun
            try:
                src, messages = parse_batch(data)
            except InvalidRequest as error:
                self._stats["bad_batches"] += 1
                logger.warning("bad replication batch from %s: %s", context.peer(), error)
                continue
            self._stats["batches_received"] += 1
            self._stats["messages_received"] += len(messages)
            for message in messages:
                try:
                    self.on_message(src, message)
                except Exception:
                    # A bug in the receiving role must not cut the stream for every other
                    # Paxos stream on it; it is logged with its traceback.
                    logger.exception("on_message(%r, %r) failed", src, message)
