"""The SDK's transaction logic without I/O: what the client decides, once, for every driver.

Theory of operation (after h11 and aioquic: the protocol is a plain object, I/O is an
adapter). Every client call is a *generator of effects*. It yields what it needs done —

* ``Connect(address, timeout_s)``: make sure a live session to ``address`` exists, opening
  one if not; the driver sends back None, or throws the ``RpcError`` it got;
* ``Call(address, req_type, payload, timeout_s)``: one request on that session; the driver
  sends back the response bytes, or throws the ``RpcError`` (``RequestTimeout`` when
  ``timeout_s`` passed, a ``SessionError`` when the session died);
* ``ForgetSession(address)``: that session is dead; the next ``Connect`` opens a new one;
* ``Sleep(seconds)``: wait (backoff);
* ``AwaitOutcome(address, seq, timeout_s)``: the final outcome of this client's transaction
  ``seq``, answered CERTIFIED by ``address``, asked for together with every other one the
  client waits for there (``OutcomeWatch``: one ``AWAIT`` request on the wire per leader, a
  long poll); the driver sends back the ``Outcome``, or None (not known there, the request
  failed, or ``timeout_s`` passed: the caller then asks with the transaction's ``Submit``);

and returns the call's result or raises a typed error (``store.core.errors``). Two drivers
carry the effects out: the asyncio client (``store/client/client.py``) on UDP sockets, and
the simulator (``store/sim/client.py``) on virtual time under loss, duplication and
partitions. So the attempts, the conflict retries under new ids, the resends under the same
id, the session reopening, the deadlines and the meaning of every outcome are tested under
faults exactly as the SDK runs them.

Time and chance are arguments: ``clock()`` returns seconds on a monotonic scale, ``rng`` is
a ``random.Random`` (seeded in the simulator).

The rules, in one place:

* A transaction id is ``(client_id, seq)``. ``run`` draws a new ``seq`` per *attempt*: an
  ``Aborted`` (conflict) attempt is retried under a new id with exponential backoff, up to
  ``retries_max`` times. Nothing else is retried under a new id.
* Within an attempt the same ``Submit`` is sent again (same id) after a lost request or
  answer, a timed-out call or a dead session, until ``timeout_s`` after the attempt began;
  the coordinator's exactly-once table makes that safe. Errors that are not timeouts back
  off before the next send, so a failing session can never spin.
* If nothing could be sent at all (the leader unreachable from the start), the answer is
  ``Unavailable``: the transaction did not run. Once anything was sent, a missing answer is
  ``OutcomeUnknown``, carrying a ``PendingTxn`` that ``resume`` asks for again (same id).
* A caller who wants the committed result does not ask for the certified one (it would cost
  a second request); ``run_speculative`` and ``run_detailed`` ask for both. A pipelined
  caller (``run_pipelined``) hears CERTIFIED and waits for the commit with ``AwaitOutcome``:
  one request per transaction, plus one ``AWAIT`` per leader per batch of commits.
* Leaders change (docs/recovery.md). When a shard's leader is unreachable or says it no
  longer leads (``Unavailable``: the transaction did not run), the client asks the
  configuration manager's members for the cluster map (``refresh_config``) and, if a member
  answered, runs the transaction again under a new id, up to ``unavailable_retries_max``
  times. A transaction whose leader died after it was sent stays ``OutcomeUnknown``, and
  so does one sent before that later meets a non-leader's ``Unavailable`` (one that does not
  name the id): the answering process may be the leader restarted with its memory gone, and
  the earlier request may have run.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from store import wire
from store.core.errors import (
    ERROR_OF_STATUS,
    Aborted,
    InvalidRequest,
    MeridianError,
    OutcomeUnknown,
    Status,
    Unavailable,
)
from store.core.keys import PACKED_BELOW, to_stored
from store.core.oplist import OP_ARITY, OpList, check_value
from store.core.partition import Partitioner
from store.core.settings import Settings
from store.core.vclock import VectorClock
from store.protocol import codec
from store.protocol.messages import (
    AwaitOutcomes,
    ConfigReply,
    GetConfig,
    Outcome,
    Outcomes,
    SnapshotRead,
    SnapshotReply,
    Submit,
)
from store.rpc.errors import MessageTooLarge, RequestTimeout, RpcError, SessionError

Address = Hashable
T = TypeVar("T")


# ---- effects -------------------------------------------------------------------------------
# Made for every transaction and read once by the driver: plain slotted classes with their own
# __init__, compiled with this module. (As dataclasses their __init__ was the one the
# dataclasses module writes at import, interpreted: 8% of a busy client's CPU went into making
# these and TxnResult, perf, bench/micro.py, 2026-12-05.)


class _Record:
    """Equal by its fields (``_fields``) and shown by them; like the dataclasses these were,
    not hashable (TxnResult, read-only, is)."""

    __slots__ = ()

    def _fields(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self) or not isinstance(other, _Record):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        raise TypeError(f"unhashable type: {type(self).__name__!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._fields()))})"


class Connect(_Record):
    """Make sure a live session to ``address`` exists; result None, or the RpcError thrown."""

    __slots__ = ("address", "timeout_s")

    def __init__(self, address: Address, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s

    def _fields(self) -> tuple[Any, ...]:
        return (self.address, self.timeout_s)


class Call(_Record):
    """One request on the session to ``address``; result: the response bytes."""

    __slots__ = ("address", "payload", "req_type", "timeout_s")

    def __init__(self, address: Address, req_type: int, payload: bytes, timeout_s: float) -> None:
        self.address = address
        self.req_type = req_type
        self.payload = payload
        self.timeout_s = timeout_s

    def _fields(self) -> tuple[Any, ...]:
        return (self.address, self.req_type, self.payload, self.timeout_s)

    def __repr__(self) -> str:
        return (f"Call({self.address!r}, {self.req_type!r}, <{len(self.payload)} bytes>, "
                f"{self.timeout_s!r})")


class ForgetSession(_Record):
    """The session to ``address`` is dead: drop it, so that the next Connect opens anew."""

    __slots__ = ("address",)

    def __init__(self, address: Address) -> None:
        self.address = address

    def _fields(self) -> tuple[Any, ...]:
        return (self.address,)


class Sleep(_Record):
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def _fields(self) -> tuple[Any, ...]:
        return (self.seconds,)


class AwaitOutcome(_Record):
    """The final outcome of transaction ``seq`` at ``address`` (module doc)."""

    __slots__ = ("address", "seq", "timeout_s")

    def __init__(self, address: Address, seq: int, timeout_s: float) -> None:
        self.address = address
        self.seq = seq
        self.timeout_s = timeout_s

    def _fields(self) -> tuple[Any, ...]:
        return (self.address, self.seq, self.timeout_s)


Effect = Connect | Call | ForgetSession | Sleep | AwaitOutcome


class OutcomeWatch:
    """The final outcomes one client waits for, asked of each leader by one ``AWAIT``
    request at a time naming all of them: the part of ``AwaitOutcome`` both drivers share.

    ``wait`` adds a waiter (``then`` gets the ``Outcome`` or None); ``answered`` takes the
    response to the request on the wire and hands out what it says. Both return the
    payload of the request to send to that address now, or None: one is on the wire
    already, or nobody waits there. A waiter whose time is up is dropped with ``forget``;
    one the answer says nothing of is asked for again in the next request. A request that
    failed (None: timed out, lost session) lets every waiter there go with None: each
    then asks by its ``Submit``, whose failure handling (a replaced leader, a dead session,
    the deadline) is the SDK's one place for it. A commit normally takes a round trip;
    an AWAIT unanswered for ``attempt_timeout_s`` means trouble at that leader."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._waiting: dict[Address, dict[int, list[Callable[[Outcome | None], None]]]] = {}
        self._asking: set[Address] = set()
        self.requests = 0  # AWAIT requests sent (Client.stats: "await_requests")

    def wait(
        self, address: Address, seq: int, then: Callable[[Outcome | None], None]
    ) -> bytes | None:
        self._waiting.setdefault(address, {}).setdefault(seq, []).append(then)
        return self._next(address)

    def forget(
        self, address: Address, seq: int, then: Callable[[Outcome | None], None]
    ) -> None:
        waiting = self._waiting.get(address)
        thens = waiting.get(seq) if waiting is not None else None
        if thens is not None and then in thens:
            thens.remove(then)
            if not thens:
                del waiting[seq]  # type: ignore[union-attr]

    def answered(self, address: Address, answer: bytes | None) -> bytes | None:
        self._asking.discard(address)
        waiting = self._waiting.pop(address, {})
        resolved: list[tuple[Callable[[Outcome | None], None], Outcome | None]] = []
        message: object = None
        if answer is not None:
            try:
                message = codec.decode(answer)
            except InvalidRequest:
                message = None
        keep = False
        if isinstance(message, Outcomes):
            # An answer that says nothing (no server sends one) must not make a loop.
            keep = bool(message.outcomes or message.unknown)
            for outcome in message.outcomes:
                if outcome.status != Status.CERTIFIED:
                    resolved.extend((then, outcome) for then in waiting.pop(outcome.seq, ()))
            for seq in message.unknown:
                resolved.extend((then, None) for then in waiting.pop(seq, ()))
        if keep:
            if waiting:  # kept before anyone resumes: a waiter added meanwhile joins them
                self._waiting.setdefault(address, {}).update(waiting)
        else:
            # Failed, refused (an INVALID Outcome from a server that does not know AWAIT),
            # or empty: every waiter there asks with its Submit.
            resolved.extend((then, None) for thens in waiting.values() for then in thens)
        for then, final in resolved:
            then(final)
        return self._next(address)

    def _next(self, address: Address) -> bytes | None:
        waiting = self._waiting.get(address)
        if address in self._asking or not waiting:
            return None
        self._asking.add(address)
        self.requests += 1
        return codec.encode(AwaitOutcomes(self.client_id, sorted(waiting)))


