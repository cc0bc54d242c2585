"""The client SDK.

Outcomes. A transaction is **certified** when the shard leaders have decided it: its writes
are visible to later transactions, but it is *speculative* — failure recovery may still roll
it back, and everything that read from it. It is **committed** when it and everything it
depends on is durable. ``run`` returns once committed. ``run_speculative`` returns at
certification: its result MAY BE ROLLED BACK, and a caller that acts on it must be ready for
that. ``run_detailed`` returns both times.

Errors (all from ``store.core.errors``):

* ``Aborted``: a conflict; nothing was written. ``run`` retries these itself, with backoff,
  up to ``retries_max`` times, each retry under a new transaction id.
* ``UserAborted``: the procedure called ``tx.abort``; ``ProcedureFailed``: it raised;
  ``InvalidRequest`` / ``UnknownProcedure``: bad input. Nothing was written; not retried.
* ``Unavailable``: the shard's leader could not be reached; the transaction did not run.
* ``OutcomeUnknown``: no answer before ``timeout_s``, after the request may have run. It is
  safe to call ``resume(exc.txn)``: the same transaction id is sent again, and the server's
  exactly-once table returns the first outcome instead of running it twice.
* ``RolledBack``: a certified transaction was rolled back by recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from store import config as config_module
from store import wire
from store.config import MERIDIAN_RPC_SETTINGS, ClusterConfig
from store.core import codec
from store.core.errors import (
    ERROR_OF_STATUS,
    Aborted,
    InvalidRequest,
    OutcomeUnknown,
    Status,
    Unavailable,
)
from store.core.follower import SnapshotRead, SnapshotReply
from store.core.messages import Outcome, Submit
from store.core.partition import Partitioner
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import OPS_PROCEDURE, check_ops
from store.core.vclock import VectorClock
from store.rpc import Nexus, RpcError, RpcSettings, Session, SessionError
from store.rpc.aio import Rpc, new_event_loop


@dataclass(frozen=True)
class TxnResult:
    """What a transaction returned and when: ``certified_s`` and ``committed_s`` are seconds
    from submission (``committed_s`` is None for a speculative answer)."""

    result: Any
    status: str  # "committed" or "certified"
    vc: VectorClock
    certified_s: float
    committed_s: float | None
    attempts: int


@dataclass(frozen=True)
class SnapshotResult:
    """A follower's snapshot of keys of one shard: committed data only, possibly stale.

    ``vw`` is the vector watermark the snapshot is at: it shows exactly the transactions
    whose clocks are at or below it. ``lag`` is how far the follower's watermark of its shard
    trails the leader's (in counter values) when the client asked for it (None if not).
    """

    values: dict[str, Any]
    scans: list[list[tuple[str, Any]]]
    shard: int
    region: str
    vw: VectorClock
    lag: int | None


@dataclass
class PendingTxn:
    """A submission whose outcome is not known; ``Client.resume`` asks for it again."""

    shard: int
    submit: Submit
    started: float


@dataclass(frozen=True)
class ClientSettings:
    timeout_s: float = 5.0  # per transaction, all its retransmissions included
    attempt_timeout_s: float = 1.0  # one request before it is sent again (same id)
    retries_max: int = 20  # conflict retries of run()
    backoff_initial_s: float = 0.001
    backoff_max_s: float = 0.1
    in_flight_max: int = 256  # transactions this client has outstanding at once
    connect_timeout_s: float = 2.0


class Client:
    """An asyncio client of one Meridian cluster. Create it with ``Client.connect``."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        partitioner: Partitioner,
        settings: ClientSettings,
        client_id: str | None = None,
        rpc_settings: RpcSettings = MERIDIAN_RPC_SETTINGS,
    ) -> None:
        self._addresses = list(addresses)
        self._config: ClusterConfig | None = None
        self._replica_sessions: dict[tuple[str, int], Session] = {}
        self._snapshot_ids = itertools.count(1)
        self.partitioner = partitioner
        self.settings = settings
        self.client_id = client_id or uuid.uuid4().hex[:16]
        self._rpc = Rpc.udp(Nexus(), "127.0.0.1", 0, settings=rpc_settings)
        self._sessions: dict[int, Session] = {}
        self._seq = itertools.count(1)
        self._round_robin = itertools.count()
        self._in_flight = asyncio.Semaphore(settings.in_flight_max)
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self._closed = False

    @classmethod
    async def connect(
        cls,
        cluster: str | Path | ClusterConfig,
        *,
        client_id: str | None = None,
        settings: ClientSettings | None = None,
        **overrides: Any,
    ) -> Client:
        """Connects to a cluster given its cluster file (or a parsed one)."""
        config = cluster if isinstance(cluster, ClusterConfig) else config_module.load(cluster)
        base = ClientSettings(**{**config.client, **overrides}) if settings is None else settings
        client = cls(
            [s.leader for s in config.shards], config.partitioner(), base, client_id, config.rpc
        )
        client._config = config
        for shard in range(len(client._addresses)):
            # A shard that is down now fails its transactions until it is back.
            with contextlib.suppress(Unavailable):
                await client._session(shard)
        return client

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._rpc.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- transactions --------------------------------------------------------------------

    async def run(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        """Runs a registered procedure; returns its result once the transaction is committed.

        ``route`` picks the coordinator: a key (its shard's leader) or a shard number; by
        default a key-less call goes round-robin.
        """
        return (await self._run(procedure, list(args), route, speculative=False)).result

    async def run_speculative(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        """Returns the result as soon as the transaction is certified.

        The result MAY BE ROLLED BACK: certification is speculative until the transaction is
        committed (durable); failure recovery can undo it and everything that read from it.
        """
        return (await self._run(procedure, list(args), route, speculative=True)).result

    async def run_detailed(
        self, procedure: str, *args: Any, route: str | int | None = None
    ) -> TxnResult:
        """Runs to commit and reports both the certified and the committed latency."""
        return await self._run(procedure, list(args), route, speculative=False, detailed=True)

    def transaction(self) -> TxnBuilder:
        """A builder of a transaction made of built-in operations."""
        return TxnBuilder(self)

    async def run_ops(self, ops: list[list[Any]], *, route: str | int | None = None) -> list[Any]:
        check_ops(ops, DEFAULT_SETTINGS)
        if route is None and ops:
            route = ops[0][1]
        result: list[Any] = (await self._run(OPS_PROCEDURE, [ops], route, speculative=False)).result
        return result

    async def run_ops_detailed(
        self, ops: list[list[Any]], *, route: str | int | None = None
    ) -> TxnResult:
        """``run_ops`` with latencies and the number of attempts (conflict retries + 1)."""
        check_ops(ops, DEFAULT_SETTINGS)
        if route is None and ops:
            route = ops[0][1]
        return await self._run(OPS_PROCEDURE, [ops], route, speculative=False, detailed=True)

    async def get(self, key: str) -> Any:
        return (await self.run_ops([["get", key]]))[0]

    async def put(self, key: str, value: Any) -> None:
        await self.run_ops([["put", key, value]])

    async def delete(self, key: str) -> None:
        await self.run_ops([["delete", key]])

    async def scan(self, lo: str, hi: str, limit: int = 100) -> list[tuple[str, Any]]:
        found = (await self.run_ops([["scan", lo, hi, limit]]))[0]
        return [(key, value) for key, value in found]

    async def status(self, replicas: bool = False) -> list[dict[str, Any] | None]:
        """Each shard leader's health and counters (None for one that does not answer);
        with ``replicas``, every follower's too, after the leaders."""
        targets = list(self._addresses)
        if replicas and self._config is not None:
            targets = [node.rpc for node in self._config.nodes()]
        statuses: list[dict[str, Any] | None] = []
        for address in targets:
            try:
                session = await self._replica_session(address)
                payload = await self._rpc.call(session, wire.STATUS, b"", timeout=self.settings.attempt_timeout_s)
                statuses.append(msgpack.unpackb(payload))
            except (RpcError, Unavailable):
                statuses.append(None)
        return statuses

    async def read_snapshot(
        self,
        keys: Sequence[str] = (),
        *,
        scans: Sequence[tuple[str, str, int]] = (),
        region: str | None = None,
        with_lag: bool = False,
    ) -> SnapshotResult:
        """A read-only snapshot of keys of ONE shard, served by its follower in ``region``.

        Shows only committed transactions, at the follower's vector watermark: consistent
        within the shard, and as stale as replication to that region is (``vw`` says where
        it is; ``with_lag`` also asks the leader how far behind that is).
        """
        if self._config is None:
            raise InvalidRequest("snapshot reads need a cluster file (followers)")
        shards = {self.partitioner.shard_of(key) for key in keys}
        for lo, hi, _ in scans:
            shards.update(self.partitioner.shards_of_range(lo, hi))
        if len(shards) != 1:
            raise InvalidRequest("a snapshot read covers the keys of one shard")
        shard = shards.pop()
        followers = self._config.shards[shard].followers
        if not followers:
            raise InvalidRequest(f"shard {shard} has no followers")
        region = region or self._config.client.get("region") or followers[0][0]
        address = next((a for r, a in followers if r == region), None)
        if address is None:
            raise InvalidRequest(f"shard {shard} has no follower in region {region!r}")
        request = SnapshotRead(next(self._snapshot_ids), list(keys), [tuple(s) for s in scans])
        try:
            session = await self._replica_session(address)
            answer = await self._rpc.call(
                session, wire.SNAPSHOT, codec.encode(request), timeout=self.settings.timeout_s
            )
            reply = codec.decode(answer)
        except (RpcError, InvalidRequest) as exc:
            raise Unavailable(f"follower {address} of shard {shard}: {exc}") from None
        if not isinstance(reply, SnapshotReply) or reply.req_id != request.req_id:
            raise Unavailable(f"follower {address} of shard {shard} answered oddly")
        lag = None
        if with_lag:
            leader_status = (await self.status())[shard]
            if leader_status is not None:
                lag = max(0, int(leader_status["watermark"]) - reply.vw[shard])
        return SnapshotResult(
            dict(zip(keys, reply.values, strict=True)), reply.scans, shard, region, reply.vw, lag
        )

    async def _replica_session(self, address: tuple[str, int]) -> Session:
        session = self._replica_sessions.get(address)
        if session is not None and session.error is None:
            return session
        try:
            session = await self._rpc.connect(address, timeout=self.settings.connect_timeout_s)
        except RpcError as exc:
            raise Unavailable(f"{address[0]}:{address[1]} unreachable: {exc}") from None
        self._replica_sessions[address] = session
        return session

    # ---- internals -----------------------------------------------------------------------

    def _shard_for(self, route: str | int | None) -> int:
        shards = len(self._addresses)
        if route is None:
            return next(self._round_robin) % shards
        if isinstance(route, int):
            if not 0 <= route < shards:
                raise InvalidRequest(f"no shard {route}")
            return route
        return self.partitioner.shard_of(route)

    async def _session(self, shard: int, timeout_s: float | None = None) -> Session:
        session = self._sessions.get(shard)
        if session is not None and session.error is None:
            return session
        timeout = self.settings.connect_timeout_s
        if timeout_s is not None:
            timeout = max(0.01, min(timeout, timeout_s))
        try:
            session = await self._rpc.connect(self._addresses[shard], timeout=timeout)
        except RpcError as exc:
            raise Unavailable(f"shard {shard} leader {self._addresses[shard]} unreachable: {exc}") from None
        self._sessions[shard] = session
        return session

    async def _run(
        self,
        procedure: str,
        args: list[Any],
        route: str | int | None,
        speculative: bool,
        detailed: bool = False,
    ) -> TxnResult:
        if self._closed:
            raise Unavailable("client closed")
        shard = self._shard_for(route)
        backoff = self.settings.backoff_initial_s
        async with self._in_flight:
            for attempt in range(1, self.settings.retries_max + 2):
                submit = Submit(self.client_id, next(self._seq), procedure, args, True)
                pending = PendingTxn(shard, submit, time.monotonic())
                try:
                    return await self._attempt(pending, speculative, attempt, detailed)
                except Aborted:
                    if attempt > self.settings.retries_max:
                        raise
                await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, self.settings.backoff_max_s)
        raise AssertionError("unreachable")

    async def run_pipelined(
        self, procedure: str, *args: Any, route: str | int | None = None
    ) -> tuple[TxnResult, asyncio.Future[TxnResult]]:
        """Returns as soon as the transaction is certified, with a future of its commit.

        The certified result MAY BE ROLLED BACK until the future resolves (Mako's workers run
        closed loops this way: the next transaction as soon as this one is certified). With
        speculation off on the servers, certification waits for commit and both arrive
        together.
        """
        if self._closed:
            raise Unavailable("client closed")
        shard = self._shard_for(route)
        backoff = self.settings.backoff_initial_s
        loop = asyncio.get_running_loop()
        for attempt in range(1, self.settings.retries_max + 2):
            submit = Submit(self.client_id, next(self._seq), procedure, list(args), True)
            pending = PendingTxn(shard, submit, time.monotonic())
            outcome = await self._exchange(pending, want_certified=True)
            certified_s = time.monotonic() - pending.started
            status = Status(outcome.status)
            if status == Status.CERTIFIED:
                certified = TxnResult(outcome.result, "certified", outcome.vc, certified_s, None, attempt)
                return certified, loop.create_task(
                    self._await_commit(pending, outcome.result, certified_s, attempt)
                )
            if status == Status.COMMITTED:
                committed = TxnResult(
                    outcome.result, "committed", outcome.vc, certified_s, certified_s, attempt
                )
                future: asyncio.Future[TxnResult] = loop.create_future()
                future.set_result(committed)
                return committed, future
            if status != Status.ABORTED or attempt > self.settings.retries_max:
                raise ERROR_OF_STATUS.get(status, InvalidRequest)(outcome.detail or status.name)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))
            backoff = min(backoff * 2, self.settings.backoff_max_s)
        raise AssertionError("unreachable")

    async def _await_commit(
        self, pending: PendingTxn, result: Any, certified_s: float, attempt: int
    ) -> TxnResult:
        outcome = await self._exchange(pending, want_certified=False)
        if outcome.status != Status.COMMITTED:
            status = Status(outcome.status)
            raise ERROR_OF_STATUS.get(status, InvalidRequest)(outcome.detail or status.name)
        return TxnResult(
            result if outcome.result is None else outcome.result, "committed", outcome.vc,
            certified_s, time.monotonic() - pending.started, attempt,
        )

    async def resume(self, pending: PendingTxn, speculative: bool = False) -> TxnResult:
        """Asks again for a transaction whose outcome was unknown (same id: never runs twice)."""
        pending.started = time.monotonic()
        return await self._attempt(pending, speculative, 1, detailed=True)

    async def _attempt(
        self, pending: PendingTxn, speculative: bool, attempt: int, detailed: bool
    ) -> TxnResult:
        # Asking for the certified answer costs a second round trip for the committed one,
        # so a caller who only wants the committed result does not ask.
        outcome = await self._exchange(pending, want_certified=speculative or detailed)
        certified_s = time.monotonic() - pending.started
        if outcome.status == Status.CERTIFIED:
            if speculative:
                return TxnResult(outcome.result, "certified", outcome.vc, certified_s, None, attempt)
            result = outcome.result
            outcome = await self._exchange(pending, want_certified=False)
            if outcome.status == Status.COMMITTED:
                outcome.result = result if outcome.result is None else outcome.result
        if outcome.status == Status.COMMITTED:
            committed_s = time.monotonic() - pending.started
            return TxnResult(
                outcome.result, "committed", outcome.vc, min(certified_s, committed_s), committed_s, attempt
            )
        error = ERROR_OF_STATUS.get(Status(outcome.status), InvalidRequest)
        raise error(outcome.detail or Status(outcome.status).name.lower())

    async def _exchange(self, pending: PendingTxn, want_certified: bool) -> Outcome:
        """Sends the submission (again, same id) until an answer or the deadline."""
        deadline = pending.started + self.settings.timeout_s
        submit = Submit(
            pending.submit.client_id, pending.submit.seq, pending.submit.procedure,
            pending.submit.args, want_certified,
        )
        payload = codec.encode(submit)
        sent = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._unknown(pending, "no answer within the timeout")
            try:
                session = await self._session(pending.shard, timeout_s=remaining)
            except Unavailable:
                if sent:
                    raise self._unknown(pending, "the leader became unreachable") from None
                raise
            try:
                sent = True
                answer = await self._rpc.call(
                    session, wire.SUBMIT, payload,
                    timeout=min(remaining, self.settings.attempt_timeout_s),
                )
            except SessionError:
                # The session died (the leader was slow or restarted): open a new one and
                # ask again under the same id while time remains; the server's exactly-once
                # table makes that safe.
                self._sessions.pop(pending.shard, None)
                continue
            except RpcError:
                continue  # a lost request or answer: send it again under the same id
            try:
                outcome = codec.decode(answer)
            except InvalidRequest as exc:
                raise self._unknown(pending, f"undecodable answer: {exc}") from None
            if not isinstance(outcome, Outcome) or outcome.seq not in (pending.submit.seq, 0):
                raise self._unknown(pending, "unexpected answer")
            return outcome

    def _unknown(self, pending: PendingTxn, why: str) -> OutcomeUnknown:
        error = OutcomeUnknown(f"transaction {pending.submit.client_id}/{pending.submit.seq}: {why}")
        error.txn = pending  # type: ignore[attr-defined]
        return error


