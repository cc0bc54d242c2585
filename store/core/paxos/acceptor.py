"""The acceptor of a Paxos stream ("Paxos Made Simple" §2.2, run per slot as Multi-Paxos).

Rules, for one stream:

* It promises the highest ballot it has seen in a Prepare or an Accept, and refuses
  (``Reject``, naming that promise) anything at a lower ballot. One promise covers every
  slot, which is what lets a Multi-Paxos leader skip phase 1 for each new slot.
* It accepts ``(slot, ballot, entry)`` when ``ballot`` is at least its promise, replacing
  whatever it had accepted for that slot at a lower ballot.
* A Prepare from ``from_slot`` is answered with every ``(slot, ballot, entry)`` accepted at
  or after ``from_slot``, in slot order, cut into pieces of ``promise_entries_max``.

Durability. Every change of its state is a record in ``ready().persist``: a ``Prepare`` for
a promise, an ``Accept`` for an accepted value (and for a learned one, below). A replica
with a disk writes and syncs them before it sends the messages of the same ``ready()``, and
a restarted process rebuilds the acceptor from them (``Acceptor.recover``): it remembers
every promise and vote, and may vote at once. Without a disk, promises and accepted entries
live in memory only: a restarted process has forgotten what it promised and accepted, so
it comes back **restarted** (docs/recovery.md
"Rejoining"), with a state copied from a live replica, the round ``R`` of the epoch it
rejoined in (a leader of epoch ``e`` proposes in round ``e + 1``, so no ballot of a higher
round existed before it crashed) and the address of its shard's current leader:

* It answers no Accept of a ballot of round at most ``R`` but the current leader's (whose
  ballots it may have promised before, and whose proposals are the only ones of those rounds
  still made): answering an older leader could break a promise it forgot.
* It answers no Prepare at all (it is not ``voting``) until its replica has learned every
  slot the current leader can have proposed before the crash; the replica decides when
  (``store.core.follower``). A value chosen with its vote before the crash may be known to
  only one other acceptor; a phase 1 counting this one could miss it.
* Once voting, it reports what its learner knows chosen as accepted at the top of round
  ``R`` (``learned``), so a later phase 1 that counts it hears of every chosen value.

Every acceptor of a follower is told what its learner delivered (``learned``) and holds the
chosen value for each such slot from then on, logged where it differs from its vote.

Two replicas of a shard that lose their memory at once can still lose a chosen value; that
needs acceptors on disk (state saved before the Promise or Accepted it produced is sent).
"""

from __future__ import annotations

from typing import Final

from sortedcontainers import SortedDict

from store.core.paxos.messages import Accept, Accepted, PaxosMessage, Prepare, Promise, Reject
from store.core.paxos.types import (
    DEFAULT_STREAM_SETTINGS,
    ZERO_BALLOT,
    Ballot,
    Entry,
    StreamReady,
    StreamSettings,
)

# Above every address: the ballot at which a restarted acceptor reports what it learned.
_LAST_ADDRESS: Final = "\U0010ffff"


