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
import collections
import concurrent.futures
import contextlib
import itertools
import os
import random
import threading
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Self, TypeVar

import msgpack

from store import config as config_module
from store import wire
from store.client.protocol import (
    AwaitOutcome,
    Call,
    ClientProtocol,
    ClientSettings,
    Connect,
    ForgetSession,
    PendingTxn,
    Sleep,
    Steps,
    TxnResult,
    checked_ops,
)
from store.config import MERIDIAN_RPC_SETTINGS, ClusterConfig
from store.core.errors import InvalidRequest, Unavailable
from store.core.keys import Element, Key, from_stored, to_stored, tuple_of
from store.core.keys import prefix_range as _prefix_range
from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner, clock_marks, table_end
from store.core.settings import DEFAULT_SETTINGS
from store.core.vclock import VectorClock
from store.protocol.messages import Outcome, SnapshotRead
from store.rpc import (
    Nexus,
    PeerUnavailable,
    RpcError,
    RpcSettings,
    Session,
    SessionClosed,
)
from store.rpc.aio import Rpc, new_event_loop
from store.rpc.udp import source_address_toward

__all__ = ["BlockingClient", "BlockingTxnBuilder", "Client", "ClientSettings", "PendingTxn", "SnapshotResult",
           "TxnBuilder", "TxnResult"]

T = TypeVar("T")

# Keys per transaction of ``truncate`` (below what one transaction may write).
TRUNCATE_BATCH = 1000


@dataclass(frozen=True)
class SnapshotResult:
    """A follower's snapshot of keys of one shard: committed data only, possibly stale.

    ``vw`` is the vector watermark the snapshot is at: it shows exactly the transactions
    whose clocks are at or below it. ``lag`` is how far the follower's watermark of its shard
    trails the leader's (in counter values) when the client asked for it (None if not).
    """

    values: dict[Key, Any]
    scans: list[list[tuple[Key, Any]]]
    shard: int
    region: str
    vw: VectorClock
    lag: int | None


