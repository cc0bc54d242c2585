"""Hosting a pure replica on an RPC endpoint: the one adapter that the server process and the
simulator share (DESIGN.md §7), so that what the simulator proves is what production runs.

Theory of operation. A replica (``ShardLeader`` or ``ShardFollower``) takes
``handle(now_ns, src, message)`` and ``tick(now_ns)`` and hands back, from ``ready()``, the
messages to send and when to wake it. The host gives it the world:

* **Bad input never reaches the replica.** Every request is decoded by the strict codec
  first; a client's malformed request is answered ``INVALID``, a peer's gets an empty
  response, and both are counted.
* **Clients.** A ``Submit`` is handed to the replica from the address ``c\\0<client_id>``.
  The replica's ``Outcome``s to that address answer the RPC requests waiting for that
  ``(client_id, seq)``: a ``CERTIFIED`` outcome only the requests that asked for it, a final
  outcome every one of them. A client may ask again (same id) while an earlier request
  still waits; each gets its answer. A client's ``AwaitOutcomes`` (``wire.AWAIT``) for many
  transactions answered CERTIFIED is not the replica's business: the host answers it from
  the coordinator's remembered outcomes, or holds it (one per client: a newer one replaces
  it) and answers it at the end of the first ``_send`` that carries a final outcome of one
  of its transactions, with every final outcome of that send.
* **Peer requests and their replies.** A peer's request (lock, validate, install, read,
  solo, abort; a follower's snapshot read or state request; a configuration manager's
  ``GetConfig``) is
  handed to the replica from a fresh token address ``p\\0<n>``, if it is one the replica
  answers (its ``ANSWERS``; its ``ONE_WAY`` messages are handed over with no reply). Replicas answer synchronously — the reply comes out of the very
  ``handle`` call that received the request (``store.protocol.messages.PEER_REQUESTS``) — and
  the reply becomes the RPC response. The host checks that rule both ways: a request that
  produced no reply, or a reply to a token no longer waiting, is a broken invariant. A
  one-way message (gossip) gets an empty response at once.
* **Sending.** Messages to other shard leaders go as ``PEER`` requests on one RPC session
  per peer (opened lazily, reopened after a failure); the reply comes back as the response
  and is handed to the replica as a message from that peer if it is one the replica takes
  (its ``REPLIES``). A lost request is no concern
  here: the coordinator retransmits on its own timer. Paxos messages go to the stream
  transport (gRPC between regions in production, the simulated network in the simulator).
* **Disk.** A ``Ready``'s ``persist`` records (an acceptor's promises and votes) go to the
  host's ``durable`` (the server's write-ahead log, the simulator's disk). Paxos messages
  are what report them (a Promise, an Accepted, a Reject naming a promise): those of a
  ``ready()`` whose records hold (``Ready.hold``) wait until the records are synced, and
  every later Paxos message waits behind them, in order (etcd/raft's rule, applied to the
  messages that carry acceptor state). Everything else a replica sends derives from
  chosen slots, that is from votes already on disk in a majority, and goes at once: a
  follower's snapshot replies and state pieces, a leader's 2PC replies. A shard leader's (and a
  CM leader's) own votes are the one piece of acceptor state it acts on itself: with a disk
  the host sets its stream's ``votes_after_sync``, its records do not hold (``hold`` false), and the
  votes count only when the host calls ``synced`` for the Ready that carried them
  (``Ready.wants_synced``): so a slot is chosen, and a client told COMMITTED, only by
  votes on disk. One sync at a time; it covers every record written before it started
  (group commit); records written while it runs wait for the next.
* **Snapshots.** With a disk that keeps them (``SnapshotDisk``), a follower writes one of
  its state (``capture_state``) when it has none of its own on disk yet (a fresh follower,
  one that copied its state, a retired leader) and whenever the disk asks; the host says
  whether a log may be rewritten as its acceptor's checkpoint (``checkpoint``: a
  follower's only when its newest snapshot is at or above the oldest slot its acceptor
  keeps). A snapshot leaves out the entries the follower delivered recently, which its
  log holds (``Acceptor.learned``), so it goes to the disk only once every record written
  before it was captured is synced. A restarted follower goes on from its snapshot if it
  may (``restore_follower``).
* **Time.** One timer at the replica's wake-up time; ``Timers`` says what "now" is.
* **Promotion and retirement.** A replica whose ``Ready`` names a ``successor`` (a follower
  the cluster map made its shard's leader, or a retired leader that becomes a follower
  again) is replaced by it; the host goes on with the successor.
* **Fail fast.** The replica's inputs are validated, so an exception out of it is a broken
  invariant (an ``assert`` of the protocol, or a bug). The host stops: it serves nothing
  more and hands the exception to ``on_fatal`` — the server process logs it and exits
  non-zero, the simulator records it and crashes the node. It never logs and goes on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

from store import wire
from store.core.cm import ConfigMember
from store.core.errors import InvalidRequest, Status
from store.core.follower import ShardFollower
from store.core.paxos import PaxosMessage, StreamLeader
from store.core.replica import ShardLeader
from store.core.transfer import FollowerState
from store.core.vclock import EMPTY
from store.protocol import codec
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import (
    AwaitOutcomes,
    GetConfig,
    Message,
    Outcome,
    Outcomes,
    SnapshotRead,
    Submit,
)
from store.rpc import Nexus, ReqHandle, RpcBase, RpcError, Session

log = logging.getLogger("meridian.host")

CLIENT_PREFIX = "c\x00"
PEER_REPLY_PREFIX = "p\x00"
# The source of one-way messages: nothing may be addressed to it.
ONE_WAY_SOURCE = "p\x00one-way"

Replica = ShardLeader | ShardFollower | ConfigMember
M = TypeVar("M", bound=Message)
# How a request is answered: the RPC response of its own request, or its place in a batch.
Responder = Callable[[bytes], None]


class _BatchReply:
    """The replies to a batched request (``wire.PEER_MANY``), one place per item; the
    response goes once every place is filled (within the batch's flush: the reply rule)."""

    __slots__ = ("_answers", "_handle", "_missing", "_rpc")

    def __init__(self, rpc: RpcBase, handle: ReqHandle, count: int) -> None:
        self._rpc = rpc
        self._handle = handle
        self._answers: list[bytes | None] = [None] * count
        self._missing = count

    def answer(self, index: int, payload: bytes) -> None:
        assert self._answers[index] is None, f"item {index} of a batch answered twice"
        self._answers[index] = payload
        self._missing -= 1
        if not self._missing:
            self._rpc.enqueue_response(self._handle, codec.encode_batch(self._answers))  # type: ignore[arg-type]


class _Watch:
    """An ``AwaitOutcomes`` held until one of its transactions ends: the final outcomes heard
    until the end of that ``_send`` go in its answer (one answer for everything one step
    decided), the later ones in the client's next request."""

    __slots__ = ("client_id", "outcomes", "respond")

    def __init__(self, client_id: str, respond: Responder) -> None:
        self.client_id = client_id
        self.respond = respond
        self.outcomes: list[Outcome] = []


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """The host's clock and its one kind of timer (the event loop's, or virtual time's)."""

    def clock_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle: ...


class Durable(Protocol):
    """Stable storage for a replica's acceptor records: ``write`` them (in order), and
    ``sync``: make everything written so far durable, then call ``done`` (on the host's
    thread, later; never for a sync a crash cut short)."""

    def write(self, records: list[PaxosMessage]) -> None: ...

    def sync(self, done: Callable[[], None]) -> None: ...


class SnapshotDisk(Protocol):
    """A ``Durable`` that also keeps a follower's snapshot (store.node.snapshot): write the
    state whole, then call ``done(slot)``; ``snapshot_wanted``: the disk asks for a fresh
    one (before it may rewrite the follower's log)."""

    snapshot_wanted: bool

    def save_snapshot(self, state: FollowerState, done: Callable[[int], None]) -> None: ...


def restore_follower(
    follower: ShardFollower, snapshot: FollowerState | None, initial: ClusterMap
) -> bool:
    """A restarted ``follower`` (built rejoining, with its acceptor from its log) goes on from
    its own ``snapshot`` if it may (``ShardFollower.may_restore``); ``initial``: the cluster
    map of epoch 0, the one a snapshot taken before any map came followed."""
    if snapshot is None:
        return False
    if snapshot.cluster_map is None and snapshot.epoch == 0:
        snapshot.cluster_map = initial
    if not ShardFollower.may_restore(snapshot, follower.stream.acceptor, follower.address):
        return False
    follower.restore(snapshot)
    return True


class ReplicaHost:
    """One replica on one RPC endpoint (see the module doc)."""

    def __init__(
        self,
        replica: Replica,
        rpc: RpcBase,
        timers: Timers,
        *,
        peer_address: Callable[[str], Any],
        stream_send: Callable[[str, PaxosMessage], None] | None,
        request_bytes_max: int,
        on_fatal: Callable[[BaseException], None],
        durable: Durable | None = None,
    ) -> None:
        self.replica = replica
        self._durable = durable
        # Snapshots (module doc, "Disk"): the follower the newest one on disk is of, and its
        # delivery point; whether one is being written.
        self._snapshots: SnapshotDisk | None = (
            durable if hasattr(durable, "save_snapshot") else None  # type: ignore[assignment]
        )
        self._snapshot_of: object = None
        self.snapshot_slot = -1
        self._snapshot_writing = False
        # A snapshot captured, waiting for the log records written before it: (write, state).
        self._snapshot_waiting: tuple[int, ShardFollower, FollowerState] | None = None
        # Writes handed to ``durable`` (numbered from 1), the last one synced, the one the
        # sync in flight covers (0: none in flight), and the messages waiting for a sync:
        # (the write they wait for, [(destination, Paxos message)]).
        self._written = 0
        self._synced = 0
        self._syncing = 0
        self._hold_through = 0  # the last write whose sync messages must wait for
        self._held: deque[tuple[int, list[tuple[str, Message]]]] = deque()
        # Writes whose sync the replica that made them is to hear of (Ready.wants_synced).
        self._sync_waiters: dict[int, Replica] = {}
        self.rpc = rpc
        self.timers = timers
        self._peer_address = peer_address
        self._stream_send = stream_send
        self._request_bytes_max = request_bytes_max
        self._on_fatal = on_fatal
        self._peer_sessions: dict[str, Session] = {}
        self._unreachable: set[str] = set()  # peers whose session could not be made (logged)
        # Who waits for a client's transaction: (how to answer, whether it asked for the
        # CERTIFIED answer). An answer goes to an RPC request, or to its place in a batch.
        self._client_waiters: dict[tuple[str, int], list[tuple[Responder, bool]]] = {}
        # Transactions named by a client's held AwaitOutcomes, and each client's held one
        # (a client has one on the wire per leader: a newer one replaces it), answered at
        # the end of the _send that carried a final outcome of one of them.
        self._awaited: set[tuple[str, int]] = set()
        self._watches: dict[str, _Watch] = {}
        self._watches_due: list[_Watch] = []
        self._peer_replies: dict[str, Responder] = {}
        # Transactions of an in-server load generator (store/node/generator.py), answered
        # with the Outcome object itself: their final answer only.
        self._local_waiters: dict[tuple[str, int], Callable[[Outcome], None]] = {}
        self._next_token = 0
        self._timer: TimerHandle | None = None
        self._timer_at: int | None = None
        self.failure: BaseException | None = None
        self.counters: dict[str, int] = {
            "submits": 0, "peer_messages": 0, "bad_requests": 0, "peer_send_failures": 0,
            "flushes": 0, "syncs": 0, "held_messages": 0, "peer_batches_sent": 0,
            "awaits": 0, "awaits_held": 0,
        }
        # Requests handed to the replica in the batch being dispatched, whose replies its
        # next flush must carry (the reply rule; checked after that flush).
        self._flush_due = False
        self._replies_due: list[tuple[str, Message]] = []
        self._batched = False  # whether the endpoint tells the end of each batch (register)
        # The clock read once for the batch being dispatched: its messages arrived together
        # and are one step of a shard leader, at one instant (0: no batch open).
        self._batch_now_ns = 0

    def register(self, nexus: Nexus) -> None:
        """Installs the request handlers this host serves on ``nexus``."""
        nexus.register_req_func(wire.SUBMIT, self._on_submit)
        nexus.register_req_func(wire.AWAIT, self._on_await)
        nexus.register_req_func(wire.PEER, self._on_peer)
        nexus.register_req_func(wire.PEER_MANY, self._on_peer_many)
        nexus.register_req_func(wire.SNAPSHOT, self._on_snapshot)
        nexus.register_req_func(wire.CONFIG, self._on_config)
        if self.rpc is not None and not self._batched:
            self.rpc.after_dispatch.append(self._end_of_batch)
            self._batched = True

    def start(self) -> None:
        self._flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- requests ------------------------------------------------------------------------

    def _on_submit(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        if self.failure is not None:
            return None
        return self._submit(partial(self.rpc.enqueue_response, handle), payload)

    def _submit(self, respond: Responder, payload: bytes) -> bytes | None:
        """One submission: its answer now (bytes), or None when ``respond`` gets it later."""
        self.counters["submits"] += 1
        if not isinstance(self.replica, ShardLeader):
            # A client whose map is newer than this replica's: the CM made it a leader and
            # the map is on its way. Nothing ran; the client tries again.
            return codec.encode(
                Outcome(0, Status.UNAVAILABLE, None, EMPTY, "not a shard leader (yet)")
            )
        message = self._client_request(payload, Submit)
        if isinstance(message, bytes):
            return message  # INVALID
        key = (message.client_id, message.seq)
        self._client_waiters.setdefault(key, []).append((respond, message.want_certified))
        self._deliver(CLIENT_PREFIX + message.client_id, message)
        return None

    def _client_request(self, payload: bytes, kind: type[M]) -> M | bytes:
        """A client's request decoded and of ``kind``, or the encoded INVALID answer."""
        try:
            if len(payload) > self._request_bytes_max:
                raise InvalidRequest(f"request larger than {self._request_bytes_max} bytes")
            message = codec.decode(payload)
            if not isinstance(message, kind):
                raise InvalidRequest(
                    f"the request carries a {type(message).__name__}, not a {kind.__name__}"
                )
        except InvalidRequest as exc:
            self.counters["bad_requests"] += 1
            return codec.encode(Outcome(0, Status.INVALID, None, EMPTY, str(exc)))
        return message

    def _on_await(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        if self.failure is not None:
            return None
        return self._await(partial(self.rpc.enqueue_response, handle), payload)

    def _await(self, respond: Responder, payload: bytes) -> bytes | None:
        """A client's ``AwaitOutcomes``: the final outcomes known now, or None when
        ``respond`` gets them once one of its transactions ends (``_answer_client``)."""
        self.counters["awaits"] += 1
        message = self._client_request(payload, AwaitOutcomes)
        if isinstance(message, bytes):
            return message  # INVALID
        replica = self.replica
        if not isinstance(replica, ShardLeader):
            # No coordinator here (any more): the client asks each with its Submit, whose
            # answer says what this process is.
            return codec.encode(Outcomes([], message.seqs))
        coordinator, client_id = replica.coordinator, message.client_id
        finals: list[Outcome] = []
        unknown: list[int] = []
        running: list[int] = []
        for seq in message.seqs:
            outcome = coordinator.final_outcome(client_id, seq)
            if outcome is not None:
                finals.append(outcome)
            elif coordinator.knows(client_id, seq):
                running.append(seq)
            else:
                unknown.append(seq)
        if finals or unknown or not running:
            return codec.encode(Outcomes(finals, unknown))
        self.counters["awaits_held"] += 1
        self._watches[client_id] = _Watch(client_id, respond)
        self._awaited.update((client_id, seq) for seq in running)
        return None

    def submit_local(self, submissions: Sequence[tuple[Submit, Callable[[Outcome], None]]]) -> None:
        """Transactions made in this process (an in-server load generator): each handed to
        the replica as the object it is, its final Outcome passed to its callback (which
        must not call back in here: it is called in the middle of a flush). One ready()
        for the batch."""
        if self.failure is not None or not isinstance(self.replica, ShardLeader):
            for message, then in submissions:
                then(Outcome(message.seq, Status.UNAVAILABLE, None, EMPTY, "not a shard leader"))
            return
        try:
            now = self.timers.clock_ns()
            leader = self.replica
            for message, then in submissions:
                self._local_waiters[(message.client_id, message.seq)] = then
                leader.receive(now, CLIENT_PREFIX + message.client_id, message)
            self._flush()  # ready() ends the step: once for the batch
        except Exception as exc:  # a broken invariant, as in _deliver
            self._fail(exc)

    def _on_peer(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        if self.failure is not None:
            return None
        return self._peer_message(partial(self.rpc.enqueue_response, handle), payload)

    def _on_peer_many(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        """Several peer messages in one request (``wire.PEER_MANY``), handed to the replica
        in order; the response holds their replies (the replica answers each within the
        batch, so it goes at the end of the batch's flush)."""
        if self.failure is not None:
            return None
        try:
            items = codec.decode_batch(payload)
        except InvalidRequest:
            self.counters["bad_requests"] += 1
            return b""
        batch = _BatchReply(self.rpc, handle, len(items))
        for index, item in enumerate(items):
            if self.failure is not None:
                return None
            answer = self._peer_message(partial(batch.answer, index), item)
            if answer is not None:
                batch.answer(index, answer)
        return None

    def _peer_message(self, respond: Responder, payload: bytes) -> bytes | None:
        """One peer message: its answer now (bytes), or None when ``respond`` gets the
        replica's reply (within this batch's flush: the reply rule)."""
        self.counters["peer_messages"] += 1
        try:
            message = codec.decode(payload)
        except InvalidRequest:
            self.counters["bad_requests"] += 1
            return b""
        if isinstance(message, self.replica.ONE_WAY):
            self._deliver(ONE_WAY_SOURCE, message)
            return b""
        if not isinstance(message, self.replica.ANSWERS):
            self.counters["bad_requests"] += 1
            return b""
        self._answer_synchronously(respond, message)
        return None

    def _on_snapshot(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        return self._on_request(handle, payload, SnapshotRead)

    def _on_config(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        return self._on_request(handle, payload, GetConfig)

    def _on_request(
        self, handle: ReqHandle, payload: bytes, kind: type[Message]
    ) -> bytes | None:
        """A request of one kind (SNAPSHOT, CONFIG) for a replica that answers it."""
        if self.failure is not None:
            return None
        try:
            message = codec.decode(payload)
            if not isinstance(message, kind):
                raise InvalidRequest(f"expected a {kind.__name__}")
        except InvalidRequest as exc:
            self.counters["bad_requests"] += 1
            return codec.encode(Outcome(0, Status.INVALID, None, EMPTY, str(exc)))
        if not isinstance(message, self.replica.ANSWERS):
            # Not now (a restarted follower still copying its state), or not here (this
            # replica leads its shard now): the client asks elsewhere or again.
            why = (
                "it is rejoining (copying a live replica's state)"
                if getattr(self.replica, "rejoining", False) else
                f"it is a {type(self.replica).__name__}"
            )
            return codec.encode(Outcome(
                0, Status.UNAVAILABLE, None, EMPTY,
                f"{self.replica.address} does not serve {kind.__name__} now: {why}",
            ))
        self._answer_synchronously(partial(self.rpc.enqueue_response, handle), message)
        return None

    def _answer_synchronously(self, respond: Responder, message: Message) -> None:
        self._next_token += 1
        token = f"{PEER_REPLY_PREFIX}{self._next_token}"
        self._peer_replies[token] = respond
        self._deliver(token, message)
        if self._flush_due:
            self._replies_due.append((token, message))  # checked after the batch's flush
        else:
            self._check_replied(token, message)

    def _check_replied(self, token: str, message: Message) -> None:
        if self.failure is None and token in self._peer_replies:
            self._fail(AssertionError(
                f"{type(message).__name__} got no reply within its handle call "
                "(the reply rule of store.protocol.messages.PEER_REQUESTS)"
            ))

    def on_stream_message(self, src: str, message: PaxosMessage) -> None:
        """A Paxos message from the stream transport."""
        if self.failure is None:
            self._deliver(src, message)

    # ---- the replica ---------------------------------------------------------------------

    def _deliver(self, src: str, message: Message) -> None:
        """Hands ``message`` to the replica. Inside a batch of received events, what the
        replica produces is carried out once, at the end of the batch (``_end_of_batch``):
        one ``ready()`` for many messages, and a shard leader's step (``ShardLeader.receive``)
        ended once for them all."""
        try:
            replica, batching = self.replica, self._batched and self.rpc.dispatching
            if batching and isinstance(replica, ShardLeader):
                # The step stays open to the end of the batch: its flush (ready) ends it.
                # One instant for the batch, as in the simulator: a quiet stream's entry
                # closes at the end of the step and takes every record of it.
                now = self._batch_now_ns or self.timers.clock_ns()
                self._batch_now_ns = now
                replica.receive(now, src, message)
            else:
                replica.handle(self.timers.clock_ns(), src, message)
            if batching and not replica.has_successor:
                self._flush_due = True
            else:
                self._flush()
        except Exception as exc:  # inputs are validated: this is a broken invariant
            self._fail(exc)

    def _end_of_batch(self) -> None:
        self._batch_now_ns = 0
        if not self._flush_due:
            return
        self._flush_due = False
        replies, self._replies_due = self._replies_due, []
        if self.failure is not None:
            return
        try:
            self._flush()
        except Exception as exc:
            self._fail(exc)
            return
        for token, message in replies:
            self._check_replied(token, message)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.failure is not None:
            return
        try:
            self.replica.tick(self.timers.clock_ns())
            self._flush()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        self.failure = exc
        self.close()
        self._on_fatal(exc)

    def _flush(self) -> None:
        self.counters["flushes"] += 1
        replica = self.replica
        durable = self._durable
        if durable is not None and not isinstance(replica, ShardFollower):
            stream = getattr(replica, "stream", None)  # a shard's or the CM's leader
            if isinstance(stream, StreamLeader):
                stream.votes_after_sync = True  # its own votes count once on disk
        ready = replica.ready()
        synced_now = ready.wants_synced
        if durable is not None and ready.persist:
            durable.write(ready.persist)  # type: ignore[arg-type]
            self._written += 1
            if ready.hold:
                self._hold_through = self._written
            if synced_now:
                self._sync_waiters[self._written] = replica
                synced_now = False
            if not self._syncing:
                self._start_sync()
        if self._hold_through > self._synced or self._held:
            if ready.messages:
                self._hold(ready.messages)
        else:
            self._send(ready.messages)
        wake_at = ready.wake_at
        if ready.successor is not None:
            assert isinstance(ready.successor, ShardLeader | ShardFollower), ready.successor
            self.replica = ready.successor
            kind = "promotions" if isinstance(ready.successor, ShardLeader) else "retirements"
            self.counters[kind] = self.counters.get(kind, 0) + 1
            self._flush()
            return
        if wake_at is not None and (self._timer_at is None or wake_at < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = wake_at
            self._timer = self.timers.call_at(wake_at, self._on_timer)
        if synced_now:  # a Ready with no record to wait for (defensive: none is made so)
            replica.synced(self.timers.clock_ns())  # type: ignore[union-attr]
            self._flush()
            return
        if self._snapshots is not None and isinstance(replica, ShardFollower):
            self._maybe_snapshot(replica, self._snapshots)

    # ---- snapshots (module doc, "Disk") ---------------------------------------------------

    def restored(self, follower: ShardFollower, slot: int) -> None:
        """``follower`` went on from the snapshot on disk, at ``slot``."""
        self._snapshot_of, self.snapshot_slot = follower, slot

    def _maybe_snapshot(self, follower: ShardFollower, disk: SnapshotDisk) -> None:
        """A follower with no snapshot of its own on disk yet (a fresh one, one that copied
        its state, a retired leader), or whose disk asks for a fresh one, writes one."""
        if (
            self._snapshot_writing or follower.rejoining
            or (follower is self._snapshot_of and not disk.snapshot_wanted)
        ):
            return
        disk.snapshot_wanted = False
        self._snapshot_writing = True
        self.counters["snapshots"] = self.counters.get("snapshots", 0) + 1
        self._snapshot_waiting = (
            self._written, follower, follower.capture_state(with_recent=False)
        )
        self._save_snapshot_if_synced()

    def _save_snapshot_if_synced(self) -> None:
        """Hands the captured snapshot to the disk once the log records of what it covers
        are durable: a restart rebuilds its recent entries from the log (``restore``)."""
        waiting = self._snapshot_waiting
        if waiting is None or waiting[0] > self._synced:
            return
        self._snapshot_waiting = None
        _, follower, state = waiting
        assert self._snapshots is not None

        def done(slot: int) -> None:
            self._snapshot_writing = False
            self._snapshot_of, self.snapshot_slot = follower, slot

        self._snapshots.save_snapshot(state, done)

    def checkpoint(self, stream: int) -> list[PaxosMessage] | None:
        """The records that may replace ``stream``'s log now (its acceptor's checkpoint), or
        None: not now. A follower's log holds, above its snapshot, the votes it may have to
        report after a restart; so it is compacted only when the newest snapshot on disk is
        of this follower and at or above the oldest slot its acceptor keeps (else a fresh
        snapshot is asked for, and the compaction waits for it)."""
        replica = self.replica
        paxos = getattr(replica, "stream", None)
        if paxos is None or paxos.acceptor.stream != stream:
            return None
        acceptor = paxos.acceptor
        if isinstance(replica, ShardFollower) and self._snapshots is not None:
            if replica.rejoining:
                return None
            if replica is not self._snapshot_of or acceptor.forgotten_before > self.snapshot_slot:
                self._snapshots.snapshot_wanted = True
                return None
        records: list[PaxosMessage] = acceptor.checkpoint()
        return records

    def _send(self, messages: list[tuple[str, Message]]) -> None:
        to_peers: dict[str, list[Message]] | None = None
        for dst, message in messages:
            if dst.startswith(CLIENT_PREFIX):
                assert isinstance(message, Outcome), message
                self._answer_client(dst[len(CLIENT_PREFIX) :], message)
            elif dst.startswith(PEER_REPLY_PREFIX):
                respond = self._peer_replies.pop(dst, None)
                assert respond is not None, f"a reply to {dst!r}, which waits for none: {message!r}"
                respond(codec.encode(message))
            elif isinstance(message, PaxosMessage):
                if self._stream_send is not None:
                    self._stream_send(dst, message)
            else:
                if to_peers is None:
                    to_peers = {}
                to_peers.setdefault(dst, []).append(message)
        if to_peers is not None:
            # Everything for one peer in one request (wire.PEER_MANY), in the order made.
            for dst, batch in to_peers.items():
                self._send_peer(dst, batch)
        if self._watches_due:
            self._answer_watches()

    # ---- the disk (module doc) ------------------------------------------------------------

    def _hold(self, messages: list[tuple[str, Message]]) -> None:
        """Sends what does not wait (module doc) and keeps the Paxos messages until every
        record that holds them is synced."""
        kept: list[tuple[str, Message]] = [(d, m) for d, m in messages if isinstance(m, PaxosMessage)]
        if len(kept) < len(messages):
            self._send([(dst, m) for dst, m in messages if not isinstance(m, PaxosMessage)])
        if kept:
            self.counters["held_messages"] += len(kept)
            self._held.append((self._hold_through, kept))

    def _start_sync(self) -> None:
        assert self._durable is not None
        covers = self._syncing = self._written
        self.counters["syncs"] += 1
        self._durable.sync(lambda: self._on_synced(covers))

    def _on_synced(self, covers: int) -> None:
        """Everything up to write ``covers`` is durable: the messages that waited for it go,
        then the replicas that asked hear of it."""
        if self.failure is not None:
            return
        assert covers == self._syncing and covers > self._synced, (covers, self._syncing)
        previous, self._synced = self._synced, covers
        self._syncing = 0
        held = self._held
        try:
            while held and held[0][0] <= covers:
                self._send(held.popleft()[1])
            told = False
            for write in range(previous + 1, covers + 1):
                replica = self._sync_waiters.pop(write, None)
                if replica is not None and replica is self.replica:
                    replica.synced(self.timers.clock_ns())  # type: ignore[union-attr]
                    told = True
            if told:
                self._flush()
        except Exception as exc:
            self._fail(exc)
            return
        if self._written > self._synced and not self._syncing:
            self._start_sync()
        self._save_snapshot_if_synced()

    def _answer_client(self, client_id: str, outcome: Outcome) -> None:
        key = (client_id, outcome.seq)
        if self._local_waiters and outcome.status != Status.CERTIFIED:
            local = self._local_waiters.pop(key, None)
            if local is not None:
                local(outcome)
                return
        if self._awaited and outcome.status != Status.CERTIFIED and key in self._awaited:
            self._awaited.discard(key)
            watch = self._watches.get(client_id)
            if watch is not None:
                if not watch.outcomes:
                    self._watches_due.append(watch)
                watch.outcomes.append(outcome)
        waiters = self._client_waiters.get(key)
        if not waiters:
            return
        payload = codec.encode(outcome)
        if outcome.status == Status.CERTIFIED:
            remaining: list[tuple[Responder, bool]] = []
            for respond, want_certified in waiters:
                if want_certified:
                    respond(payload)
                else:
                    remaining.append((respond, want_certified))
            if remaining:
                self._client_waiters[key] = remaining
            else:
                del self._client_waiters[key]
            return
        del self._client_waiters[key]
        for respond, _ in waiters:
            respond(payload)

    def _answer_watches(self) -> None:
        """Answers the held AwaitOutcomes that heard of a final outcome in this _send."""
        due, self._watches_due = self._watches_due, []
        watches = self._watches
        for watch in due:
            if watches.get(watch.client_id) is watch:
                del watches[watch.client_id]
            watch.respond(codec.encode(Outcomes(watch.outcomes, [])))

    def _send_peer(self, address: str, messages: list[Message]) -> None:
        session = self._peer_sessions.get(address)
        if session is None or session.error is not None:
            try:
                session = self.rpc.create_session(self._peer_address(address))
            except (RpcError, OSError) as exc:
                # The session table is full (clients and peers that went away and have not
                # timed out yet), or the peer's name does not resolve (yet: on Kubernetes a
                # pod's DNS record appears after the pod): this message is lost like any
                # other, and every peer request is retransmitted by its own timer. Said once
                # per peer until a session to it is made.
                self.counters["peer_send_failures"] += 1
                if address not in self._unreachable:
                    self._unreachable.add(address)
                    log.warning(
                        "peer send failed", extra={"fields": {"peer": address, "error": repr(exc)}}
                    )
                return
            self._unreachable.discard(address)
            self._peer_sessions[address] = session

        def deliver_reply(payload: bytes) -> None:
            if not payload:
                return  # a one-way message's answer, or a request the peer refused
            try:
                reply = codec.decode(payload)
            except InvalidRequest:
                self.counters["bad_requests"] += 1
                return
            if not isinstance(reply, self.replica.REPLIES):
                self.counters["bad_requests"] += 1
                return
            self._deliver(address, reply)

        def on_reply(payload: bytes | None, error: RpcError | None) -> None:
            # A lost or failed request is retransmitted by the coordinator's own timer.
            if error is not None or not payload or self.failure is not None:
                return
            deliver_reply(payload)

        def on_replies(payload: bytes | None, error: RpcError | None) -> None:
            if error is not None or not payload or self.failure is not None:
                return
            try:
                replies = codec.decode_batch(payload, len(messages))
            except InvalidRequest:
                self.counters["bad_requests"] += 1
                return
            for reply in replies:
                if self.failure is not None:
                    return
                deliver_reply(reply)

        try:
            if len(messages) == 1:
                self.rpc.enqueue_request(session, wire.PEER, codec.encode(messages[0]), on_reply)
            else:
                self.counters["peer_batches_sent"] += 1
                payload = codec.encode_batch([codec.encode(m) for m in messages])
                self.rpc.enqueue_request(session, wire.PEER_MANY, payload, on_replies)
        except RpcError as exc:
            self.counters["peer_send_failures"] += 1
            log.info("peer send failed", extra={"fields": {"peer": address, "error": repr(exc)}})
            self._peer_sessions.pop(address, None)

    # ---- introspection -------------------------------------------------------------------

    def clients_waiting(self) -> int:
        return sum(len(waiters) for waiters in self._client_waiters.values())
