"""A shard leader's step (``ShardLeader.receive`` / ``ready``): messages received together
are handled as one step, as if they had arrived at one instant, and what a step ends with
(the stream pumped, the watermark refreshed, news shared with fellow workers) comes out in
the ``ready()`` that follows, not at some later timer."""

from __future__ import annotations

from typing import Any

import pytest

from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner, WorkerPartitioner
from store.core.paxos import Acceptor, PaxosMessage
from store.core.paxos.messages import Accept
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import Procedures
from store.core.watermark import LocalCounter
from store.protocol.messages import Gossip, Message, Submit, ValidateReply
from store.sim.local import LocalCluster
from store.sim.network import MS

FOLLOWERS = ["eu", "ap"]


def _leader_with_followers() -> ShardLeader:
    """A shard leader whose stream has finished phase 1 with two acceptors, all quiet."""
    leader = ShardLeader(0, ["us"], Partitioner(1), Procedures(), now_ns=0, followers=FOLLOWERS)
    acceptors = {name: Acceptor(0) for name in FOLLOWERS}
    for i in range(8):
        leader.preload(f"k{i}", 0)
    pending = leader.ready().messages
    while pending:
        for dst, message in pending:
            if isinstance(message, PaxosMessage) and dst in acceptors:
                acceptors[dst].handle(0, "us", message)
                for _, reply in acceptors[dst].ready().messages:
                    leader.handle(0, dst, reply)
        pending = leader.ready().messages
    return leader


def test_a_batch_received_at_one_instant_goes_to_the_followers_in_one_entry_at_once() -> None:
    leader = _leader_with_followers()
    now = DEFAULT_SETTINGS.gossip_interval_ns  # the stream has been quiet for long
    for i in range(8):
        submit = Submit("client", i + 1, OPS_PROCEDURE, [[["increment", f"k{i}", 1]]], False)
        leader.receive(now, "client", submit)
    assert leader.joined_messages == 7
    leader.tick(now + 1)  # the entry closes a nanosecond after the step that opened it
    accepts = [(dst, m) for dst, m in leader.ready().messages if isinstance(m, Accept)]
    assert sorted(dst for dst, _ in accepts) == sorted(FOLLOWERS)
    assert all(len(m.entry.records) == 8 for _, m in accepts)
    assert leader.coordinator.counters["certified"] == 8


def test_ready_ends_the_step_what_it_produced_is_in_that_ready() -> None:
    """What a worker hears of another shard goes to its fellow in the same ``ready()`` as
    the step that heard it, however many messages that step took."""
    peers = [f"unit/{unit}" for unit in range(4)]  # units 0, 1: shard 0; 2, 3: shard 1
    leader = ShardLeader(
        0, peers, WorkerPartitioner(Partitioner(2), 2), Procedures(), counter=LocalCounter()
    )
    leader.ready()
    now = DEFAULT_SETTINGS.fellow_gossip_spacing_ns  # the regular gossip is not due yet
    leader.receive(now, peers[2], ValidateReply(1, 2, True, 7))
    leader.receive(now, peers[3], ValidateReply(2, 3, True, 9))
    sent = [(to, m) for to, m in leader.ready().messages if isinstance(m, Gossip)]
    assert [to for to, _ in sent] == [peers[1]] and sent[0][1].watermarks[1] == 9
    assert leader.joined_messages == 1


@pytest.mark.patches_core
def test_the_host_hands_a_received_batch_to_the_leader_at_one_instant() -> None:
    """On a real clock time moves between the messages of a batch; the host reads it once
    per batch, so a step is one instant there as in the simulator."""
    cluster = LocalCluster(shards=1)
    cluster.preload({f"t/{i}": 0 for i in range(6)})
    cluster.network.faults.receive_batch_ns = 200_000  # what arrives within 200 us: one batch
    host = cluster.cluster.server(cluster.leaders[0]).host
    clock = host.timers.clock_ns
    ticks = [0]

    def moving_clock() -> int:  # a nanosecond passes at every reading, as on a real clock
        ticks[0] += 1
        return clock() + ticks[0]

    host.timers.clock_ns = moving_clock  # type: ignore[method-assign]
    leader = cluster.replica(0)
    receive = leader.receive
    steps: list[list[int]] = []

    def recording(now_ns: int, src: str, message: Message) -> None:
        if not leader._step_open:
            steps.append([])
        steps[-1].append(now_ns)
        receive(now_ns, src, message)

    leader.receive = recording  # type: ignore[method-assign]
    submissions: list[Any] = [
        cluster.start(OPS_PROCEDURE, [["increment", f"t/{i}", 1]]) for i in range(6)
    ]
    for _ in range(1000):
        if all(s.done for s in submissions):
            break
        cluster.run_for(1 * MS)
    assert all(s.outcome is not None and s.outcome.result == [1] for s in submissions)
    joined = [step for step in steps if len(step) > 1]
    assert joined, steps
    assert all(len(set(step)) == 1 for step in steps), steps
