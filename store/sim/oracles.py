"""The simulator's oracles: checks of DESIGN.md's promises that do not trust the code they judge.

``Recorder`` is the probe every simulated replica reports to (``store.core.replica.Probe``):
each certification (its full clock, the versions it read, its scans and writes), each
install in store order, and each replica's vector watermark after every step that raised it.
From that record:

* **dominance** (DESIGN.md §3, Mako §4.2): at certification, the clock of every version a
  transaction read is at or below its own (full) clock, except for entries then known
  durable (a participant leaves those out of the clocks it answers with);
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
  leader's committed data;
* **recovery** (docs/recovery.md): no transaction a client was told COMMITTED is ever rolled
  back anywhere (``lost_committed``), and every transaction that depends on a rolled-back
  one is rolled back too (``rollback_violations``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sortedcontainers import SortedList

from store.core.coordinator import Certification
from store.core.epoch import EPOCH_SHIFT
from store.core.follower import ShardFollower, leader_data
from store.core.replica import ShardLeader
from store.core.vclock import EMPTY, VectorClock
from store.protocol.messages import SnapshotReply, Write

VIOLATIONS_KEPT_MAX = 20


class Recorder:
    """Implements ``store.core.replica.Probe`` for the oracles (see the module doc)."""

    def __init__(self, shard_of: Callable[[str], int]) -> None:
        self.shard_of = shard_of
        # Every counter value drawn, per shard, with the unit (the shard's worker) that drew
        # it: what the durability oracle walks.
        self.draws: dict[int, SortedList] = {}
        self._step = 0  # orders certifications and installs
        self.certifications: dict[int, Certification] = {}
        self.certified_step: dict[int, int] = {}
        self.clocks: dict[int, VectorClock] = {}  # sparse clocks of installed writers
        # Per key, its versions in install order: (writer txn id, value, deleted, vc, step).
        self.versions: dict[str, list[tuple[int, Any, bool, VectorClock, int]]] = {}
        self.preloaded: dict[str, Any] = {}
        # (key, writer) -> the writer of the version it overwrote in the store it installed in.
        self.overwrote: dict[tuple[str, int], int] = {}
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
        self._snapshots: list[tuple[int, list[str], SnapshotReply, int]] = []
        # Recovery: transactions rolled back (by any replica), and the ids clients were told
        # COMMITTED, by (client id, sequence number).
        self.rolled_back_txns: dict[int, int] = {}  # txn id -> step it was first rolled back
        self.by_client: dict[tuple[str, int], int] = {}
        self.committed: list[tuple[str, int]] = []

    # ---- the probe -----------------------------------------------------------------------

    def certified(self, certification: Certification) -> None:
        self._step += 1
        txn_id = certification.txn_id
        self.certifications[txn_id] = certification
        self.certified_step[txn_id] = self._step
        self.by_client[certification.client] = txn_id
        self.known_at_certification.setdefault(txn_id, len(self.known_chain) - 1)
        full = certification.full
        known = self.known
        for key, writer in certification.reads:
            writer_vc = self.clocks.get(writer)
            if writer and writer_vc is not None and not writer_vc <= full and any(
                counter > full[shard] and counter > known.get(shard, 0)
                for shard, counter in writer_vc.items()
            ):
                self._note(self.dominance, f"txn {txn_id} {full} read {key!r} from {writer} {writer_vc}")

    def installed(
        self, shard: int, txn_id: int, writes: list[Write], vc: VectorClock,
        overwritten: list[int],
    ) -> None:
        self._step += 1
        # A single-shard transaction is certified where it installs, before its coordinator
        # hears of it: what was known durable then is what its clock could leave out.
        self.known_at_certification.setdefault(txn_id, len(self.known_chain) - 1)
        self.clocks[txn_id] = vc
        for (key, value, deleted), previous in zip(writes, overwritten, strict=True):
            self.versions.setdefault(key, []).append((txn_id, value, deleted, vc, self._step))
            self.overwrote[(key, txn_id)] = previous

    def drew(self, clock: int, unit: int, counter: int) -> None:
        draws = self.draws.get(clock)
        if draws is None:
            draws = self.draws[clock] = SortedList()
        draws.add((counter, unit))

    def watermark(self, address: str, vw: Mapping[int, int]) -> None:
        known = self.known
        raised = False
        for shard, mark in vw.items():
            if mark > known.get(shard, 0):
                known[shard] = mark
                raised = True
        if raised:
            self.known_chain.append(dict(known))

    def rolled_back(self, address: str, txn_id: int) -> None:
        self._step += 1
        self.rolled_back_txns.setdefault(txn_id, self._step)

    def preload(self, key: str, value: Any) -> None:
        self.preloaded[key] = value

    def client_committed(self, txn: tuple[str, int]) -> None:
        """A client was told this transaction id COMMITTED."""
        self.committed.append(txn)

    def conclude(self, fvw: Mapping[int, Mapping[int, int]]) -> None:
        """Takes the FVW of every ended epoch at the end of a run: a transaction of an
        ended epoch whose clock is not at or below its FVW is *doomed* (recovery rolls it
        back wherever it is, also where no replica is left to say so: the crashed leader's
        own transactions)."""
        self.doomed = {
            txn_id for txn_id, cert in self.certifications.items()
            if cert.epoch in fvw and not cert.vc.le_watermark(fvw[cert.epoch])
        }

    doomed: set[int] = set()

    def _gone(self) -> set[int]:
        return self.doomed | set(self.rolled_back_txns)

    def lost_committed(self) -> list[str]:
        """Transactions a client was told COMMITTED that recovery rolled back."""
        lost: list[str] = []
        gone = self._gone()
        for txn in self.committed:
            txn_id = self.by_client.get(txn)
            if txn_id is not None and txn_id in gone:
                self._note(lost, f"{txn[0]}#{txn[1]} (txn {txn_id}) was committed, then rolled back")
        return lost

    def rollback_violations(self) -> list[str]:
        """A replica rolled back what the FVW does not doom, or left what depends on a
        rolled-back transaction in place."""
        violations: list[str] = []
        for txn_id in sorted(set(self.rolled_back_txns) - self.doomed):
            self._note(violations, f"txn {txn_id} was rolled back although at or below its FVW")
        gone = self._gone()
        if not gone:
            return violations
        for dependent, dependency, kind, key in self.dependencies():
            # What read or overwrote a rolled-back version must go too; a read-write
            # dependency on one does not matter (it read before the write it missed).
            if kind in ("wr", "ww") and dependency in gone and dependent not in gone:
                self._note(
                    violations,
                    f"txn {dependent} stays although txn {dependency}, which it "
                    f"{kind}-depends on through {key!r}, was rolled back",
                )
        return violations

    # ---- snapshots -----------------------------------------------------------------------

    def check_snapshot(self, shard: int, keys: list[str], reply: SnapshotReply) -> None:
        """A follower's snapshot shows, per key, the newest version at or below its ``vw``
        of a transaction that is not rolled back. Checked at the end of the run
        (``check_snapshots``): whether a transaction of an ended epoch is doomed is only
        known then, and a follower may have dropped one it never installed (an entry that
        arrived after its epoch's FVW). Versions installed after the snapshot do not count."""
        self.snapshots_checked += 1
        self._snapshots.append((shard, keys, reply, self._step))

    def check_snapshots(self) -> None:
        gone = self._gone()
        for shard, keys, reply, step in self._snapshots:
            vw = dict(reply.vw.items())
            for key, shown in zip(keys, reply.values, strict=True):
                expected = self.preloaded.get(key)
                for writer, value, deleted, vc, installed_at in reversed(self.versions.get(key, [])):
                    if installed_at > step or writer in gone:
                        continue
                    if vc.le_watermark(vw):
                        expected = None if deleted else value
                        break
                if shown != expected:
                    self._note(
                        self.snapshots,
                        f"follower of shard {shard} at {reply.vw} showed {key!r} = {shown!r}, "
                        f"the transactions under that watermark wrote {expected!r}",
                    )
        self._snapshots.clear()

    # ---- dependency closure --------------------------------------------------------------

    def dependencies(self) -> list[tuple[int, int, str, str]]:
        """(dependent, dependency, kind, key) for every dependency between certified
        transactions, rebuilt from what was read and the install order of every key.

        The version a writer overwrote is the one the store it installed in held (recovery
        removes versions, and after a takeover the new leader's store is not the old
        one's).

        A transaction that wrote nothing is the dependency of no anti-dependency (rw): no
        cut of the store shows it and no rollback undoes it, so a later writer of what it
        read need not be above it (DESIGN.md §3's rule is for writers; a read-only list
        reading at a snapshot reads below versions installed before it: "snapshot reads"
        in store/core/coordinator.py). Whether it read a consistent, recent enough state
        is the history checkers' question (G-single, G2-item, real time)."""
        certified = self.certifications
        edges: list[tuple[int, int, str, str]] = []
        readers: dict[tuple[str, int], list[int]] = {}
        for txn_id, cert in certified.items():
            for key, writer in cert.reads:
                if not writer:
                    writer = self._dropped_tombstone(key, self.certified_step[txn_id])
                readers.setdefault((key, writer), []).append(txn_id)
                if writer and writer in certified:
                    edges.append((txn_id, writer, "wr", key))
        for key, versions in self.versions.items():
            for writer, _, _, _, _ in versions:
                overwritten = self.overwrote[(key, writer)]
                if writer not in certified:
                    continue
                if overwritten and overwritten in certified:
                    edges.append((writer, overwritten, "ww", key))
                for reader in readers.get((key, overwritten), ()):
                    if reader != writer and certified[reader].writes:
                        edges.append((writer, reader, "rw", key))
        edges.extend(self._phantom_dependencies())
        return edges

    def _dropped_tombstone(self, key: str, step: int) -> int:
        """Whose version a read of ``key`` as absent, certified at ``step``, saw: 0 for the
        key before anything was written to it, or the writer of the tombstone the key's
        newest version before then was. The store drops a durable tombstone with nothing
        above it, and a read of the key after that carries no writer (stamp 0): without
        this it would read as a read of the key's first absence, older than every write."""
        versions = self.versions.get(key, ())
        at = bisect.bisect_left([v[4] for v in versions], step)
        if at and versions[at - 1][2]:
            return versions[at - 1][0]
        return 0

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
                # A scan cut short by its limit covered up to its last key (down to it,
                # reversed); else its whole range.
                start, end = bisect.bisect_left(keys, lo), bisect.bisect_left(keys, hi)
                if len(seen) >= abs(limit):
                    if limit < 0:
                        start = bisect.bisect_left(keys, seen[-1])
                    else:
                        end = bisect.bisect_right(keys, seen[-1])
                for key in keys[start:end]:
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
        gone = self._gone()
        for dependent, dependency, kind, key in self.dependencies():
            if dependent in gone or dependency in gone:
                continue  # it never happened: its dependencies bind nothing
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
        """Points at which a transaction was admitted before one it depends on (admitted: at
        the first point its full clock is under, and not before it was certified)."""
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
        gone = self._gone()
        for dependent, dependency, kind, key in self.dependencies():
            if dependent in gone or dependency in gone:
                continue
            # Not before it was certified: a clock may leave out what was durable by then
            # (a read of a dropped tombstone carries no clock at all).
            at = max(admission(dependent), self.known_at_certification[dependent])
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

    def __init__(
        self, replicas: Callable[[], list[Any]], regions: int,
        acceptors: Callable[[int], list[Any]], draws: dict[int, SortedList],
    ) -> None:
        """``replicas()``: every shard replica (leaders and followers, a crashed one too);
        ``acceptors(shard)``: the shard's acceptors whose votes count (``SimCluster.acceptors``:
        a crashed process's as it was, or as its disk kept it); a shard has one per region,
        and a majority of ``regions`` is what makes an entry durable. ``draws``: per shard,
        every (counter, unit) drawn (``Recorder.draws``): with several workers per shard a
        unit (one worker) has its own stream, and a value counts as settled by the stream
        of the worker that drew it; values no worker drew (a worker counting alone jumps
        ahead: ``ShardWatermark.raise_floor``) need nothing."""
        self.replicas = replicas
        self.draws = draws
        self._acceptors = acceptors
        self.majority = regions // 2 + 1
        self.verified: dict[int, int] = {}
        self.violations: list[str] = []
        self.checked = 0

    def _durable_counters(self, shard: int) -> set[int]:
        acceptors = self._acceptors(shard)
        majority = self.majority
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

    def _ended(self, unit: int, epoch: int) -> bool:
        """Whether ``epoch`` has ended on the unit's stream (a marker of it is chosen)."""
        return any(
            replica.shard == unit and replica.epochs.ended >= epoch for replica in self.replicas()
        )

    def _aborted(self, unit: int) -> set[int]:
        found: set[int] = set()
        for replica in self.replicas():
            if replica.shard == unit and isinstance(replica, ShardLeader):
                found |= replica.participant.aborted_counters()
        return found

    def check(self, label: str, vc: VectorClock) -> None:
        """Called when a client is told COMMITTED (and for every snapshot's watermark):
        every value at or below each entry of ``vc`` that a worker of the shard drew is
        aborted, accepted by a majority of that worker's stream, or of an epoch that has
        ended on that stream (recovery rolls the rest of an ended epoch back: a clock may
        still name such a value, in a read-write stamp left by a transaction that recovery
        rolls back; a real dependency on one, a read or an overwrite, is the rollback
        oracles' to catch: rollback-incomplete, lost-committed)."""
        self.checked += 1
        for shard, needed in vc.items():
            start = self.verified.get(shard, 0)
            if needed <= start:
                continue
            draws = self.draws.get(shard)
            settled: dict[int, set[int]] = {}
            counter = start
            for drawn, unit in draws.irange((start + 1, -1), (needed, 1 << 30)) if draws else ():
                known = settled.get(unit)
                if known is None:
                    known = settled[unit] = self._durable_counters(unit) | self._aborted(unit)
                if drawn not in known and not self._ended(unit, drawn >> EPOCH_SHIFT):
                    self.verified[shard] = drawn - 1
                    self.violations.append(
                        f"{label} with {vc}: shard {shard} counter {drawn} (drawn by unit "
                        f"{unit}) is neither aborted nor accepted by a majority"
                    )
                    return
                counter = drawn
            self.verified[shard] = max(counter, needed)


def divergence(
    leaders: Sequence[ShardLeader | None], followers: dict[int, list[ShardFollower]]
) -> list[str]:
    """After the load stops and faults heal: each follower holds exactly its leader's data."""
    problems = []
    for shard, leader in enumerate(leaders):
        if leader is None:
            problems.append(f"shard {shard}: no leader")
            continue
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
