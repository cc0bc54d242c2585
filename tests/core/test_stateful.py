"""Hypothesis drives the certification cores with random interleavings (DESIGN.md §8.2).

Three shard leaders are driven directly, with no simulator: a pool holds every message in
flight, and each step submits a transaction, delivers, duplicates or drops any message in
the pool, or advances time. After every step the invariants of DESIGN.md §3 must hold:

* dominance: a certified transaction's vector clock dominates the clock of every version
  it read (Mako §4.2), and at the end, of every transaction it depends on in any way, with
  the set under every watermark closed under dependency (``store.sim.oracles``);
* every lock in every store is owned by a transaction that its participant still holds;
* a key's committed versions have strictly increasing clocks on the key's own shard.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from store.core.errors import Status
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.settings import MS
from store.core.txn import Procedures
from store.protocol.messages import Message, Outcome, Submit
from store.sim.oracles import Recorder

SHARDS = 3
KEYS = [f"k/{i}" for i in range(6)]

micro_ops = st.one_of(
    st.tuples(st.just("get"), st.sampled_from(KEYS)).map(list),
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(0, 9)).map(list),
    st.tuples(st.just("append"), st.sampled_from(KEYS), st.integers(0, 99)).map(list),
    st.tuples(st.just("scan"), st.just("k/"), st.just("k0"), st.integers(1, 4)).map(list),
)


class CertificationMachine(RuleBasedStateMachine):
    @initialize()
    def build(self) -> None:
        self.now = 0
        self.leaders_addresses = [f"leader/{s}" for s in range(SHARDS)]
        self.partitioner = Partitioner(SHARDS)
        self.recorder = Recorder(self.partitioner.shard_of)
        self.leaders = [
            ShardLeader(
                s, self.leaders_addresses, self.partitioner, Procedures(), probe=self.recorder
            )
            for s in range(SHARDS)
        ]
        self.by_address = {leader.address: leader for leader in self.leaders}
        self.pool: list[tuple[str, str, Message]] = []
        self.outcomes: list[Outcome] = []
        self.seq = 0

    def collect(self, leader: ShardLeader) -> None:
        for dst, message in leader.ready().messages:
            if dst.startswith("client"):
                assert isinstance(message, Outcome)
                self.outcomes.append(message)
            else:
                self.pool.append((leader.address, dst, message))

    @rule(ops=st.lists(micro_ops, min_size=1, max_size=4), shard=st.integers(0, SHARDS - 1))
    def submit(self, ops: list[Any], shard: int) -> None:
        self.seq += 1
        self.pool.append(("client/0", self.leaders_addresses[shard], Submit("c", self.seq, "", [ops], False)))

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        if not self.pool:
            return
        src, dst, message = self.pool.pop(data.draw(st.integers(0, len(self.pool) - 1)))
        leader = self.by_address[dst]
        leader.handle(self.now, src, message)
        self.collect(leader)

    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        if self.pool:
            self.pool.append(self.pool[data.draw(st.integers(0, len(self.pool) - 1))])

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        if self.pool:
            self.pool.pop(data.draw(st.integers(0, len(self.pool) - 1)))

    @rule(advance_ms=st.integers(1, 30))
    def tick(self, advance_ms: int) -> None:
        self.now += advance_ms * MS
        for leader in self.leaders:
            leader.tick(self.now)
            self.collect(leader)

    @invariant()
    def clocks_dominate_what_was_read(self) -> None:
        recorder = getattr(self, "recorder", None)
        assert recorder is None or not recorder.dominance

    @invariant()
    def every_lock_is_held_by_a_live_participant_transaction(self) -> None:
        for leader in getattr(self, "leaders", []):
            for key in leader.store.all_keys() + [k for k in KEYS]:
                owner = leader.store.lock_owner(key)
                if owner is not None:
                    assert leader.participant.holds(owner), f"{key} locked by finished {owner}"

    @invariant()
    def versions_of_a_key_grow_on_its_shard(self) -> None:
        for leader in getattr(self, "leaders", []):
            for key in leader.store.all_keys():
                counters = [v.vc[leader.shard] for v in leader.store.chain(key) if v.txn_id]
                assert counters == sorted(counters) and len(set(counters)) == len(counters)

    def teardown(self) -> None:
        # Once delivery is reliable again, everything settles: no lock stays held and
        # every outcome a client saw is one of the defined codes.
        if not hasattr(self, "leaders"):
            return
        for _ in range(200):
            self.now += 25 * MS
            for leader in self.leaders:
                leader.tick(self.now)
                self.collect(leader)
            while self.pool:
                src, dst, message = self.pool.pop(0)
                leader = self.by_address[dst]
                leader.handle(self.now, src, message)
                self.collect(leader)
        for leader in self.leaders:
            assert leader.store.locked_count() == 0
        assert all(Status(o.status) in Status for o in self.outcomes)
        assert not self.recorder.dominance
        assert not self.recorder.uncovered_dependencies()
        assert not self.recorder.closure_violations()


CertificationMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=60, deadline=None
)
TestCertification = CertificationMachine.TestCase