class Acceptor:
    def __init__(
        self,
        stream: int,
        settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        restarted_round: int = 0,
        leader: str = "",
        promised: Ballot = ZERO_BALLOT,
    ) -> None:
        self.stream = stream
        self.settings = settings
        # After a restart (see the module doc): silent for ballots of these rounds but the
        # current leader's, and for every Prepare until voting; what the learner knows
        # chosen is reported at _learned_ballot.
        self.restarted_round = restarted_round
        self.leader = leader
        self.voting = not restarted_round
        self._learned_ballot = Ballot(restarted_round, _LAST_ADDRESS)
        self.silenced = 0
        self.promised: Ballot = promised
        # slot -> (ballot, entry), the highest-ballot value accepted for the slot.
        self._accepted: SortedDict = SortedDict()
        self._outbox: list[tuple[str, PaxosMessage]] = []
        self._persist: list[PaxosMessage] = []  # state changes to make durable (module doc)
        self.forgotten_before = 0

    # ---- entry points ------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        assert message.stream == self.stream
        if isinstance(message, Prepare | Accept) and self._silent(message):
            self.silenced += 1
            return
        if isinstance(message, Prepare):
            self._outbox.append((src, self.prepare(message)))
        elif isinstance(message, Accept):
            self._outbox.append((src, self.accept(message)))
        # Anything else is not an acceptor's business; the replica routes it elsewhere.

    def tick(self, now_ns: int) -> None:
        """Acceptors keep no timers; here for the uniform role interface."""

    def ready(self, keep_persist: bool = False) -> StreamReady:
        """``keep_persist``: leave the records for ``take_persist`` (a caller that hands
        them on later, with the rest of its own ready())."""
        messages, self._outbox = self._outbox, []
        return StreamReady(messages, persist=[] if keep_persist else self.take_persist())

    def take_persist(self) -> list[PaxosMessage]:
        """The state changes since the last call, to be made durable before any message
        produced with them is sent (a leader calls its own acceptor directly)."""
        records, self._persist = self._persist, []
        return records

    @classmethod
    def recover(
        cls, stream: int, records: list[PaxosMessage],
        settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
    ) -> Acceptor:
        """The acceptor whose durable records (``take_persist``, in order) are ``records``:
        its highest promise, and for each slot the value accepted at the highest ballot."""
        acceptor = cls(stream, settings)
        for record in records:
            acceptor.apply(record)
        return acceptor

    def apply(self, record: PaxosMessage) -> None:
        """Adds one durable record (``take_persist``'s) to this acceptor's state, as recovery
        does: a promise raises ``promised``; a vote is kept unless the slot holds a higher
        ballot's."""
        assert record.stream == self.stream, "a record of another stream"
        if isinstance(record, Prepare):
            self.promised = max(self.promised, record.ballot)
        elif isinstance(record, Accept):
            self.promised = max(self.promised, record.ballot)
            held = self._accepted.get(record.slot)
            if held is None or held[0] <= record.ballot:
                self._accepted[record.slot] = (record.ballot, record.entry)
        else:
            raise AssertionError(f"not an acceptor record: {record!r}")

    def checkpoint(self) -> list[PaxosMessage]:
        """Records that rebuild this acceptor's state as it is (``recover``): its promise and
        every value it still holds. A log may replace all its records by these."""
        records: list[PaxosMessage] = []
        if self.promised > ZERO_BALLOT:
            records.append(Prepare(self.stream, self.promised, 0))
        for slot, (ballot, entry) in self._accepted.items():
            records.append(Accept(self.stream, ballot, slot, entry, 0))
        return records

    def _silent(self, message: Prepare | Accept) -> bool:
        if isinstance(message, Prepare) and not self.voting:
            return True
        ballot = message.ballot
        return ballot.round <= self.restarted_round and ballot.leader != self.leader

    # ---- direct calls (the leader's own region uses its acceptor without the network) --

    def prepare(self, message: Prepare) -> Promise | Reject:
        # Direct calls come from this replica's own leader, promoted in a later epoch.
        assert not self._silent(message), "a restarted acceptor must stay silent"
        if message.ballot < self.promised:
            return Reject(self.stream, message.ballot, self.promised)
        if message.ballot > self.promised:
            self._persist.append(Prepare(self.stream, message.ballot, 0))
        self.promised = message.ballot
        accepted: list[tuple[int, Ballot, Entry]] = []
        limit = self.settings.promise_entries_max
        complete = True
        for slot in self._accepted.irange(minimum=message.from_slot):
            if len(accepted) == limit:
                complete = False
                break
            ballot, entry = self._accepted[slot]
            accepted.append((slot, ballot, entry))
        return Promise(self.stream, message.ballot, message.from_slot, accepted, complete)

    def accept(self, message: Accept) -> Accepted | Reject:
        assert not self._silent(message), "a restarted acceptor must stay silent"
        if message.ballot < self.promised:
            return Reject(self.stream, message.ballot, self.promised)
        self.promised = message.ballot
        if message.slot >= self.forgotten_before:
            held = self._accepted.get(message.slot)
            if held != (message.ballot, message.entry):  # a duplicate changes nothing
                self._accepted[message.slot] = (message.ballot, message.entry)
                self._persist.append(message)
        return Accepted(self.stream, message.ballot, message.slot)

    def accepted(self, slot: int) -> tuple[Ballot, Entry] | None:
        found: tuple[Ballot, Entry] | None = self._accepted.get(slot)
        return found

    def learned(self, slot: int, entry: Entry) -> None:
        """This replica's learner delivered ``entry``, chosen at ``slot``: from now on the
        acceptor holds that value for the slot (and logs it if that is new), so that what it
        holds for every slot its replica delivered is the chosen value. A restarted
        follower rebuilds the chosen entries it hands a takeover from its log this way
        (``ShardFollower.restore``), instead of keeping them in its snapshot too.

        Reporting the chosen value in a Promise, at any ballot, hides nothing and
        contradicts no acceptor: if ``w`` was chosen at ballot ``b``, every quorum holds an
        acceptor that reports a ballot at or above ``b``, and every value accepted at or
        above ``b`` is ``w``; so the highest ballot a phase 1 hears is ``w``'s whichever
        ballot this one names. It names the one it held (a value it accepted but that lost)
        or, for a slot it never accepted, the top of round ``R`` for a restarted acceptor
        (which must be heard above what it forgot) and of round 0, below every real ballot,
        for the others."""
        if slot < self.forgotten_before:
            return
        held = self._accepted.get(slot)
        if held is not None and held[1] is entry and held[0] >= self._learned_ballot:
            return  # what it voted for was chosen (the common case: one object)
        if held is None or held[0] < self._learned_ballot:
            ballot = self._learned_ballot
        elif held[1] != entry:
            ballot = held[0]
        else:
            return
        self._accepted[slot] = (ballot, entry)
        self._persist.append(Accept(self.stream, ballot, slot, entry, 0))

    def accepted_count(self) -> int:
        return len(self._accepted)

    def forget_before(self, slot: int) -> None:
        """Drops accepted entries below ``slot`` (memory bound).

        Safe only for slots chosen and applied everywhere that matters: a later leader that
        runs phase 1 from below ``slot`` will not hear about them from this acceptor. The
        replica calls it for slots its learner delivered and that every region has applied.
        """
        self.forgotten_before = max(self.forgotten_before, slot)
        while self._accepted and self._accepted.peekitem(0)[0] < slot:
            self._accepted.popitem(0)
