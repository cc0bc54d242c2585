"""The host's disk rule (store/node/host.py, "Disk"): a Ready's records are synced before any
of its messages leave, and every later message waits behind them, in order; one sync covers
every record written before it started."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from store.core.errors import Status
from store.core.paxos import NOOP, Accept, Accepted, Ballot, Prepare
from store.core.ready import Ready
from store.core.vclock import EMPTY
from store.node.host import PEER_REPLY_PREFIX, ReplicaHost
from store.protocol import codec
from store.protocol.messages import Outcome

# The host is given a scripted replica and RPC endpoint, which its compiled build refuses.
pytestmark = pytest.mark.patches_core

BALLOT = Ballot(1, "leader/0")


class _Timers:
    def clock_ns(self) -> int:
        return 0

    def call_at(self, at_ns: int, callback: Any) -> Any:
        return None


class _Disk:
    def __init__(self) -> None:
        self.written: list[list[Any]] = []
        self.pending: list[Callable[[], None]] = []

    def write(self, records: list[Any]) -> None:
        self.written.append(list(records))

    def sync(self, done: Callable[[], None]) -> None:
        self.pending.append(done)

    def finish(self) -> None:
        self.pending.pop(0)()


class _Replica:
    """Hands out scripted Readys, one per step."""

    ANSWERS: tuple[type, ...] = (Accept,)
    ONE_WAY: tuple[type, ...] = ()
    REPLIES: tuple[type, ...] = ()
    has_successor = False

    def __init__(self) -> None:
        self.script: list[Ready] = []

    def handle(self, now_ns: int, src: str, message: Any) -> None:
        pass

    def ready(self) -> Ready:
        return self.script.pop(0) if self.script else Ready()


class _Rpc:
    dispatching = False
    after_dispatch: list[Any] = []

    def __init__(self) -> None:
        self.responses: list[tuple[Any, bytes]] = []

    def enqueue_response(self, handle: Any, payload: bytes) -> None:
        self.responses.append((handle, payload))


def _accepted(slot: int) -> Accepted:
    return Accepted(0, BALLOT, slot)


def _record(slot: int) -> Accept:
    return Accept(0, BALLOT, slot, NOOP, 0)


def _host(disk: _Disk | None) -> tuple[ReplicaHost, _Replica, list[tuple[str, Any]], list[Any]]:
    replica = _Replica()
    sent: list[tuple[str, Any]] = []
    failures: list[Any] = []
    host = ReplicaHost(
        replica, rpc=_Rpc(), timers=_Timers(),  # type: ignore[arg-type]
        peer_address=lambda address: address,
        stream_send=lambda dst, message: sent.append((dst, message)),
        request_bytes_max=1 << 20, on_fatal=failures.append, durable=disk,
    )
    return host, replica, sent, failures


def _step(host: ReplicaHost, replica: _Replica, ready: Ready) -> None:
    replica.script.append(ready)
    host.on_stream_message("eu/0", Prepare(0, BALLOT, 0))


def test_messages_wait_for_the_sync_of_their_records_and_go_in_order() -> None:
    disk = _Disk()
    host, replica, sent, failures = _host(disk)
    _step(host, replica, Ready([("leader/0", _accepted(1))], persist=[_record(1)]))
    _step(host, replica, Ready([("leader/0", _accepted(0))]))  # no records: waits behind
    assert sent == [] and disk.written == [[_record(1)]] and len(disk.pending) == 1
    disk.finish()
    assert sent == [("leader/0", _accepted(1)), ("leader/0", _accepted(0))]
    assert failures == []


def test_records_with_no_message_still_hold_the_next_readys_messages() -> None:
    """The vote of a leader's own acceptor comes with no message; the Commit that counts it
    comes later and must not leave before the vote is on disk."""
    disk = _Disk()
    host, replica, sent, _ = _host(disk)
    _step(host, replica, Ready([], persist=[_record(1)]))
    _step(host, replica, Ready([("eu/0", _accepted(1))]))
    assert sent == []
    disk.finish()
    assert sent == [("eu/0", _accepted(1))]


def test_one_sync_at_a_time_each_covering_what_was_written_before_it_started() -> None:
    disk = _Disk()
    host, replica, sent, _ = _host(disk)
    _step(host, replica, Ready([("a", _accepted(1))], persist=[_record(1)]))
    _step(host, replica, Ready([("a", _accepted(2))], persist=[_record(2)]))
    _step(host, replica, Ready([("a", _accepted(3))], persist=[_record(3)]))
    assert len(disk.pending) == 1  # the second and third wait for the first sync to end
    disk.finish()
    assert sent == [("a", _accepted(1))]
    assert len(disk.pending) == 1  # one sync for the two written meanwhile (group commit)
    disk.finish()
    assert sent == [("a", _accepted(i)) for i in (1, 2, 3)]
    assert host.counters["syncs"] == 2 and disk.pending == []
    _step(host, replica, Ready([("a", _accepted(4))]))
    assert sent[-1] == ("a", _accepted(4))  # nothing unsynced: straight out


def test_without_a_disk_messages_go_at_once() -> None:
    host, replica, sent, _ = _host(None)
    _step(host, replica, Ready([("a", _accepted(1))], persist=[_record(1)]))
    assert sent == [("a", _accepted(1))]


def test_what_reports_no_acceptor_state_goes_at_once_while_a_sync_is_pending() -> None:
    """A reply to a peer request (2PC, a snapshot read, a state piece) derives from chosen
    slots, on disk in a majority already: it does not wait for this replica's disk."""
    disk = _Disk()
    host, replica, sent, failures = _host(disk)
    _step(host, replica, Ready([("leader/0", _accepted(1))], persist=[_record(1)]))
    token = f"{PEER_REPLY_PREFIX}1"
    reply = Outcome(1, Status.INVALID, None, EMPTY, "a reply")
    replica.script.append(Ready([(token, reply)]))
    answered: list[bytes] = []
    host._answer_synchronously(answered.append, _record(1))
    assert failures == [] and sent == []
    assert answered == [codec.encode(reply)]
    disk.finish()
    assert sent == [("leader/0", _accepted(1))]


