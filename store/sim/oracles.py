"""The simulator's oracles: checks of DESIGN.md's promises that do not trust the code they judge.

``Recorder`` is the probe every simulated replica reports to (``store.core.replica.Probe``):
each certification (its full clock, the versions it read, its scans and writes), each
install in store order, and each replica's vector watermark after every step that raised it.
From that record:

* **dominance** (DESIGN.md §3, Mako §4.2): at certification, the clock of every version a
  transaction read is at or below its own (full) clock;
* **dependency closure**: after every step that raised any replica's vector watermark,
  the set of certified transactions whose full clocks are at or below what is then known
  durable (the element-wise maximum of every replica's vector watermark) is closed under
  dependency — write-read (a version read), write-write (the version overwritten) and
  read-write (a later writer of a key a transaction read, or of a key inserted into a
  range it scanned). That closure is what makes a follower's snapshot a consistent cut and
  what lets recovery roll back everything that depended on a lost transaction. The
  dependencies are rebuilt from the record (install order per key, versions read), not
  taken from the clocks. Full clocks and the cluster-wide maximum are used because a sparse
  clock drops entries that *some* replica knew durable: judged against one replica's stale
  vector, that would look like a gap when it is none. The maximum only grows, so "closed
  at every point" is checked per dependency: the first point that admits the dependent
  transaction must admit its dependency too;
* **snapshots**: a follower's snapshot at vector watermark ``vw`` shows, for every key, the
  newest installed version whose clock is at or below ``vw`` — exactly the transactions
  under its watermark — and ``vw`` itself is durable (the durability oracle);
* **durability** (``DurabilityOracle``, DESIGN.md §1): when a client hears COMMITTED, every
  counter of every shard entry of the clock is aborted or inside a Paxos entry that a
  majority of that shard's acceptors accepted — read from the acceptors themselves;
* **convergence** (``divergence``): after the faults heal, every follower holds exactly its
  leader's committed data.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Any

from store.core.coordinator import Certification
from store.core.follower import ShardFollower, SnapshotReply, leader_data
from store.core.messages import Write
from store.core.replica import ShardLeader
from store.core.vclock import EMPTY, VectorClock

VIOLATIONS_KEPT_MAX = 20


class Recorder:
    """Implements ``store.core.replica.Probe`` for the oracles (see the module doc)."""

    def __init__(self, shard_of: Callable[[str], int]) -> None:
        self.shard_of = shard_of
        self._step = 0  # orders certifications and installs
        self.certifications: dict[int, Certification] = {}
        self.certified_step: dict[int, int] = {}
        self.clocks: dict[int, VectorClock] = {}  # sparse clocks of installed writers
        # Per key, its versions in install order: (writer txn id, value, deleted, vc, step).
        self.versions: dict[str, list[tuple[int, Any, bool, VectorClock, int]]] = {}
        self.preloaded: dict[str, Any] = {}
        # What is known durable cluster-wide (the maximum of every replica's vector
        # watermark), after every step that raised it.
        self.known: dict[int, int] = {}
        self.known_chain: list[dict[int, int]] = []
        # Per transaction, the point of the chain when it was certified (its first install or
        # its coordinator's decision, whichever came first).
        self.known_at_certification: dict[int, int] = {}
        self.dominance: list[str] = []
        self.snapshots: list[str] = []
        self.snapshots_checked = 0

    # ---- the probe -----------------------------------------------------------------------

    def certified(self, certification: Certification) -> None:
        self._step += 1
        txn_id = certification.txn_id
        self.certifications[txn_id] = certification
        self.certified_step[txn_id] = self._step
        self.known_at_certification.setdefault(txn_id, len(self.known_chain) - 1)
        full = certification.full
        for key, writer in certification.reads:
            writer_vc = self.clocks.get(writer)
            if writer and writer_vc is not None and not writer_vc <= full:
                self._note(self.dominance, f"txn {txn_id} {full} read {key!r} from {writer} {writer_vc}")

    def installed(self, shard: int, txn_id: int, writes: list[Write], vc: VectorClock) -> None:
        self._step += 1
        # A single-shard transaction is certified where it installs, before its coordinator
        # hears of it: what was known durable then is what its clock could leave out.
        self.known_at_certification.setdefault(txn_id, len(self.known_chain) - 1)
        self.clocks[txn_id] = vc
        for key, value, deleted in writes:
            self.versions.setdefault(key, []).append((txn_id, value, deleted, vc, self._step))

    def watermark(self, address: str, vw: Mapping[int, int]) -> None:
        known = self.known
        raised = False
        for shard, mark in vw.items():
            if mark > known.get(shard, 0):
                known[shard] = mark
                raised = True
        if raised:
            self.known_chain.append(dict(known))

    def preload(self, key: str, value: Any) -> None:
        self.preloaded[key] = value

    # ---- snapshots -----------------------------------------------------------------------

    def check_snapshot(self, shard: int, keys: list[str], reply: SnapshotReply) -> None:
        """A follower's snapshot shows, per key, the newest version at or below its ``vw``."""
        self.snapshots_checked += 1
        vw = dict(reply.vw.items())
        for key, shown in zip(keys, reply.values, strict=True):
            expected = self.preloaded.get(key)
            for _, value, deleted, vc, _ in reversed(self.versions.get(key, [])):
                if vc.le_watermark(vw):
                    expected = None if deleted else value
                    break
            if shown != expected:
                self._note(
                    self.snapshots,
                    f"follower of shard {shard} at {reply.vw} showed {key!r} = {shown!r}, "
                    f"the transactions under that watermark wrote {expected!r}",
                )

    # ---- dependency closure --------------------------------------------------------------

    def dependencies(self) -> list[tuple[int, int, str, str]]:
        """(dependent, dependency, kind, key) for every dependency between certified
        transactions, rebuilt from what was read and the install order of every key."""
        certified = self.certifications
        order: dict[str, list[int]] = {k: [v[0] for v in vs] for k, vs in self.versions.items()}
        position = {
            key: {writer: i for i, writer in enumerate(writers)} for key, writers in order.items()
        }
        edges: list[tuple[int, int, str, str]] = []

        def next_writer(key: str, after: int) -> int | None:
            writers = order.get(key)
            if not writers:
                return None
            if after == 0:
                return writers[0]
            i = position[key].get(after)
            return writers[i + 1] if i is not None and i + 1 < len(writers) else None

        for txn_id, cert in certified.items():
            for key, writer in cert.reads:
                if writer and writer in certified:
                    edges.append((txn_id, writer, "wr", key))
                later = next_writer(key, writer)
                if later is not None and later != txn_id and later in certified:
                    edges.append((later, txn_id, "rw", key))
            for key in cert.writes:
                i = position.get(key, {}).get(txn_id)
                if i:
                    previous = order[key][i - 1]
                    if previous in certified:
                        edges.append((txn_id, previous, "ww", key))
        edges.extend(self._phantom_dependencies())
        return edges

    def _phantom_dependencies(self) -> list[tuple[int, int, str, str]]:
        """A key inserted into a range a transaction scanned, after it was certified, by a
        later writer: that writer depends on the scan (DESIGN.md §3, phantoms). Inserts
        between the scan's validation and its certification are left out, so every edge
        here is a true one."""
        keys = sorted(self.versions)
        edges = []
        for txn_id, cert in self.certifications.items():
            step = self.certified_step[txn_id]
            for shard, lo, hi, limit, seen in cert.scans:
                seen_set = set(seen)
                end = bisect.bisect_right(keys, seen[-1]) if len(seen) >= limit else bisect.bisect_left(keys, hi)
                for key in keys[bisect.bisect_left(keys, lo) : end]:
                    if key in seen_set or self.shard_of(key) != shard:
                        continue
                    writer = next((v[0] for v in self.versions[key] if v[4] > step), None)
                    if writer is not None and writer != txn_id and writer in self.certifications:
                        edges.append((writer, txn_id, "rw-phantom", key))
        return edges

    def uncovered_dependencies(self) -> list[str]:
        """Dependencies a clock does not cover (DESIGN.md §3, extended to every kind of
        dependency): a transaction's full clock must be at or above the clock of each one
        it depends on, except for entries already known durable when it was certified
        (those a sparse clock, or the garbage collection of read stamps, may drop)."""
        violations: list[str] = []
        chain = self.known_chain
        for dependent, dependency, kind, key in self.dependencies():
            cert = self.certifications[dependent]
            at = self.known_at_certification[dependent]
            known = chain[at] if at >= 0 else {}
            needed = self.clocks.get(dependency) or self.certifications[dependency].vc
            for shard, counter in needed.items():
                if counter > cert.full[shard] and counter > known.get(shard, 0):
                    self._note(
                        violations,
                        f"txn {dependent} {cert.full} {kind}-depends on txn {dependency} "
                        f"{needed} through {key!r}, but its clock misses shard {shard}",
                    )
                    break
        return violations

    def closure_violations(self) -> list[str]:
        """Points at which a transaction was admitted before one it depends on."""
        chain = self.known_chain
        full = {txn_id: cert.full for txn_id, cert in self.certifications.items()}
        admitted: dict[int, int] = {}

        def admission(txn_id: int) -> int:
            """The first point of the chain at or above the transaction's full clock."""
            found = admitted.get(txn_id)
            if found is None:
                clock = full.get(txn_id, EMPTY)
                lo, hi = 0, len(chain)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if clock.le_watermark(chain[mid]):
                        hi = mid
                    else:
                        lo = mid + 1
                found = admitted[txn_id] = lo
            return found

        violations: list[str] = []
        for dependent, dependency, kind, key in self.dependencies():
            at = admission(dependent)
            if at < len(chain) and admission(dependency) > at:
                self._note(
                    violations,
                    f"at {chain[at]} txn {dependent} {full[dependent]} was admitted but not "
                    f"txn {dependency} {full[dependency]}, which it {kind}-depends on "
                    f"through {key!r}",
                )
        return violations

    @staticmethod
    def _note(violations: list[str], text: str) -> None:
        if len(violations) < VIOLATIONS_KEPT_MAX:
            violations.append(text)
        elif len(violations) == VIOLATIONS_KEPT_MAX:
            violations.append("...")


class DurabilityOracle:
    """DESIGN.md §1's durability promise, judged from the acceptors (see the module doc)."""

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

    def check(self, label: str, vc: VectorClock) -> None:
        """Called when a client is told COMMITTED (and for every snapshot's watermark)."""
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
                    f"{label} with {vc}: shard {shard} counter {counter + 1} "
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
