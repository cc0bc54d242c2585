"""Randomized simulation of one Paxos stream across three regions (DESIGN.md §4, §5).

Each seed builds regions ``us`` (the first leader), ``eu`` and ``ap`` (acceptor + learner)
on the simulator's network with per-region-pair latency, message loss, duplication and
reordering; every message crosses the wire encoded (``store.core.paxos.encode``/``decode``).
During the load a region may be partitioned away and healed, and on most seeds the leader
is cut off (or crashed) and a follower takes the stream over with a higher ballot,
re-proposing what phase 1 finds, filling holes with no-ops and ending the old epoch with an
INF marker ("Paxos Made Simple" §3; DESIGN.md §5 step 2-3).

Checked on every seed:

* safety: no two values are ever chosen for one slot — by an oracle that counts acceptor
  votes per (slot, ballot), not by trusting the roles — and every leader and learner reports
  exactly those values, so the regions' logs are prefixes of one sequence;
* liveness after heal: every record appended to the final leader is delivered in every live
  region exactly once, and heartbeats are still being delivered at the end;
* batching: entries hold many records; no-op filling happens (counted over the seeds);
* the finalized watermark of the old epoch is final after a takeover and covers only
  records inside the prefix before the first no-op or INF.

A failing seed prints the line that replays it.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from store.core.paxos import (
    Accept,
    Accepted,
    Acceptor,
    Ballot,
    Entry,
    EntryKind,
    PaxosMessage,
    Phase,
    StreamFollower,
    StreamLeader,
    StreamReady,
    StreamSettings,
    decode,
    encode,
    finalized_watermark,
)
from store.sim.loop import Simulator
from store.sim.network import MS, Faults, Link, Network

REGIONS = ("us", "eu", "ap")
QUORUM = 2
STREAM = 3
SEEDS = int(os.environ.get("MERIDIAN_PAXOS_SEEDS", "300"))


class VoteOracle:
    """Counts acceptor votes per (slot, ballot): a value is chosen once a majority of
    regions accepted it at one ballot. Asserts a slot never has two chosen values."""

    def __init__(self) -> None:
        self.votes: dict[tuple[int, Ballot], set[str]] = {}
        self.value: dict[tuple[int, Ballot], Entry] = {}
        self.chosen: dict[int, Entry] = {}

    def vote(self, region: str, slot: int, ballot: Ballot, entry: Entry) -> None:
        key = (slot, ballot)
        assert self.value.setdefault(key, entry) == entry, "two values in one ballot"
        voters = self.votes.setdefault(key, set())
        voters.add(region)
        if len(voters) >= QUORUM:
            assert self.chosen.setdefault(slot, entry) == entry, (
                f"two different values chosen for slot {slot}"
            )


class RecordingAcceptor(Acceptor):
    def __init__(self, region: str, oracle: VoteOracle, settings: StreamSettings) -> None:
        super().__init__(STREAM, settings)
        self.region = region
        self.oracle = oracle

    def accept(self, message: Accept) -> Any:
        reply = super().accept(message)
        if isinstance(reply, Accepted):
            self.oracle.vote(self.region, message.slot, message.ballot, message.entry)
        return reply


@dataclass
class RegionLog:
    """What one region reported chosen, in slot order from 0, and when."""

    entries: list[Entry] = field(default_factory=list)
    times: list[int] = field(default_factory=list)


class Host:
    """The simulator's adapter for one region's role (leader or follower) of the stream."""

    def __init__(self, run: Run, region: str, role: StreamLeader | StreamFollower) -> None:
        self.run = run
        self.region = region
        self.role = role
        self.log = RegionLog()
        self._timer_at: int | None = None

    def deliver(self, now_ns: int, src: str, data: Any) -> None:
        message = decode(data)
        assert isinstance(message, PaxosMessage)
        self.role.handle(now_ns, src, message)
        self.flush()

    def wake(self, when_ns: int) -> None:
        if self._timer_at != when_ns:
            return
        self._timer_at = None
        self.role.tick(self.run.sim.now_ns)
        self.flush()

    def flush(self) -> None:
        ready: StreamReady = self.role.ready()
        encoded: dict[int, bytes] = {}  # one encoding per message object, however many dsts
        for dst, message in ready.messages:
            data = encoded.get(id(message))
            if data is None:
                data = encoded[id(message)] = encode(message)
            self.run.network.send_stream(self.region, dst, data)
        for slot, entry in ready.chosen:
            assert slot == len(self.log.entries), f"{self.region}: slot {slot} out of order"
            oracle = self.run.oracle.chosen.get(slot)
            assert oracle == entry, f"{self.region} reports slot {slot} not chosen so"
            self.log.entries.append(entry)
            self.log.times.append(self.run.sim.now_ns)
        role = self.role
        if isinstance(role, StreamLeader) and role.phase is Phase.DEPOSED:
            # A deposed leader's region goes on as a follower with the same acceptor.
            self.role = StreamFollower(STREAM, self.run.settings, acceptor=role.acceptor,
                                       first_slot=role.chosen_through)
            self.role.learner.leader = None
        wake_at = ready.wake_at
        if wake_at is not None and (self._timer_at is None or wake_at < self._timer_at):
            self._timer_at = wake_at
            self.run.sim.at(wake_at, self.wake, wake_at)


class Run:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.sim = Simulator(seed)
        rng = self.sim.rng
        self.rng = rng
        self.network = Network(self.sim, Faults(loss=rng.choice([0.0, 0.02, 0.08]),
                                                duplicate=0.02, reorder=0.05))
        for i, a in enumerate(REGIONS):
            for b in REGIONS[i + 1:]:
                self.network.set_link(a, b, Link(rng.randrange(5, 25) * MS, 2 * MS))
        self.settings = StreamSettings(
            batch_size_max=rng.choice([8, 32, 400]),
            batch_delay_ns=2 * MS,
            heartbeat_interval_ns=10 * MS,
            slots_in_flight_max=rng.choice([4, 16, 64]),
            accept_retry_ns=80 * MS,
            prepare_retry_ns=80 * MS,
            fetch_retry_ns=60 * MS,
            promise_entries_max=rng.choice([8, 1024]),
            fetch_entries_max=rng.choice([16, 256]),
        )
        self.oracle = VoteOracle()
        self.hosts: dict[str, Host] = {}
        for region in REGIONS:
            acceptor = RecordingAcceptor(region, self.oracle, self.settings)
            role: StreamLeader | StreamFollower
            if region == "us":
                role = StreamLeader(STREAM, "us", ["eu", "ap"], Ballot(1, "us"), self.settings,
                                    acceptor=acceptor, counters_in_order=True)
            else:
                role = StreamFollower(STREAM, self.settings, acceptor=acceptor)
            self.hosts[region] = Host(self, region, role)
            self.network.add(region, region)
            self.network.listen(region, self.hosts[region])
        self.leader_region = "us"
        self.counter = 0
        self.appended: dict[str, list[int]] = {}  # leader region -> counters appended
        self.counter_of_record: dict[str, int] = {}
        self.takeover_at: int | None = None
        self.crashed: str | None = None
        self.load_end_ns = 400 * MS
        self.heal_ns = 600 * MS
        self.end_ns = 1800 * MS

    # ---- the script --------------------------------------------------------------------

    def schedule(self) -> None:
        rng = self.rng
        for host in self.hosts.values():
            self.sim.at(0, host.flush)
        when = 0
        while when < self.load_end_ns:
            when += rng.randrange(100_000, 3_000_000)
            self.sim.at(when, self.append)
        if rng.random() < 0.5:  # one region cut off for a while
            region = rng.choice(REGIONS)
            start = rng.randrange(20, 300) * MS
            self.sim.at(start, self.isolate, region)
            self.sim.at(start + rng.randrange(20, 200) * MS, self.heal_if_no_takeover)
        if rng.random() < 0.75:
            self.takeover_at = rng.randrange(100, 350) * MS
            self.sim.at(self.takeover_at, self.take_over, rng.choice(["eu", "ap"]),
                        rng.choice(["partition", "partition", "crash", "duel"]))
        self.sim.at(self.heal_ns, self.network.heal)

    def append(self) -> None:
        host = self.hosts[self.leader_region]
        leader = host.role
        if not isinstance(leader, StreamLeader) or not leader.can_append():
            return
        self.counter += 1
        record = [self.seed, self.counter]
        self.appended.setdefault(self.leader_region, []).append(self.counter)
        leader.append(self.sim.now_ns, record, self.counter)
        host.flush()

    def isolate(self, region: str) -> None:
        if self.takeover_at is None or self.sim.now_ns < self.takeover_at:
            others = [r for r in REGIONS if r != region]
            self.network.partition([region], others)

    def heal_if_no_takeover(self) -> None:
        if self.takeover_at is None or self.sim.now_ns < self.takeover_at:
            self.network.heal()

    def take_over(self, region: str, mode: str) -> None:
        """``region`` leads with a higher ballot while the old leader is cut off
        (``partition``), crashed (``crash``) or still running and proposing (``duel``)."""
        self.network.heal()
        old = self.leader_region
        if mode == "crash":
            self.network.crash(old)
            self.crashed = old
        elif mode == "partition":
            self.network.partition([old], [r for r in REGIONS if r != old])
        host = self.hosts[region]
        follower = host.role
        assert isinstance(follower, StreamFollower)
        delivered = len(host.log.entries)
        assert follower.learner.delivered_through == delivered
        leader = StreamLeader(
            STREAM, region, [r for r in REGIONS if r != region], Ballot(2, region),
            self.settings, now_ns=self.sim.now_ns, acceptor=follower.acceptor,
            first_slot=delivered, known_chosen=dict(enumerate(host.log.entries)),
            counters_in_order=True,
        )
        leader.append_inf(self.sim.now_ns)  # the old epoch ends on this stream
        host.role = leader
        self.leader_region = region
        host.flush()

    # ---- checks ------------------------------------------------------------------------

    def check(self) -> dict[str, int]:
        live = [r for r in REGIONS if r != self.crashed]
        logs = {r: self.hosts[r].log.entries for r in REGIONS}
        longest = max(logs.values(), key=len)
        for region, log in logs.items():
            assert log == longest[: len(log)], f"{region} delivered a different prefix"
        final = self.hosts[self.leader_region].log.entries
        delivered_counters = Counter(c for e in final for c in e.counters)
        assert all(n == 1 for n in delivered_counters.values()), "a record delivered twice"
        # Learners trail the leader by the commit announcements still on the wire.
        leader_log = self.hosts[self.leader_region].log
        settled = sum(t <= self.end_ns - 300 * MS for t in leader_log.times)
        settled_counters = {c for e in final[:settled] for c in e.counters}
        assert settled_counters == set(delivered_counters), "the load was chosen too late"
        for region in live:
            log = self.hosts[region].log
            assert len(log.entries) >= settled, f"{region} lags after heal"
            assert log.times[-1] >= self.end_ns - 300 * MS, f"{region}: heartbeats stopped"
            counters = {c for e in log.entries for c in e.counters}
            assert counters >= settled_counters, f"{region} misses records"
        for counter in self.appended.get(self.leader_region, []):
            assert counter in delivered_counters, f"record {counter} never chosen"
        if self.takeover_at is None:
            assert set(self.appended["us"]) <= set(delivered_counters)
        else:
            finalized = finalized_watermark(enumerate(final))
            assert finalized.final, "the old epoch has no end after takeover"
            assert finalized.end_slot is not None
            in_prefix = {c for e in final[: finalized.end_slot] for c in e.counters}
            old = [c for c in self.appended.get("us", []) if c <= finalized.watermark]
            assert set(old) <= in_prefix, "finalized watermark covers a lost record"
        return {
            "noops": sum(e.kind == EntryKind.NOOP for e in final),
            "max_records": max((len(e.records) for e in final), default=0),
            "batch_size_max": self.settings.batch_size_max,
            "heartbeats": sum(e.is_heartbeat for e in final),
            "takeover": int(self.takeover_at is not None),
        }


def run_seed(seed: int) -> dict[str, int]:
    run = Run(seed)
    run.schedule()
    try:
        run.sim.run_until(run.end_ns, events_max=2_000_000)
        return run.check()
    except AssertionError as error:
        raise AssertionError(
            f"{error}\nreproduce with: MERIDIAN_PAXOS_SEEDS=1 python3 -c "
            f"'from tests.core.test_paxos_sim import run_seed; run_seed({seed})'"
        ) from error


@pytest.mark.patches_core
def test_stream_is_safe_and_live_over_many_seeds() -> None:
    totals: Counter[str] = Counter()
    full_batches = 0
    for seed in range(SEEDS):
        stats = run_seed(seed)
        totals.update(stats)
        full_batches += stats["max_records"] == stats["batch_size_max"]
    # What the seeds exercised (300 seeds: about 215 takeovers, no-ops on about 24 seeds,
    # full batches on about 165); the thresholds leave room for other seed counts.
    assert totals["takeover"] > SEEDS // 3
    assert totals["heartbeats"] > 0
    assert full_batches > SEEDS // 4, "batches rarely fill up"
    if SEEDS >= 100:
        assert totals["noops"] > 0, "no seed exercised no-op filling"


@pytest.mark.patches_core
@pytest.mark.parametrize("seed", [0, 1])
def test_a_seed_replays_exactly(seed: int) -> None:
    assert run_seed(seed) == run_seed(seed)