def test_a_leaders_own_votes_hold_nothing_and_count_once_synced() -> None:
    """Ready.hold false, wants_synced: messages go at once; the replica hears of the sync."""
    disk = _Disk()
    host, replica, sent, _ = _host(disk)
    told: list[int] = []
    replica.synced = told.append  # type: ignore[attr-defined]
    _step(host, replica, Ready([("eu/0", _accepted(1))], persist=[_record(1)], hold=False,
                               wants_synced=True))
    assert sent == [("eu/0", _accepted(1))] and told == []
    disk.finish()
    assert told == [0]


def test_a_sync_that_ends_after_the_host_failed_sends_nothing() -> None:
    disk = _Disk()
    host, replica, sent, failures = _host(disk)
    _step(host, replica, Ready([("a", _accepted(1))], persist=[_record(1)]))
    host._fail(AssertionError("broken"))
    disk.finish()
    assert sent == [] and len(failures) == 1


def test_a_cm_leaders_own_votes_count_only_once_on_disk() -> None:
    """A configuration manager member leads its stream as a shard leader does: hosted with
    a disk, its own votes count once synced (``votes_after_sync``); so a command is chosen,
    and the map changed, only by votes on disk in a majority. Without a disk they count at
    once."""
    from store.core.cm import ConfigMember
    from store.core.paxos import StreamLeader
    from store.protocol.cluster_map import ClusterMap

    members = ["us/cm", "eu/cm", "ap/cm"]
    for disk, expected in ((_Disk(), True), (None, False)):
        member = ConfigMember("us/cm", members, ClusterMap(0, ["l0"], [["f0"]]))
        host = ReplicaHost(
            member, rpc=_Rpc(), timers=_Timers(),  # type: ignore[arg-type]
            peer_address=lambda address: address, stream_send=lambda dst, message: None,
            request_bytes_max=1 << 20, on_fatal=lambda exc: None, durable=disk,
        )
        host.start()
        assert isinstance(member.stream, StreamLeader)
        assert member.stream.votes_after_sync is expected


class _SnapshotDisk(_Disk):
    """A disk that keeps snapshots too (``SnapshotDisk``)."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshot_wanted = False
        self.saved: list[Any] = []

    def save_snapshot(self, state: Any, done: Callable[[int], None]) -> None:
        self.saved.append(state)
        done(state.slot)


def test_a_followers_snapshot_goes_to_disk_only_after_the_log_it_leaves_its_entries_to() -> None:
    """A follower's snapshot leaves out the entries it delivered recently: its log holds
    them (its acceptor holds the chosen value of every slot it delivered), and a restart
    rebuilds them from it. So the host hands the snapshot to the disk only once every record
    written before it was captured is synced; a snapshot on disk ahead of its log would
    restore a follower with no entries to hand a takeover."""
    from store.core.follower import ShardFollower
    from store.core.paxos import Acceptor
    from store.node.host import restore_follower
    from store.protocol.cluster_map import ClusterMap
    from tests.core.test_transfer import BATCH

    leader = Ballot(1, "b")
    disk = _SnapshotDisk()
    follower = ShardFollower(0, "a")
    host = ReplicaHost(
        follower, rpc=_Rpc(), timers=_Timers(),  # type: ignore[arg-type]
        peer_address=lambda address: address, stream_send=lambda dst, message: None,
        request_bytes_max=1 << 20, on_fatal=lambda exc: None, durable=disk,
    )
    host.on_stream_message("b", Accept(0, leader, 0, BATCH, 0))
    disk.finish()
    assert [state.slot for state in disk.saved] == [0]  # its first, once its vote is synced
    disk.snapshot_wanted = True
    host.on_stream_message("b", Accept(0, leader, 1, BATCH, 1))  # slot 0 is chosen
    assert follower.stream.learner.delivered_through == 1
    assert len(disk.saved) == 1 and disk.pending  # captured, waiting for the log's sync
    disk.finish()
    snapshot = disk.saved[-1]
    assert snapshot.slot == 1 and snapshot.recent == {}  # the log holds slot 0

    # Restarted on that disk: its acceptor from the log, its recent entries from it too.
    records = [record for batch in disk.written for record in batch]
    restarted = ShardFollower(0, "a", rejoining=True, acceptor=Acceptor.recover(0, records))
    assert restore_follower(restarted, snapshot, ClusterMap(0, ["b"], [["a"]]))
    assert restarted.capture_state().recent == follower.capture_state().recent == {0: BATCH}
