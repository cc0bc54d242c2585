"""Simulated client processes: the SDK's own logic on virtual time, recording a Jepsen history.

``SdkProcess`` is a client process: an RPC endpoint (the real core) on the simulated network
and the SDK's protocol (``store.client.protocol.ClientProtocol``), whose effects it carries
out with virtual-time timers — the simulator's twin of ``store.client.Client``'s driver. So
the attempts, conflict retries, resends under the same id, session reopening and deadlines
that the simulator puts under loss, duplication and partitions are the SDK's.

``WorkloadClient`` runs a closed loop over a workload on one ``SdkProcess``: it submits the
next operation through the SDK (a mix of ``run``, ``run_detailed`` and ``run_pipelined``, as
applications call them), records the invocation and the completion in the history, and
moves on. As in Jepsen, a process whose operation ended ``:info`` (``OutcomeUnknown``: it may
or may not have happened) continues under a new process number. In runs with followers it
also reads snapshots from them now and then; each one goes to the snapshot oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from jepsen.history import Op
from store import wire
from store.client.protocol import (
    AwaitOutcome,
    Call,
    ClientProtocol,
    ClientSettings,
    Connect,
    ForgetSession,
    Sleep,
    Steps,
    TxnResult,
)
from store.core.errors import MeridianError, OutcomeUnknown
from store.core.partition import Partitioner
from store.protocol.messages import Outcome, SnapshotRead, SnapshotReply
from store.rpc import Nexus, RequestTimeout, RpcError, RpcSettings, Session, SessionClosed
from store.sim.cluster import sim_endpoint
from store.sim.loop import Simulator
from store.sim.network import MS, Network
from store.sim.workloads import Operation

NS_PER_S = 1_000_000_000


def _ns(seconds: float) -> int:
    """A delay on virtual time: rounded up, and never zero, so that a deadline a fraction of
    a nanosecond away (float seconds) still lets time pass before it is looked at again."""
    return max(1, math.ceil(seconds * NS_PER_S))

Done = Callable[[Any, MeridianError | None], None]
Answered = Callable[[Any, RpcError | None], None]


def _once(callback: Answered) -> Answered:
    """``callback`` for the first of its calls only: the answer or its timer, whichever
    comes first."""
    fired = False

    def first(value: Any, error: RpcError | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            callback(value, error)

    return first


class History:
    """The history of one run, shared by every client of it."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def record(self, op_type: str, f: str, value: Any, process: int, time_ns: int) -> None:
        self.ops.append(Op(op_type, f, value, process, time_ns, len(self.ops)))