Steps = Generator[Effect, Any, T]


# ---- results and settings ------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSettings:
    """The SDK's settings: a cluster file's ``[client]`` overrides them, and so do the
    keyword arguments of ``Client.connect``."""

    timeout_s: float = 5.0  # per transaction attempt, all its resends included
    attempt_timeout_s: float = 1.0  # one request before it is sent again (same id)
    retries_max: int = 20  # conflict retries of run() (each under a new transaction id)
    backoff_initial_s: float = 0.001  # first pause before a conflict's retry; doubles
    # Longest pause between retries. Conflicts last a few milliseconds (locks are released
    # at certification): under TPC-C's 14% conflict rate a 100 ms cap made retry chains of
    # 0.9 s against a p99 of 54 ms; 20 ms cut the longest to 0.36 s (docs/api.md).
    backoff_max_s: float = 0.02
    in_flight_max: int = 256  # transactions this client has outstanding at once
    connect_timeout_s: float = 2.0  # opening a session to a server
    unavailable_retries_max: int = 10  # runs again after the map changed (new leaders)


class TxnResult(_Record):
    """What a transaction returned and when: ``certified_s`` and ``committed_s`` are seconds
    from submission (``committed_s`` is None for a speculative answer). Read-only; equal (and
    hashed) by its fields.

    ``result``: what the transaction returned; ``status``: "committed" or "certified";
    ``vc``: its vector clock; ``attempts``: conflict retries + 1; ``txn``: (client id,
    sequence number), the transaction's id. (A class of its own rather than a frozen
    dataclass: see the effects above.)"""

    __slots__ = ("_attempts", "_certified_s", "_committed_s", "_result", "_status", "_txn", "_vc")

    def __init__(
        self,
        result: Any,
        status: str,
        vc: VectorClock,
        certified_s: float,
        committed_s: float | None,
        attempts: int,
        txn: tuple[str, int] = ("", 0),
    ) -> None:
        self._result = result
        self._status = status
        self._vc = vc
        self._certified_s = certified_s
        self._committed_s = committed_s
        self._attempts = attempts
        self._txn = txn

    @property
    def result(self) -> Any:
        return self._result

    @property
    def status(self) -> str:
        return self._status

    @property
    def vc(self) -> VectorClock:
        return self._vc

    @property
    def certified_s(self) -> float:
        return self._certified_s

    @property
    def committed_s(self) -> float | None:
        return self._committed_s

    @property
    def attempts(self) -> int:
        return self._attempts

    @property
    def txn(self) -> tuple[str, int]:
        return self._txn

    def _fields(self) -> tuple[Any, ...]:
        return (self._result, self._status, self._vc, self._certified_s, self._committed_s,
                self._attempts, self._txn)

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"TxnResult(result={self._result!r}, status={self._status!r}, vc={self._vc!r}, "
            f"certified_s={self._certified_s!r}, committed_s={self._committed_s!r}, "
            f"attempts={self._attempts!r}, txn={self._txn!r})"
        )


