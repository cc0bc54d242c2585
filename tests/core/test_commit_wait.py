"""A client that waits for COMMITTED hurries its leader's stream (StreamLeader.hurry): the
batch holding its transaction's writes closes ``batch_delay_awaited_ns`` after the previous
one, not ``batch_delay_ns``; a client that goes on at certification leaves the ordinary
delay (its commit is not waited for, and fewer entries cost less CPU). One shard leader and
its followers' acceptors, wired by hand.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from store.core.errors import Status
from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner
from store.core.paxos import Accept, Acceptor, PaxosMessage, StreamSettings
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS, MS
from store.core.txn import Procedures
from store.protocol.messages import Outcome, Submit

FOLLOWERS = ["eu", "ap"]
STREAM = StreamSettings(batch_delay_ns=10 * MS, batch_delay_awaited_ns=3 * MS)


class Shard:
    def __init__(self, speculation: bool = True) -> None:
        self.now = 0
        self.leader = ShardLeader(
            0, ["us"], Partitioner(1), Procedures(), now_ns=0, followers=FOLLOWERS,
            stream_settings=STREAM,
            settings=DEFAULT_SETTINGS.with_overrides(speculation=speculation),
        )
        self.acceptors = {name: Acceptor(0) for name in FOLLOWERS}
        self.outcomes: list[Outcome] = []
        self.proposed_at: list[int] = []  # when each entry with records went out
        self.seq = 0
        self._deliver()
        self.run_until(lambda: self.leader.stream is not None and self.leader.stream.chosen_through > 0)

    def _deliver(self) -> None:
        pending = self.leader.ready().messages
        while pending:
            for dst, message in pending:
                if isinstance(message, Outcome):
                    self.outcomes.append(message)
                elif isinstance(message, PaxosMessage) and dst in self.acceptors:
                    if isinstance(message, Accept) and message.entry.records and dst == "eu":
                        self.proposed_at.append(self.now)
                    acceptor = self.acceptors[dst]
                    acceptor.handle(self.now, "us", message)
                    for _, reply in acceptor.ready().messages:
                        self.leader.handle(self.now, dst, reply)
            pending = self.leader.ready().messages

    def step(self) -> None:
        self.now += MS // 4
        self.leader.tick(self.now)
        self._deliver()

    def run_until(self, done: Callable[[], bool], limit_ns: int = 500 * MS) -> None:
        end = self.now + limit_ns
        while not done():
            assert self.now < end, "not within the limit"
            self.step()

    def put(self, key: str, want_certified: bool) -> int:
        self.seq += 1
        submit = Submit("client", self.seq, OPS_PROCEDURE, [[["put", key, self.seq]]], want_certified)
        self.leader.handle(self.now, "client", submit)
        self._deliver()
        return self.seq

    def final(self, seq: int) -> bool:
        return any(o.seq == seq and o.status == Status.COMMITTED for o in self.outcomes)


@pytest.mark.parametrize(
    ("want_certified", "speculation", "delay"),
    [
        (False, True, 3 * MS),
        (True, True, 10 * MS),
        # Without speculation a client asking for CERTIFIED hears nothing before the commit
        # either: it waits for the commit, so it hurries.
        (True, False, 3 * MS),
    ],
)
def test_a_client_waiting_for_commit_hurries_its_batch(
    want_certified: bool, speculation: bool, delay: int,
) -> None:
    hurries = delay == 3 * MS
    shard = Shard(speculation)
    first = shard.put("a", want_certified)  # a quiet stream: its batch goes at once
    shard.run_until(lambda: len(shard.proposed_at) == 1)
    shard.step()
    second = shard.put("b", want_certified)  # busy now: waits (a hurried batch: for a tick)
    shard.run_until(lambda: len(shard.proposed_at) == 2)
    first_close = shard.proposed_at[0]
    due = (first_close // delay + 1) * delay if hurries else first_close + delay
    assert shard.proposed_at[1] == due
    assert shard.leader.stream is not None
    assert shard.leader.stream.hurried == (1 if hurries else 0)
    shard.run_until(lambda: shard.final(first) and shard.final(second))