class SdkProcess:
    """A client process: the SDK's protocol on a simulated RPC endpoint (see module doc)."""

    def __init__(
        self,
        sim: Simulator,
        network: Network,
        address: str,
        region: str,
        leaders: Sequence[str],
        partitioner: Partitioner,
        settings: ClientSettings,
        rpc_settings: RpcSettings,
        client_id: str | None = None,
        cm_members: Sequence[str] = (),
    ) -> None:
        self.sim = sim
        self.address = address
        network.add(address, region)
        self.rpc = sim_endpoint(Nexus(), network, address, rpc_settings)
        self.protocol = ClientProtocol(
            client_id or address, leaders, partitioner, settings, self._clock, sim.rng,
            cm_members, rpc_settings.msg_size_max,
        )
        self._sessions: dict[Any, Session] = {}

    def _clock(self) -> float:
        return self.sim.now_ns / NS_PER_S

    def drive(self, steps: Steps[Any], on_done: Done) -> None:
        """Carries out a protocol generator's effects; ``on_done(result, error)`` at its end."""
        self._step(steps, on_done, None, None)

    def _step(self, steps: Steps[Any], on_done: Done, value: Any, error: RpcError | None) -> None:
        while True:
            try:
                effect = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                on_done(stop.value, None)
                return
            except MeridianError as exc:
                on_done(None, exc)
                return
            value, error = None, None
            if isinstance(effect, ForgetSession):
                self._sessions.pop(effect.address, None)
                continue
            if isinstance(effect, Sleep):
                resume = self._resumer(steps, on_done)
                self.sim.after(_ns(effect.seconds), resume, None, None)
                return
            if isinstance(effect, AwaitOutcome):
                self._await_outcome(steps, on_done, effect)
                return
            if isinstance(effect, Connect):
                session = self._sessions.get(effect.address)
                if session is not None and session.error is None:
                    continue
                self._sessions.pop(effect.address, None)
                try:
                    session = self.rpc.create_session(effect.address)
                except RpcError as exc:
                    error = exc
                    continue
                self._await_connect(steps, on_done, effect, session)
                return
            assert isinstance(effect, Call), effect
            session = self._sessions.get(effect.address)
            if session is None or session.error is not None:
                error = SessionClosed(f"no session to {effect.address}")
                continue
            resume = self._resumer(steps, on_done)
            try:
                self.rpc.enqueue_request(session, effect.req_type, effect.payload, resume)
            except RpcError as exc:
                resume(None, exc)
                return
            timeout = RequestTimeout(f"req_type {effect.req_type} to {effect.address} timed out")
            self.sim.after(_ns(effect.timeout_s), resume, None, timeout)
            return

    def _await_outcome(self, steps: Steps[Any], on_done: Done, effect: AwaitOutcome) -> None:
        """``AwaitOutcome``, as ``Client._await_outcome`` does it: a waiter of the
        protocol's ``OutcomeWatch``, resumed by its answer or by the waiter's deadline."""
        resume = self._resumer(steps, on_done)
        watch = self.protocol.watch

        def then(outcome: Outcome | None) -> None:
            watch.forget(effect.address, effect.seq, then)
            resume(outcome, None)

        payload = watch.wait(effect.address, effect.seq, then)
        self.sim.after(_ns(effect.timeout_s), then, None)
        if payload is not None:
            self._ask(effect.address, payload)

    def _ask(self, address: Any, payload: bytes) -> None:
        """One AWAIT request to ``address``, and the next once it is answered (``Client._ask``)."""
        watch = self.protocol.watch

        def answered(answer: Any, error: RpcError | None) -> None:
            following = watch.answered(address, answer if error is None else None)
            if following is not None:
                self._ask(address, following)

        session = self._sessions.get(address)
        if session is None or session.error is not None:
            answered(None, None)  # no answer: every waiter there asks by its Submit
            return
        done = _once(answered)

        try:
            self.rpc.enqueue_request(session, wire.AWAIT, payload, done)
        except RpcError as exc:
            done(None, exc)
            return
        timeout = RequestTimeout(f"AWAIT to {address} timed out")
        self.sim.after(_ns(self.protocol.settings.attempt_timeout_s), done, None, timeout)

    def _await_connect(
        self, steps: Steps[Any], on_done: Done, effect: Connect, session: Session
    ) -> None:
        resume = self._resumer(steps, on_done)

        def connected(failure: RpcError | None) -> None:
            if failure is None:
                self._sessions[effect.address] = session
            resume(None, failure)

        session.on_connect(connected)
        timeout = RequestTimeout(f"connect to {effect.address} timed out")
        self.sim.after(_ns(effect.timeout_s), resume, None, timeout)

    def _resumer(self, steps: Steps[Any], on_done: Done) -> Answered:
        """Resumes the generator once: by whichever comes first, the answer or the timer."""
        return _once(lambda value, error: self._step(steps, on_done, value, error))


# How a workload client calls the SDK: (weight, mode). Plain ``run`` waits for the committed
# answer only; ``run_detailed`` hears CERTIFIED first and asks again for COMMITTED;
# ``run_pipelined`` returns at certification and waits for the commit separately.
CALL_MODES = ((2, "run"), (1, "detailed"), (1, "pipelined"))