class TxnBuilder:
    """Collects built-in operations; ``await commit()`` runs them as one transaction.

        results = await client.transaction().get("t/a").put("t/b", 1).increment("t/c").commit()
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self.ops: list[list[Any]] = []

    def get(self, key: str) -> TxnBuilder:
        self.ops.append(["get", key])
        return self

    def put(self, key: str, value: Any) -> TxnBuilder:
        self.ops.append(["put", key, value])
        return self

    def delete(self, key: str) -> TxnBuilder:
        self.ops.append(["delete", key])
        return self

    def scan(self, lo: str, hi: str, limit: int = 100) -> TxnBuilder:
        self.ops.append(["scan", lo, hi, limit])
        return self

    def append(self, key: str, item: Any) -> TxnBuilder:
        self.ops.append(["append", key, item])
        return self

    def increment(self, key: str, delta: int = 1) -> TxnBuilder:
        self.ops.append(["increment", key, delta])
        return self

    def compare_and_set(self, key: str, expected: Any, new: Any) -> TxnBuilder:
        self.ops.append(["cas", key, expected, new])
        return self

    async def commit(self) -> list[Any]:
        return await self._client.run_ops(self.ops)


class BlockingClient:
    """The SDK without asyncio: each call blocks until its answer.

        with BlockingClient.connect("cluster/local.toml") as client:
            client.put("acct/alice", 100)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Client) -> None:
        self._loop = loop
        self._thread = thread
        self._client = client

    @classmethod
    def connect(cls, cluster: str | Path | ClusterConfig, **kwargs: Any) -> BlockingClient:
        loop = new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="meridian-client", daemon=True)
        thread.start()
        future = asyncio.run_coroutine_threadsafe(_connect_in_loop(cluster, kwargs), loop)
        return cls(loop, thread, future.result())

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def run(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        return self._call(self._client.run(procedure, *args, route=route))

    def run_speculative(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        """Returns at certification: the result MAY BE ROLLED BACK (see ``Client``)."""
        return self._call(self._client.run_speculative(procedure, *args, route=route))

    def run_detailed(self, procedure: str, *args: Any, route: str | int | None = None) -> TxnResult:
        return self._call(self._client.run_detailed(procedure, *args, route=route))

    def run_ops(self, ops: list[list[Any]]) -> list[Any]:
        return self._call(self._client.run_ops(ops))

    def get(self, key: str) -> Any:
        return self._call(self._client.get(key))

    def put(self, key: str, value: Any) -> None:
        self._call(self._client.put(key, value))

    def delete(self, key: str) -> None:
        self._call(self._client.delete(key))

    def scan(self, lo: str, hi: str, limit: int = 100) -> list[tuple[str, Any]]:
        return self._call(self._client.scan(lo, hi, limit))

    def status(self) -> list[dict[str, Any] | None]:
        return self._call(self._client.status())

    def close(self) -> None:
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _connect_in_loop(cluster: Any, kwargs: dict[str, Any]) -> Client:
    return await Client.connect(cluster, **kwargs)