class Client:
    """An asyncio client of one Meridian cluster. Create it with ``Client.connect``.

    The transaction logic is ``store.client.protocol.ClientProtocol``; this class carries
    out its effects on an RPC endpoint (UDP) and the event loop.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        partitioner: Partitioner,
        settings: ClientSettings,
        client_id: str | None = None,
        rpc_settings: RpcSettings = MERIDIAN_RPC_SETTINGS,
        cm_members: Sequence[tuple[str, int]] = (),
    ) -> None:
        # Addresses are "host:port" strings, as the cluster map names replicas.
        self._addresses = [f"{host}:{port}" for host, port in addresses]
        self._config: ClusterConfig | None = None
        self._snapshot_ids = itertools.count(1)
        self.partitioner = partitioner
        self.settings = settings
        self.client_id = client_id or uuid.uuid4().hex[:16]
        # Bound to the address that reaches the cluster (127.0.0.1 on loopback).
        local = source_address_toward(addresses[0][0]) if addresses else "127.0.0.1"
        self._rpc = Rpc.udp(Nexus(), local, 0, settings=rpc_settings)
        self._sessions: dict[Any, Session] = {}
        self._in_flight = InFlightLimit(settings.in_flight_max)
        # _ask (one per leader at most), and pipelined commits whose wait went on in a task
        self._await_tasks: set[asyncio.Task[Any]] = set()
        self.protocol = ClientProtocol(
            self.client_id, self._addresses, partitioner, settings, time.monotonic,
            random.Random(int.from_bytes(os.urandom(8), "little")),
            [f"{host}:{port}" for host, port in cm_members], rpc_settings.msg_size_max,
        )
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
        if config.transport == "rdma":
            from store.rpc.rdma import RdmaUnavailable, require_rdma

            try:
                require_rdma()
            except RdmaUnavailable as exc:
                raise Unavailable(str(exc)) from None
        # [client] holds ClientSettings' fields and "region" (read_snapshot's default).
        from_file = {k: v for k, v in config.client.items() if k != "region"}
        base = ClientSettings(**{**from_file, **overrides}) if settings is None else settings
        client = cls(
            [s.leader for s in config.shards], config.partitioner(), base, client_id, config.rpc,
            [address for _, address in config.cm],
        )
        client._config = config
        secret = config.security.secret() if config.security is not None else None
        if secret is not None:
            client._rpc.set_secret(secret)  # the servers make sessions only with its holders
        for address in client._addresses:
            # A shard that is down now fails its transactions until it is back.
            with contextlib.suppress(RpcError):
                await client._carry_out(Connect(address, base.connect_timeout_s))
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

    def stats(self) -> dict[str, int]:
        """What this client's transactions took: ``transactions`` run, ``attempts`` (each
        under a new id), ``conflict_retries`` and ``unavailable_retries`` (a leader that had
        moved). One transaction's count is its ``TxnResult.attempts`` (``run_detailed``), or
        the ``attempts`` of the error it raised. ``await_requests``: the requests that
        waited for pipelined transactions' commits (each for all of them at one leader)."""
        return {**self.protocol.stats, "await_requests": self.protocol.watch.requests}

    async def run_ops(self, ops: list[list[Any]], *, route: str | int | None = None) -> list[Any]:
        """Runs built-in operations as one transaction (see ``transaction()``): ``[["get",
        key], ["put", key, value], ["scan", lo, hi, limit], ...]``; keys are strings or
        tuples, and a negative scan limit reads the range from its end."""
        result: list[Any] = (await self._run_ops(ops, route, detailed=False)).result
        return result

    async def run_ops_detailed(
        self, ops: list[list[Any]], *, route: str | int | None = None
    ) -> TxnResult:
        """``run_ops`` with latencies and the number of attempts (conflict retries + 1)."""
        return await self._run_ops(ops, route, detailed=True)

    async def _run_ops(self, ops: list[list[Any]], route: str | int | None, detailed: bool) -> TxnResult:
        stored, scans = checked_ops(ops, DEFAULT_SETTINGS)  # a malformed list fails here, before any request
        if route is None and stored:
            route = stored[0][1]
        result = await self._run(OPS_PROCEDURE, [stored], route, speculative=False, detailed=detailed)
        if scans:  # only a range's results hold keys to turn back into tuples
            _typed_results(stored, result.result)
        return result

    async def get(self, key: Key) -> Any:
        return (await self.run_ops([["get", key]]))[0]

    async def put(self, key: Key, value: Any) -> None:
        await self.run_ops([["put", key, value]])

    async def delete(self, key: Key) -> None:
        await self.run_ops([["delete", key]])

    async def scan(
        self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        """The pairs of ``[lo, hi)`` (one table), the first ``limit``, or the last ones
        highest first if ``reverse``."""
        found = (await self.run_ops([["scan", lo, hi, _signed(limit, reverse)]]))[0]
        return [(key, value) for key, value in found]

    async def scan_prefix(
        self, prefix: tuple[Element, ...], limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        """The pairs of every tuple key that starts with ``prefix``."""
        lo, hi = _prefix_range(prefix)
        return await self.scan(lo, hi, limit, reverse=reverse)

    async def keys(
        self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False,
    ) -> list[Key]:
        """The keys of ``[lo, hi)`` as ``scan`` finds them, without their values (which
        never leave the server)."""
        found: list[Key] = (await self.run_ops([["keys", lo, hi, _signed(limit, reverse)]]))[0]
        return found

    async def count(self, lo: Key, hi: Key, limit: int = 1000) -> int:
        """How many keys ``[lo, hi)`` holds, counting up to ``limit`` (at most the
        settings' scan limit): a scan that answers with a number."""
        counted: int = (await self.run_ops([["count", lo, hi, limit]]))[0]
        return counted

    async def clear_range(self, lo: Key, hi: Key) -> int:
        """Deletes every key of ``[lo, hi)`` (one table, fewer keys than the scan limit) in
        one transaction; returns how many there were."""
        count: int = (await self.run_ops([["clear_range", lo, hi]]))[0]
        return count

    async def truncate(self, table: str) -> int:
        """Deletes every key of ``table`` (its string keys ``table/...`` and its tuple keys
        ``(table, ...)``), in transactions of up to ``TRUNCATE_BATCH`` keys; returns how many
        it deleted. Not one transaction: a reader may see the table part deleted, and keys
        written meanwhile may survive it."""
        if type(table) is not str or not table or "/" in table or table < " ":
            raise InvalidRequest(f"a table name is a non-empty string without '/', got {table!r}")
        deleted = 0
        for lo, hi in ((table + "/", table_end(table)), _prefix_range((table,))):
            while True:
                (found,) = await self.run_ops([["scan", lo, hi, TRUNCATE_BATCH]])
                if not found:
                    break
                end = hi if len(found) < TRUNCATE_BATCH else to_stored(found[-1][0]) + "\x00"
                (count,) = await self.run_ops([["clear_range", lo, end]])
                deleted += count
                lo = end
                if end == hi:
                    break
        return deleted

    async def status(self, replicas: bool = False) -> list[dict[str, Any] | None]:
        """Each shard leader's health and counters (None for one that does not answer);
        with ``replicas``, every follower's too, after the leaders."""
        targets: list[Any] = list(self.protocol.leaders)
        if replicas and self._config is not None:
            targets = [node.address for node in self._config.nodes()]
        statuses: list[dict[str, Any] | None] = []
        timeout = self.settings.attempt_timeout_s
        for address in targets:
            try:
                await self._carry_out(Connect(address, self.settings.connect_timeout_s))
                payload = await self._carry_out(Call(address, wire.STATUS, b"", timeout))
                statuses.append(msgpack.unpackb(payload))
            except RpcError:
                statuses.append(None)
        return statuses

    async def read_snapshot(
        self,
        keys: Sequence[Key] = (),
        *,
        scans: Sequence[tuple[Key, Key, int]] = (),
        region: str | None = None,
        with_lag: bool = False,
    ) -> SnapshotResult:
        """A read-only snapshot of keys of ONE shard, served by its follower in ``region``
        (the replica there that the cluster map does not name leader).

        Shows only committed transactions, at the follower's vector watermark: consistent
        within the shard, and as stale as replication to that region is (``vw`` says where
        it is; ``with_lag`` also asks the leader how far behind that is).
        """
        if self._config is None:
            raise InvalidRequest("snapshot reads need a cluster file (followers)")
        stored_keys = [to_stored(key) for key in keys]
        stored_scans = [(to_stored(lo), to_stored(hi), limit) for lo, hi, limit in scans]
        shards = {self.partitioner.shard_of(key) for key in stored_keys}
        for lo, hi, _ in stored_scans:
            shards.update(self.partitioner.shards_of_range(lo, hi))
        if len(shards) != 1:
            raise InvalidRequest("a snapshot read covers the keys of one shard")
        shard = shards.pop()
        # The shard's replicas that follow now: the cluster file's, but the one the cluster
        # map names leader (after a failover the old leader follows in its region).
        config = self._config.shards[shard]
        leader = self.protocol.leaders[shard]
        followers = [
            (r, a) for r, a in ((config.region, config.leader), *config.followers)
            if f"{a[0]}:{a[1]}" != leader
        ]
        if not followers:
            raise InvalidRequest(f"shard {shard} has no followers")
        region = region or self._config.client.get("region") or followers[0][0]
        address = next((a for r, a in followers if r == region), None)
        if address is None:
            raise InvalidRequest(f"shard {shard} has no follower in region {region!r}")
        request = SnapshotRead(next(self._snapshot_ids), stored_keys, stored_scans)
        reply = await self._drive(self.protocol.snapshot(shard, address, request))
        lag = None
        if with_lag:
            # The shard's watermark at its leader: with workers, the least of theirs (each
            # reports its own claim), and the follower's vector keeps the shard's entry.
            partitioner = self.partitioner
            marks = {
                unit: int(status["watermark"]) for unit, status in enumerate(await self.status())
                if status is not None
            }
            clock = partitioner.clock_of(shard)
            leader_mark = clock_marks(marks, partitioner.workers).get(clock)
            if leader_mark is not None:
                lag = max(0, leader_mark - reply.vw[clock])
        scanned = [[(from_stored(key), value) for key, value in found] for found in reply.scans]
        return SnapshotResult(
            dict(zip(keys, reply.values, strict=True)), scanned, shard, region, reply.vw, lag
        )

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
        shard = self.protocol.shard_for(route)
        limit = self._in_flight
        if not limit.take():  # a free place is taken without a coroutine
            await limit.wait()
        try:
            steps = self.protocol.run(shard, procedure, args, speculative, detailed)
            return await self._drive(steps)
        finally:
            limit.release()

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
        shard = self.protocol.shard_for(route)
        loop = asyncio.get_running_loop()
        result, pending = await self._drive(self.protocol.run_pipelined(shard, procedure, list(args)))
        future: asyncio.Future[TxnResult] = loop.create_future()
        if pending is None:
            future.set_result(result)
            return result, future
        self._drive_waiting(self.protocol.await_commit(pending, result), None, future)
        return result, future

    async def resume(self, pending: PendingTxn, speculative: bool = False) -> TxnResult:
        """Asks again for a transaction whose outcome was unknown (same id: never runs twice)."""
        return await self._drive(self.protocol.resume(pending, speculative))

    # ---- the driver ----------------------------------------------------------------------

    def _drive_waiting(
        self, steps: Steps[T], value: Any, future: asyncio.Future[T]
    ) -> None:
        """Carries out a protocol generator's effects into ``future`` without a task of its
        own while they are ``AwaitOutcome`` (a pipelined transaction's commit: a waiter of
        the ``OutcomeWatch``, resumed by its callback, as the simulator's driver does); at
        any other effect a task (``_drive``) takes the generator on from there."""
        if future.done():  # cancelled by the caller: nothing more is asked
            steps.close()
            return
        try:
            effect = steps.send(value)
        except StopIteration as stop:
            future.set_result(stop.value)
            return
        except Exception as exc:  # the generator's typed error: the future's
            future.set_exception(exc)
            return
        if not isinstance(effect, AwaitOutcome):
            task = self._keep(asyncio.get_running_loop().create_task(self._drive(steps, effect)))
            task.add_done_callback(partial(_settle, future))
            future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
            return
        _CommitWait(self, steps, future, effect)

    def _keep(self, task: asyncio.Task[T]) -> asyncio.Task[T]:
        """Holds a task of the client's own until it is done (the loop keeps only weak
        references to tasks)."""
        self._await_tasks.add(task)
        task.add_done_callback(self._await_tasks.discard)
        return task

    async def _drive(self, steps: Steps[T], first: Any = None) -> T:
        """Carries out a protocol generator's effects until it returns or raises;
        ``first``: the effect it yielded last, not yet carried out (None: start it)."""
        value: Any = None
        error: RpcError | None = None
        sessions = self._sessions
        while True:
            if first is not None:
                effect, first = first, None
            else:
                try:
                    effect = steps.send(value) if error is None else steps.throw(error)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
            value, error = None, None
            # The two effects of every transaction, without a coroutine of their own: a
            # Connect to a session that is up, and a Call on it.
            if isinstance(effect, Call):
                session = sessions.get(effect.address)
                if session is not None and session.error is None:
                    try:
                        value = await self._rpc.call(
                            session, effect.req_type, effect.payload, effect.timeout_s
                        )
                    except RpcError as exc:
                        error = exc
                    continue
            elif isinstance(effect, Connect):
                session = sessions.get(effect.address)
                if session is not None and session.error is None:
                    continue
            try:
                value = await self._carry_out(effect)
            except RpcError as exc:
                error = exc

    async def _await_outcome(self, effect: AwaitOutcome) -> Outcome | None:
        """``AwaitOutcome``: one waiter of the client's ``OutcomeWatch``; its request to
        that leader goes from ``_ask`` (one on the wire per leader)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome | None] = loop.create_future()

        def then(outcome: Outcome | None) -> None:
            if not future.done():
                future.set_result(outcome)

        watch = self.protocol.watch
        payload = watch.wait(effect.address, effect.seq, then)
        if payload is not None:
            self._keep(loop.create_task(self._ask(effect.address, payload)))
        timer = loop.call_later(effect.timeout_s, then, None)
        try:
            return await future
        finally:
            timer.cancel()
            watch.forget(effect.address, effect.seq, then)

    async def _ask(self, address: Any, payload: bytes | None) -> None:
        """The AWAIT requests to one leader, one after the other while anyone waits there."""
        watch = self.protocol.watch
        timeout_s = self.settings.attempt_timeout_s
        while payload is not None:
            answer: bytes | None = None
            session = self._sessions.get(address)
            if session is not None and session.error is None and not self._closed:
                with contextlib.suppress(RpcError):  # each waiter asks by its Submit
                    answer = await self._rpc.call(session, wire.AWAIT, payload, timeout_s)
            payload = watch.answered(address, answer)

    async def cluster_map(self) -> tuple[int, list[str]]:
        """Asks the configuration manager for the cluster map and adopts it if newer:
        (epoch, each shard's leader). Epoch -1: the cluster file's (no CM answered)."""
        await self._drive(self.protocol.refresh_config())
        return self.protocol.epoch, [str(a) for a in self.protocol.leaders]

    async def _carry_out(self, effect: Any) -> Any:
        if isinstance(effect, Call):
            session = self._sessions.get(effect.address)
            if session is None or session.error is not None:
                raise SessionClosed(f"no session to {effect.address}")
            return await self._rpc.call(session, effect.req_type, effect.payload, effect.timeout_s)
        if isinstance(effect, Connect):
            session = self._sessions.get(effect.address)
            if session is None or session.error is not None:
                self._sessions.pop(effect.address, None)
                try:
                    endpoint = _endpoint(effect.address)
                    session = await self._rpc.connect(endpoint, timeout=effect.timeout_s)
                except OSError as exc:  # a name that does not resolve, say
                    raise PeerUnavailable(f"cannot reach {effect.address}: {exc}") from None
                self._sessions[effect.address] = session
            return None
        if isinstance(effect, ForgetSession):
            self._sessions.pop(effect.address, None)
            return None
        if isinstance(effect, AwaitOutcome):
            return await self._await_outcome(effect)
        assert isinstance(effect, Sleep), effect
        await asyncio.sleep(effect.seconds)
        return None


class _OpsBuilder:
    """The operations of a transaction being built (shared by both builders)."""

    def __init__(self) -> None:
        self.ops: list[list[Any]] = []

    def get(self, key: Key) -> Self:
        self.ops.append(["get", key])
        return self

    def put(self, key: Key, value: Any) -> Self:
        self.ops.append(["put", key, value])
        return self

    def delete(self, key: Key) -> Self:
        self.ops.append(["delete", key])
        return self

    def scan(self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False) -> Self:
        self.ops.append(["scan", lo, hi, _signed(limit, reverse)])
        return self

    def scan_prefix(self, prefix: tuple[Element, ...], limit: int = 100, *, reverse: bool = False) -> Self:
        lo, hi = _prefix_range(prefix)
        self.ops.append(["scan", lo, hi, _signed(limit, reverse)])
        return self

    def keys(self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False) -> Self:
        self.ops.append(["keys", lo, hi, _signed(limit, reverse)])
        return self

    def count(self, lo: Key, hi: Key, limit: int = 1000) -> Self:
        self.ops.append(["count", lo, hi, limit])
        return self

    def clear_range(self, lo: Key, hi: Key) -> Self:
        self.ops.append(["clear_range", lo, hi])
        return self

    def append(self, key: Key, item: Any) -> Self:
        self.ops.append(["append", key, item])
        return self

    def increment(self, key: Key, delta: int = 1) -> Self:
        self.ops.append(["increment", key, delta])
        return self

    def compare_and_set(self, key: Key, expected: Any, new: Any) -> Self:
        self.ops.append(["cas", key, expected, new])
        return self


class _CommitWait:
    """One ``AwaitOutcome`` of ``Client._drive_waiting``: a waiter of the client's
    ``OutcomeWatch`` until the answer or the deadline, whichever comes first, resumes the
    generator. (An object rather than closures: two closures calling each other are a
    cycle, freed only by the cyclic collector, whose passes cost more than the wait.) A
    future the caller cancelled is resumed no further (``_drive_waiting``); its waiter
    stays to the answer or the deadline."""

    __slots__ = ("address", "client", "future", "seq", "steps", "timer")

    def __init__(
        self, client: Client, steps: Steps[Any], future: asyncio.Future[Any], effect: AwaitOutcome
    ) -> None:
        self.client, self.steps, self.future = client, steps, future
        self.address, self.seq = effect.address, effect.seq
        loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = loop.call_later(effect.timeout_s, self.then, None)
        payload = client.protocol.watch.wait(self.address, self.seq, self.then)
        if payload is not None:
            client._keep(loop.create_task(client._ask(self.address, payload)))

    def then(self, outcome: Outcome | None) -> None:
        timer = self.timer
        if timer is None:
            return  # resumed already (the answer and the deadline both came)
        self.timer = None
        timer.cancel()
        client = self.client
        client.protocol.watch.forget(self.address, self.seq, self.then)
        client._drive_waiting(self.steps, outcome, self.future)


def _settle(future: asyncio.Future[T], task: asyncio.Task[T]) -> None:
    """Hands a task's end to the future that stood for it (unless that was cancelled)."""
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif task.exception() is not None:
        future.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        future.set_result(task.result())


def _signed(limit: int, reverse: bool) -> int:
    """A scan's limit as the wire has it: negative for a reverse scan."""
    if type(reverse) is not bool:
        raise InvalidRequest("reverse is true or false")
    return -limit if reverse and type(limit) is int else limit


class InFlightLimit:
    """At most ``limit`` transactions of a client outstanding at once (``in_flight_max``):
    free places and a queue of waiters, first come first served. Taking a free place
    (``take``) is an integer test, where an
    ``asyncio.Semaphore``'s ``async with`` cost 2.5-4% of a busy client's CPU (its
    ``locked()`` scans the waiters on every acquire; py-spy, bench/micro.py, 2026-12-05). A
    place released while someone waits passes to the first waiter directly."""

    __slots__ = ("free", "waiters")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise InvalidRequest(f"in_flight_max must be at least 1, not {limit}")
        self.free = limit
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> bool:
        """A free place if there is one and nobody waits for one before."""
        if self.free and not self.waiters:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Until a place is this caller's (when none is free or others wait first)."""
        if self.take():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a place, then cancelled before taking it: pass it on
            raise

    def release(self) -> None:
        """Gives a place back: to the first waiter still waiting, else to the free ones."""
        waiters = self.waiters
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.free += 1


def _typed_results(ops: list[list[Any]], results: list[Any]) -> None:
    """Scan results' tuple keys (arrays on the wire) back into tuples, in place."""
    for op, result in zip(ops, results, strict=False):
        if op[0] == "scan" and type(result) is list:
            for pair in result:
                if type(pair[0]) is list:
                    pair[0] = tuple_of(pair[0])
        elif op[0] == "keys" and type(result) is list:
            result[:] = [tuple_of(key) if type(key) is list else key for key in result]


class TxnBuilder(_OpsBuilder):
    """Collects built-in operations; ``await commit()`` runs them as one transaction.

        results = await client.transaction().get("t/a").put("t/b", 1).increment("t/c").commit()
    """

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    async def commit(self) -> list[Any]:
        return await self._client.run_ops(self.ops)


class BlockingTxnBuilder(_OpsBuilder):
    """``TxnBuilder`` of a ``BlockingClient``: ``commit()`` blocks until committed."""

    def __init__(self, client: BlockingClient) -> None:
        super().__init__()
        self._client = client

    def commit(self) -> list[Any]:
        return self._client.run_ops(self.ops)


class BlockingClient:
    """The SDK without asyncio: each call blocks until its answer. It offers every call of
    ``Client``, with the same arguments (``tests/client/test_blocking.py`` compares them).

        with BlockingClient.connect("cluster/local.toml") as client:
            client.put("acct/alice", 100)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Client) -> None:
        self._loop = loop
        self._thread = thread
        self._client = client

    @classmethod
    def connect(
        cls,
        cluster: str | Path | ClusterConfig,
        *,
        client_id: str | None = None,
        settings: ClientSettings | None = None,
        **overrides: Any,
    ) -> BlockingClient:
        """Connects to a cluster given its cluster file (or a parsed one)."""
        loop = new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="meridian-client", daemon=True)
        thread.start()
        kwargs: dict[str, Any] = {"client_id": client_id, "settings": settings, **overrides}
        future = asyncio.run_coroutine_threadsafe(_connect_in_loop(cluster, kwargs), loop)
        try:
            return cls(loop, thread, future.result())
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            raise

    @property
    def partitioner(self) -> Partitioner:
        return self._client.partitioner

    @property
    def settings(self) -> ClientSettings:
        return self._client.settings

    @property
    def client_id(self) -> str:
        return self._client.client_id

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def run(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        return self._call(self._client.run(procedure, *args, route=route))

    def run_speculative(self, procedure: str, *args: Any, route: str | int | None = None) -> Any:
        """Returns at certification: the result MAY BE ROLLED BACK (see ``Client``)."""
        return self._call(self._client.run_speculative(procedure, *args, route=route))

    def run_detailed(self, procedure: str, *args: Any, route: str | int | None = None) -> TxnResult:
        return self._call(self._client.run_detailed(procedure, *args, route=route))

    def transaction(self) -> BlockingTxnBuilder:
        """A builder of a transaction made of built-in operations."""
        return BlockingTxnBuilder(self)

    def stats(self) -> dict[str, int]:
        """What this client's transactions took (see ``Client.stats``)."""
        return self._client.stats()

    def run_ops(self, ops: list[list[Any]], *, route: str | int | None = None) -> list[Any]:
        return self._call(self._client.run_ops(ops, route=route))

    def run_ops_detailed(
        self, ops: list[list[Any]], *, route: str | int | None = None
    ) -> TxnResult:
        """``run_ops`` with latencies and the number of attempts (conflict retries + 1)."""
        return self._call(self._client.run_ops_detailed(ops, route=route))

    def get(self, key: Key) -> Any:
        return self._call(self._client.get(key))

    def put(self, key: Key, value: Any) -> None:
        self._call(self._client.put(key, value))

    def delete(self, key: Key) -> None:
        self._call(self._client.delete(key))

    def scan(
        self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        return self._call(self._client.scan(lo, hi, limit, reverse=reverse))

    def scan_prefix(
        self, prefix: tuple[Element, ...], limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        return self._call(self._client.scan_prefix(prefix, limit, reverse=reverse))

    def keys(self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False) -> list[Key]:
        return self._call(self._client.keys(lo, hi, limit, reverse=reverse))

    def count(self, lo: Key, hi: Key, limit: int = 1000) -> int:
        return self._call(self._client.count(lo, hi, limit))

    def clear_range(self, lo: Key, hi: Key) -> int:
        return self._call(self._client.clear_range(lo, hi))

    def truncate(self, table: str) -> int:
        """Deletes every key of ``table`` (see ``Client.truncate``)."""
        return self._call(self._client.truncate(table))

    def status(self, replicas: bool = False) -> list[dict[str, Any] | None]:
        return self._call(self._client.status(replicas))

    def read_snapshot(
        self,
        keys: Sequence[Key] = (),
        *,
        scans: Sequence[tuple[Key, Key, int]] = (),
        region: str | None = None,
        with_lag: bool = False,
    ) -> SnapshotResult:
        """A follower's snapshot of keys of ONE shard (see ``Client.read_snapshot``)."""
        return self._call(
            self._client.read_snapshot(keys, scans=scans, region=region, with_lag=with_lag)
        )

    def run_pipelined(
        self, procedure: str, *args: Any, route: str | int | None = None
    ) -> tuple[TxnResult, concurrent.futures.Future[TxnResult]]:
        """Returns as soon as the transaction is certified, with a future of its commit
        (``result()`` blocks for it). The certified result MAY BE ROLLED BACK until the
        future resolves (see ``Client.run_pipelined``)."""

        async def pipelined() -> tuple[TxnResult, asyncio.Future[TxnResult]]:
            return await self._client.run_pipelined(procedure, *args, route=route)

        certified, commit = self._call(pipelined())

        async def committed() -> TxnResult:
            return await commit

        return certified, asyncio.run_coroutine_threadsafe(committed(), self._loop)

    def resume(self, pending: PendingTxn, speculative: bool = False) -> TxnResult:
        """Asks again for a transaction whose outcome was unknown (same id: never runs twice)."""
        return self._call(self._client.resume(pending, speculative))

    def cluster_map(self) -> tuple[int, list[str]]:
        """The configuration manager's cluster map, adopted if newer: (epoch, leaders)."""
        return self._call(self._client.cluster_map())

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


def _endpoint(address: Any) -> Any:
    """The RPC endpoint of an address: "host:port" (as the cluster map names replicas), or
    already a (host, port) pair."""
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        return host, int(port)
    return address