class WorkloadClient:
    def __init__(
        self,
        process: SdkProcess,
        history: History,
        index: int,
        client_count: int,
        workload: Any,
        stop_at_ns: int,
        on_committed: Callable[[str, TxnResult], None] | None = None,
        snapshots: SnapshotReads | None = None,
    ) -> None:
        self.process = process
        self.sim = process.sim
        self.protocol = process.protocol
        self.history = history
        self.process_number = index
        self.client_count = client_count
        self.workload = workload
        self.stop_at_ns = stop_at_ns
        self.on_committed = on_committed
        self.snapshots = snapshots
        self.current: Operation | None = None
        self.started = 0
        self.counts = {"ok": 0, "fail": 0, "info": 0, "cross_shard": 0, "single_shard": 0}
        self.errors: dict[str, int] = {}
        self._weights = [weight for weight, _ in CALL_MODES]
        self._modes = [mode for _, mode in CALL_MODES]

    def start(self) -> None:
        self.sim.after(self.sim.rng.randrange(1 * MS), self._next)

    def busy(self) -> bool:
        return self.current is not None

    def _next(self) -> None:
        if self.sim.now_ns >= self.stop_at_ns:
            return
        rng = self.sim.rng
        if self.snapshots is not None and rng.random() < self.snapshots.fraction:
            self.snapshots.read(self.process, self.workload, self._after_snapshot)
            return
        operation = self.workload.next()
        self.current = operation
        self.started += 1
        shard_of = self.protocol.partitioner.shard_of
        shards = {shard_of(key) for key in operation.keys}
        self.counts["cross_shard" if len(shards) > 1 else "single_shard"] += 1
        shard = shard_of(operation.keys[0])
        self.history.record("invoke", operation.f, operation.value, self.process_number, self.sim.now_ns)
        mode = rng.choices(self._modes, self._weights)[0]
        args = operation.args
        if mode == "pipelined":
            steps: Steps[Any] = self._pipelined(shard, operation.procedure, args)
        else:
            steps = self.protocol.run(shard, operation.procedure, args, False, mode == "detailed")
        self.process.drive(steps, self._done)

    def _pipelined(self, shard: int, procedure: str, args: list[Any]) -> Steps[TxnResult]:
        certified, pending = yield from self.protocol.run_pipelined(shard, procedure, args)
        if pending is None:
            return certified
        return (yield from self.protocol.await_commit(pending, certified))

    def _done(self, result: TxnResult | None, error: MeridianError | None) -> None:
        operation = self.current
        assert operation is not None
        if error is None:
            assert result is not None and result.status == "committed"
            if self.on_committed is not None:
                self.on_committed(f"{self.process.address}#{self.started}", result)
            value = operation.complete(result.result)
            self._settled(operation, "ok")
            self._complete("ok", value)
            return
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        if isinstance(error, OutcomeUnknown):
            # It may or may not have happened: :info, and a new process number.
            self._settled(operation, "info")
            self._complete("info", operation.value)
            self.process_number += self.client_count
        else:
            # Did not run, changed nothing, or was rolled back by recovery (RolledBack: its
            # writes are gone everywhere, as if it had aborted).
            self._settled(operation, "fail")
            self._complete("fail", operation.value)

    @staticmethod
    def _settled(operation: Operation, outcome: str) -> None:
        if operation.settled is not None:
            operation.settled(outcome)

    def _complete(self, op_type: str, value: Any) -> None:
        assert self.current is not None
        self.counts[op_type] += 1
        self.history.record(op_type, self.current.f, value, self.process_number, self.sim.now_ns)
        self.current = None
        self.sim.after(self.sim.rng.randrange(200_000), self._next)

    def _after_snapshot(self) -> None:
        self.sim.after(self.sim.rng.randrange(200_000), self._next)


class SnapshotReads:
    """Follower snapshot reads during a run: where to send them and who checks them.

    ``followers()[shard]`` are the addresses of that shard's followers now; ``check(shard,
    keys, reply)`` judges each reply (the snapshot oracle).
    """

    def __init__(
        self,
        followers: Callable[[], dict[int, list[str]]],
        check: Callable[[int, list[str], SnapshotReply], None],
        fraction: float = 0.1,
    ) -> None:
        self.followers = followers
        self.check = check
        self.fraction = fraction
        self.requested = 0
        self.answered = 0
        self._next_id = 0

    def read(self, process: SdkProcess, workload: Any, then: Callable[[], None]) -> None:
        rng = process.sim.rng
        keys = workload.snapshot_keys()
        shard_of = process.protocol.partitioner.shard_of
        shard = shard_of(rng.choice(keys))
        keys = [key for key in keys if shard_of(key) == shard]
        followers = self.followers().get(shard)
        if not followers:
            then()
            return
        address = rng.choice(followers)
        self._next_id += 1
        self.requested += 1
        request = SnapshotRead(self._next_id, keys, [])

        def done(reply: SnapshotReply | None, error: MeridianError | None) -> None:
            if reply is not None:
                self.answered += 1
                self.check(shard, keys, reply)
            then()

        process.drive(process.protocol.snapshot(shard, address, request), done)