class PendingTxn(_Record):
    """A submission whose outcome is not known; ``resume`` asks for it again — of the
    leader it was sent to (``leader``): another would not know the id, and could run it
    twice (docs/recovery.md). ``sent``: it has been sent at least once, so it may have run:
    from then on a leader that cannot be reached makes the outcome unknown, never
    ``Unavailable`` (which tells the caller that it did not run and may run again)."""

    __slots__ = ("leader", "sent", "shard", "started", "submit")

    def __init__(
        self, shard: int, submit: Submit, started: float, leader: Address = None,
        sent: bool = False,
    ) -> None:
        self.shard = shard
        self.submit = submit
        self.started = started
        self.leader = leader
        self.sent = sent

    def _fields(self) -> tuple[Any, ...]:
        return (self.shard, self.submit, self.started, self.leader, self.sent)


RANGE_OPS: Final = ("scan", "keys", "count", "clear_range")


def checked_ops(ops: object, settings: Settings) -> tuple[list[Any], bool]:
    """The operation list in stored form (``stored_ops``), checked as the server's
    ``OpList`` checks it (``InvalidRequest``, before any request), and whether it scans.

    A list of gets, increments, puts and deletes of plain string keys short enough to fit
    whatever their characters (most lists) is checked here without building an ``OpList``
    (parsing one cost 12% of a busy client's CPU, perf, bench/micro.py, 2026-12-06); any
    other list is parsed by ``OpList`` itself, so every error is the server's own."""
    if type(ops) is list and len(ops) <= settings.ops_per_txn_max:
        listed: list[Any] = ops  # typed, so that the compiled loop indexes it directly
        short_key = settings.key_bytes_max // 4
        for op in listed:
            if type(op) is list:
                items: list[Any] = op
            elif type(op) is tuple:
                items = list(op)
            else:
                break
            size = len(items)
            if size < 2:
                break
            name_value = items[0]
            key_value = items[1]
            if type(name_value) is not str or type(key_value) is not str:
                break
            name: str = name_value
            key: str = key_value
            if key < PACKED_BELOW or len(key) > short_key:
                break
            if size == 2:
                if name != "get" and name != "delete":  # noqa: PLR1714 (str compares, compiled)
                    break
            elif size == 3:
                if name == "increment":
                    if type(items[2]) is not int:
                        break
                elif name == "put":
                    check_value(items[2], settings)  # OpList's own check of this operation
                else:
                    break
            else:
                break
        else:
            return list(listed), False
    stored = stored_ops(ops)
    return stored, bool(OpList(stored, settings).batch.scans)


