"""Regions for the simulator: follower replicas, wide-area links, and the durability oracle.

The oracle checks DESIGN.md §1's durability promise independently of the code it judges:
when a client is told COMMITTED, every shard entry of the transaction's vector clock must
be durable — every counter at or below it either aborted, or inside an entry that a majority
of that shard's acceptors (the leader's own and the followers') have accepted. It reads the
acceptors' state directly, not the watermarks the replicas compute.
"""

from __future__ import annotations

from typing import Any

from store.core.follower import ShardFollower, leader_data
from store.core.replica import ShardLeader
from store.core.vclock import VectorClock

REGIONS = ("us", "eu", "ap")


def follower_address(region: str, shard: int) -> str:
    return f"{region}/follower/{shard}"


class DurabilityOracle:
    def __init__(self, leaders: list[ShardLeader], followers: dict[int, list[ShardFollower]]) -> None:
        self.leaders = leaders
        self.followers = followers
        self.verified: dict[int, int] = {}
        self.violations: list[str] = []
        self.checked = 0

    def _acceptors(self, shard: int) -> list[Any]:
        leader = self.leaders[shard]
        assert leader.stream is not None
        return [leader.stream.acceptor] + [f.stream.acceptor for f in self.followers[shard]]

    def _durable_counters(self, shard: int) -> set[int]:
        acceptors = self._acceptors(shard)
        majority = len(acceptors) // 2 + 1
        votes: dict[int, int] = {}
        for acceptor in acceptors:
            seen: set[int] = set()
            slot = 0
            misses = 0
            # Slots are dense from 0; stop after a long run of empty ones.
            while misses < 256:
                accepted = acceptor.accepted(slot)
                slot += 1
                if accepted is None:
                    misses += 1
                    continue
                misses = 0
                seen.update(accepted[1].counters)
            for counter in seen:
                votes[counter] = votes.get(counter, 0) + 1
        return {counter for counter, count in votes.items() if count >= majority}

    def _aborted(self, shard: int) -> set[int]:
        return self.leaders[shard].participant.aborted_counters()

    def check(self, txn_label: str, vc: VectorClock) -> None:
        """Called when a client is told COMMITTED."""
        self.checked += 1
        for shard, needed in vc.items():
            start = self.verified.get(shard, 0)
            if needed <= start:
                continue
            durable = self._durable_counters(shard) | self._aborted(shard)
            counter = start
            while counter < needed and counter + 1 in durable:
                counter += 1
            self.verified[shard] = counter
            if counter < needed:
                self.violations.append(
                    f"{txn_label} committed with {vc}: shard {shard} counter {counter + 1} "
                    "is neither aborted nor accepted by a majority"
                )
                return


def divergence(leaders: list[ShardLeader], followers: dict[int, list[ShardFollower]]) -> list[str]:
    """After the load stops and faults heal: each follower holds exactly its leader's data."""
    problems = []
    for leader in leaders:
        expected = leader_data(leader.store, leader.vw.entries)
        everything = leader_data(leader.store, {s: 1 << 62 for s in range(len(leaders))})
        if expected != everything:
            problems.append(f"shard {leader.shard}: leader still holds uncommitted versions")
        for follower in followers[leader.shard]:
            held = follower.visible_data()
            if held != expected:
                missing = sorted(set(expected) - set(held))[:3]
                wrong = sorted(k for k in expected if k in held and held[k] != expected[k])[:3]
                extra = sorted(set(held) - set(expected))[:3]
                problems.append(
                    f"follower {follower.address}: missing {missing}, wrong {wrong}, extra {extra}"
                )
    return problems
