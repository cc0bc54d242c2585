"""A client's ``AwaitOutcomes`` (``wire.AWAIT``) at a shard leader's host: answered at once
with what the coordinator knows, or held until one of its transactions ends and then
answered with every outcome that step decided; the SDK's pipelined commits wait this way,
one request for many transactions instead of one per transaction."""

from __future__ import annotations

from typing import Any

from store.core.errors import Status
from store.core.follower import ShardFollower
from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner
from store.core.paxos import Acceptor, PaxosMessage
from store.core.replica import ShardLeader
from store.core.txn import Procedures
from store.node.host import ReplicaHost
from store.protocol import codec
from store.protocol.messages import AwaitOutcomes, Message, Outcome, Outcomes, Submit
from tests.node.helpers import idle_endpoint

FOLLOWERS = ["eu", "ap"]
START_NS = 2_000_000_000  # past a new leader's lease wait: it may tell clients COMMITTED


class _Timers:
    def __init__(self) -> None:
        self.now = START_NS
        self.due: list[tuple[int, Any]] = []

    def clock_ns(self) -> int:
        return self.now

    def call_at(self, at_ns: int, callback: Any) -> Any:
        self.due.append((at_ns, callback))
        return None

    def fire(self) -> None:
        due = [callback for at, callback in self.due if at <= self.now]
        self.due = [(at, callback) for at, callback in self.due if at > self.now]
        for callback in due:
            callback()


class _Shard:
    """A hosted shard leader whose stream's two acceptors answer when told to."""

    def __init__(self) -> None:
        self.timers = _Timers()
        self.acceptors = {name: Acceptor(0) for name in FOLLOWERS}
        self.paxos: list[tuple[str, PaxosMessage]] = []
        leader = ShardLeader(
            0, ["us"], Partitioner(1), Procedures(), now_ns=0, followers=FOLLOWERS
        )
        for i in range(4):
            leader.preload(f"k{i}", 0)
        self.host = ReplicaHost(
            leader, rpc=idle_endpoint(), timers=self.timers,
            peer_address=lambda address: address,
            stream_send=lambda dst, message: self.paxos.append((dst, message)),
            request_bytes_max=1 << 20, on_fatal=self._fatal,
        )
        self.host.start()
        self.replicate()  # phase 1

    @staticmethod
    def _fatal(exc: BaseException) -> None:
        raise AssertionError(f"the host failed: {exc!r}")

    def replicate(self, ms: int = 30) -> None:
        """``ms`` milliseconds: every Paxos message to the acceptors and their replies back
        at once, the host's timers fired when due (an entry closes a nanosecond after the
        step that opened it)."""
        for _ in range(ms):
            self.timers.now += 1_000_000
            self.timers.fire()
            sent, self.paxos = self.paxos, []
            for dst, message in sent:
                acceptor = self.acceptors[dst]
                acceptor.handle(self.timers.now, "us", message)
                for _, reply in acceptor.ready().messages:
                    self.host.on_stream_message(dst, reply)

    def submit(self, seq: int) -> list[Message]:
        answers: list[Message] = []
        submit = Submit("c1", seq, OPS_PROCEDURE, [[["increment", f"k{seq % 4}", 1]]], True)
        reply = self.host._submit(lambda b: answers.append(codec.decode(b)), codec.encode(submit))
        assert reply is None
        return answers

    def await_(self, *seqs: int) -> tuple[Message | None, list[Message]]:
        """(the answer now, or None: held; the answers that came later)."""
        later: list[Message] = []
        now = self.host._await(
            lambda b: later.append(codec.decode(b)), codec.encode(AwaitOutcomes("c1", list(seqs)))
        )
        return (None if now is None else codec.decode(now)), later


def _statuses(message: Message | None) -> dict[int, int]:
    assert isinstance(message, Outcomes), message
    return {outcome.seq: outcome.status for outcome in message.outcomes}


def test_a_held_await_is_answered_with_every_commit_of_the_step_that_decided_them() -> None:
    shard = _Shard()
    certified = [shard.submit(seq) for seq in (1, 2, 3)]
    assert all(
        isinstance(a[0], Outcome) and a[0].status == Status.CERTIFIED for a in certified
    )
    now, later = shard.await_(1, 2, 3)
    assert now is None and later == []  # held: none has its final outcome yet
    assert shard.host.counters["awaits_held"] == 1
    shard.replicate()  # their entry chosen: all three commit in one step
    assert len(later) == 1
    assert _statuses(later[0]) == {1: Status.COMMITTED, 2: Status.COMMITTED, 3: Status.COMMITTED}
    # Asked again (a lost answer): at once, from the coordinator's remembered outcomes.
    again, _ = shard.await_(2)
    assert _statuses(again) == {2: Status.COMMITTED}


def test_an_await_naming_a_transaction_the_leader_does_not_know_is_answered_at_once() -> None:
    shard = _Shard()
    shard.submit(1)
    now, later = shard.await_(1, 99)
    assert isinstance(now, Outcomes) and now.outcomes == [] and now.unknown == [99]
    shard.replicate()
    assert later == []  # answered already: the commit of 1 waits for the next request


def test_an_await_to_a_process_that_is_no_leader_lets_the_client_ask_by_submit() -> None:
    host = ReplicaHost(
        ShardFollower(0, "f/0"), rpc=idle_endpoint(), timers=_Timers(),
        peer_address=lambda address: address, stream_send=None, request_bytes_max=1 << 20,
        on_fatal=lambda exc: None,
    )
    answer = host._await(lambda b: None, codec.encode(AwaitOutcomes("c1", [4, 5])))
    assert answer is not None
    message = codec.decode(answer)
    assert isinstance(message, Outcomes) and message.unknown == [4, 5]


def test_a_malformed_await_is_invalid_and_counted() -> None:
    shard = _Shard()
    answer = shard.host._await(lambda b: None, codec.encode(Submit("c1", 1, "p", [], True)))
    assert answer is not None
    message = codec.decode(answer)
    assert isinstance(message, Outcome) and message.status == Status.INVALID
    assert shard.host.counters["bad_requests"] == 1


def test_a_clients_newer_await_replaces_its_held_one() -> None:
    """A client has one AWAIT on the wire per leader; asking again (its earlier one timed
    out, or was lost) replaces the held one, which is never answered."""
    shard = _Shard()
    shard.submit(1)
    shard.submit(2)
    first, first_later = shard.await_(1, 2)
    second, second_later = shard.await_(1, 2)
    assert first is None and second is None
    shard.replicate()
    assert first_later == []
    assert len(second_later) == 1
    assert _statuses(second_later[0]) == {1: Status.COMMITTED, 2: Status.COMMITTED}