def stored_ops(ops: object) -> list[Any]:
    """The operation list with its keys in stored form (tuples packed): what the server and
    the router see. Anything malformed is left as it is for ``OpList`` to name (a copy of
    each well-formed operation is made, so the caller's lists are never changed)."""
    if type(ops) is not list:
        raise InvalidRequest("operations must be a list")
    stored: list[Any] = []
    for op in ops:
        if type(op) is not list and type(op) is not tuple:
            stored.append(op)
            continue
        items = list(op)
        if not items or type(items[0]) is not str or items[0] not in OP_ARITY:
            stored.append(op)  # OpList says what is wrong with it
            continue
        if len(items) > 1 and type(items[1]) is tuple:
            items[1] = to_stored(items[1])
        if items[0] in RANGE_OPS and len(items) > 2 and type(items[2]) is tuple:
            items[2] = to_stored(items[2])
        stored.append(items)
    return stored


class ClientProtocol:
    """The client's side of the wire protocol for one client id (see the module doc)."""

    def __init__(
        self,
        client_id: str,
        leaders: Sequence[Address],
        partitioner: Partitioner,
        settings: ClientSettings,
        clock: Callable[[], float],
        rng: random.Random,
        cm_members: Sequence[Address] = (),
        request_bytes_max: int = 8 << 20,
    ) -> None:
        """``request_bytes_max``: the RPC core's message limit (``[rpc] msg_size_max``); a
        transaction whose request is larger is refused before anything is sent."""
        self.client_id = client_id
        self.request_bytes_max = request_bytes_max
        self.leaders = list(leaders)
        self.cm_members = list(cm_members)
        self.epoch = -1  # of the cluster map the leaders come from (-1: the cluster file's)
        self._config_ids = itertools.count(1)
        self.partitioner = partitioner
        # What ``run`` did, for ``Client.stats``: transactions, attempts (each under a new
        # id), and the retries of conflicts and of a leader that had moved.
        self.stats = {"transactions": 0, "attempts": 0, "conflict_retries": 0, "unavailable_retries": 0}
        self.settings = settings
        self.clock = clock
        self.rng = rng
        self._seq = itertools.count(1)
        self._round_robin = itertools.count()
        self.watch = OutcomeWatch(client_id)

    # ---- routing -------------------------------------------------------------------------

    def shard_for(self, route: str | int | None) -> int:
        """The coordinator's shard: a key's shard, a shard number, or round-robin."""
        shards = len(self.leaders)
        if route is None:
            return next(self._round_robin) % shards
        if isinstance(route, int):
            if not 0 <= route < shards:
                raise InvalidRequest(f"no shard {route}")
            return route
        return self.partitioner.shard_of(route)

    def new_pending(self, shard: int, procedure: str, args: list[Any]) -> PendingTxn:
        submit = Submit(self.client_id, next(self._seq), procedure, args, True)
        return PendingTxn(shard, submit, self.clock(), self.leaders[shard])

    # ---- transactions --------------------------------------------------------------------

    def run(
        self, shard: int, procedure: str, args: list[Any], speculative: bool, detailed: bool
    ) -> Steps[TxnResult]:
        """Runs a transaction, retrying conflicts under new ids (``Client.run`` and kin)."""
        backoff = self.settings.backoff_initial_s
        unavailable = 0
        self.stats["transactions"] += 1
        for attempt in itertools.count(1):
            pending = self.new_pending(shard, procedure, args)
            self.stats["attempts"] += 1
            try:
                return (yield from self.attempt(pending, speculative, attempt, detailed))
            # One name per except clause: compiled (setup.py), a name bound by two clauses
            # of different types is typed by the first.
            except Aborted as aborted:
                if attempt > self.settings.retries_max:
                    aborted.attempts = attempt
                    raise
                self.stats["conflict_retries"] += 1
            except Unavailable as unreachable:
                unavailable += 1
                if unavailable > self.settings.unavailable_retries_max or not self.cm_members:
                    unreachable.attempts = attempt
                    raise
                if not (yield from self.refresh_config()):
                    unreachable.attempts = attempt
                    raise
                self.stats["unavailable_retries"] += 1
            except MeridianError as failed:
                failed.attempts = attempt
                raise
            yield Sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, self.settings.backoff_max_s)
        raise AssertionError("unreachable")

    def refresh_config(self) -> Steps[bool]:
        """Asks the configuration manager's members, in turn, for the cluster map; adopts
        it if newer. True if a member answered."""
        for member in self.cm_members:
            try:
                yield Connect(member, self.settings.connect_timeout_s)
                request = GetConfig(next(self._config_ids))
                answer = yield Call(
                    member, wire.CONFIG, codec.encode(request), self.settings.attempt_timeout_s
                )
                reply = codec.decode(answer)
            except (RpcError, InvalidRequest) as exc:
                if isinstance(exc, SessionError):
                    yield ForgetSession(member)
                continue
            if not isinstance(reply, ConfigReply) or reply.req_id != request.req_id:
                continue
            cluster_map = reply.cluster_map
            if cluster_map.shards == len(self.leaders) and cluster_map.epoch > self.epoch:
                self.epoch = cluster_map.epoch
                self.leaders = list(cluster_map.leaders)
            return True
        return False

    def run_pipelined(
        self, shard: int, procedure: str, args: list[Any]
    ) -> Steps[tuple[TxnResult, PendingTxn | None]]:
        """Returns at certification, with the pending transaction whose commit
        ``await_commit`` waits for (None when the answer was already COMMITTED)."""
        backoff = self.settings.backoff_initial_s
        for attempt in itertools.count(1):
            pending = self.new_pending(shard, procedure, args)
            outcome = yield from self.exchange(pending, want_certified=True)
            certified_s = self.clock() - pending.started
            status = Status(outcome.status)
            if status == Status.CERTIFIED:
                certified = TxnResult(
                    outcome.result, "certified", outcome.vc, certified_s, None, attempt,
                    _txn_id(pending),
                )
                return certified, pending
            if status == Status.COMMITTED:
                committed = TxnResult(
                    outcome.result, "committed", outcome.vc, certified_s, certified_s, attempt,
                    _txn_id(pending),
                )
                return committed, None
            if status != Status.ABORTED or attempt > self.settings.retries_max:
                raise _error(outcome)
            yield Sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, self.settings.backoff_max_s)
        raise AssertionError("unreachable")

    def await_commit(self, pending: PendingTxn, certified: TxnResult) -> Steps[TxnResult]:
        """Waits for the final outcome of a transaction answered CERTIFIED: with the
        client's others there (``AwaitOutcome``), or, if that says nothing of it, by its
        ``Submit`` again."""
        outcome: Outcome | None = None
        remaining = pending.started + self.settings.timeout_s - self.clock()
        if remaining > 0:
            address = pending.leader if pending.leader is not None else self.leaders[pending.shard]
            outcome = yield AwaitOutcome(address, pending.submit.seq, remaining)
        if outcome is None:
            outcome = yield from self.exchange(pending, want_certified=False)
        if outcome.status != Status.COMMITTED:
            raise _error(outcome)
        result = certified.result if outcome.result is None else outcome.result
        return TxnResult(
            result, "committed", outcome.vc, certified.certified_s,
            self.clock() - pending.started, certified.attempts, _txn_id(pending),
        )

    def resume(self, pending: PendingTxn, speculative: bool) -> Steps[TxnResult]:
        """Asks again for a transaction whose outcome was unknown (same id: never twice)."""
        pending.started = self.clock()
        pending.sent = True  # it may have run: an unreachable leader is no proof it did not
        return (yield from self.attempt(pending, speculative, 1, detailed=True))

    def attempt(
        self, pending: PendingTxn, speculative: bool, attempt: int, detailed: bool
    ) -> Steps[TxnResult]:
        """One transaction id to its answer: the result, or the typed error of its outcome.

        One request unless the caller takes the speculative answer: the committed answer
        says how long it waited after certification (``Outcome.waited_ns``), which gives
        ``certified_s`` without a CERTIFIED answer first. (``detailed`` is kept for the
        callers' sake: every result now carries both times.)"""
        outcome = yield from self.exchange(pending, want_certified=speculative)
        certified_s = self.clock() - pending.started
        if outcome.status == Status.CERTIFIED:
            if speculative:
                return TxnResult(
                    outcome.result, "certified", outcome.vc, certified_s, None, attempt,
                    _txn_id(pending),
                )
            result = outcome.result
            outcome = yield from self.exchange(pending, want_certified=False)
            if outcome.status == Status.COMMITTED and outcome.result is None:
                outcome.result = result
        if outcome.status == Status.COMMITTED:
            committed_s = self.clock() - pending.started
            certified_s = min(certified_s, max(0.0, committed_s - outcome.waited_ns / 1e9))
            return TxnResult(
                outcome.result, "committed", outcome.vc, certified_s, committed_s, attempt,
                _txn_id(pending),
            )
        raise _error(outcome)

    def exchange(self, pending: PendingTxn, want_certified: bool) -> Steps[Outcome]:
        """Sends the submission (again, under the same id) until an answer or the deadline."""
        settings = self.settings
        deadline = pending.started + settings.timeout_s
        original = pending.submit
        submit = Submit(
            original.client_id, original.seq, original.procedure, original.args, want_certified
        )
        payload = codec.encode(submit)
        if len(payload) > self.request_bytes_max:
            # Nothing was sent and nothing will run: say so at once, not after the timeout.
            raise InvalidRequest(
                f"the transaction's request is {len(payload):,} bytes, more than the RPC "
                f"message limit of {self.request_bytes_max:,} bytes ([rpc] msg_size_max)"
            )
        address = pending.leader if pending.leader is not None else self.leaders[pending.shard]
        sent = pending.sent
        backoff = settings.backoff_initial_s
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise self._unknown(pending, "no answer within the timeout")
            try:
                # Once sent, reconnecting is one more attempt: no longer than one.
                budget = min(remaining, settings.attempt_timeout_s) if sent else remaining
                yield from self._connect(pending.shard, address, budget)
            except Unavailable:
                if not sent:
                    raise
                if self.cm_members:
                    if (yield from self._replaced(pending.shard, address)):
                        raise self._unknown(
                            pending, f"its leader {address} was replaced in epoch {self.epoch}"
                        ) from None
                    continue  # the map still names it: keep trying until the deadline
                raise self._unknown(pending, "the leader became unreachable") from None
            sent_before = sent
            sent = pending.sent = True
            try:
                answer = yield Call(
                    address, wire.SUBMIT, payload, min(remaining, settings.attempt_timeout_s)
                )
            except MessageTooLarge as too_large:  # the limit differs from request_bytes_max
                raise InvalidRequest(f"the transaction's request is too large: {too_large}") from None
            except RpcError as exc:
                # A lost request or answer, or a dead session (the leader was slow, restarted
                # or unreachable): ask again under the same id while time remains; the
                # server's exactly-once table makes that safe. Unless the configuration
                # manager has replaced that leader meanwhile: then its answer will never
                # come, and waiting out the deadline would only delay the caller.
                if isinstance(exc, SessionError):
                    yield ForgetSession(address)
                if self.cm_members and (yield from self._replaced(pending.shard, address)):
                    raise self._unknown(
                        pending, f"its leader {address} was replaced in epoch {self.epoch}"
                    ) from None
                if not isinstance(exc, RequestTimeout):
                    yield Sleep(min(backoff, max(0.0, deadline - self.clock())))
                    backoff = min(backoff * 2, settings.backoff_max_s)
                continue
            try:
                outcome = codec.decode(answer)
            except InvalidRequest as undecodable:
                raise self._unknown(pending, f"undecodable answer: {undecodable}") from None
            if not isinstance(outcome, Outcome) or outcome.seq not in (original.seq, 0):
                raise self._unknown(pending, "unexpected answer")
            if outcome.status == Status.UNAVAILABLE and outcome.seq == 0 and sent_before:
                # A process that is no leader answered without looking at the id: "not run"
                # speaks for this request only. An earlier one may have run, at the leader
                # this process was before it restarted and forgot it. (A coordinator's own
                # Unavailable names the id and knows it did not run.)
                raise self._unknown(pending, f"{address} answered: {outcome.detail}")
            return outcome

    def _replaced(self, shard: int, address: Address) -> Steps[bool]:
        """Asks the configuration manager for the map: does another replica lead ``shard``
        now?"""
        yield from self.refresh_config()
        return bool(self.leaders[shard] != address)

    def _connect(self, shard: int, address: Address, remaining_s: float) -> Steps[None]:
        timeout = max(0.01, min(self.settings.connect_timeout_s, remaining_s))
        try:
            yield Connect(address, timeout)
        except RpcError as exc:
            raise Unavailable(f"shard {shard} leader {address} unreachable: {exc}") from None

    def _unknown(self, pending: PendingTxn, why: str) -> OutcomeUnknown:
        submit = pending.submit
        error = OutcomeUnknown(f"transaction {submit.client_id}/{submit.seq}: {why}")
        error.txn = pending  # type: ignore[attr-defined]
        return error

    # ---- follower snapshots --------------------------------------------------------------

    def snapshot(
        self, shard: int, address: Address, request: SnapshotRead
    ) -> Steps[SnapshotReply]:
        """One snapshot read at the follower ``address`` of ``shard``."""
        try:
            yield Connect(address, self.settings.connect_timeout_s)
            answer = yield Call(
                address, wire.SNAPSHOT, codec.encode(request), self.settings.timeout_s
            )
            reply = codec.decode(answer)
        except (RpcError, InvalidRequest) as exc:
            if isinstance(exc, SessionError):
                yield ForgetSession(address)
            raise Unavailable(f"follower {address} of shard {shard}: {exc}") from None
        if isinstance(reply, Outcome):  # refused: rejoining, or not a follower (any more)
            raise _error(reply)
        if not isinstance(reply, SnapshotReply) or reply.req_id != request.req_id:
            raise Unavailable(f"follower {address} of shard {shard} answered oddly")
        return reply


def _txn_id(pending: PendingTxn) -> tuple[str, int]:
    return pending.submit.client_id, pending.submit.seq


def _error(outcome: Outcome) -> Exception:
    status = Status(outcome.status)
    return ERROR_OF_STATUS.get(status, InvalidRequest)(outcome.detail or status.name.lower())
