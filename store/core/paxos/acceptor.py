"""The acceptor of a Paxos stream ("Paxos Made Simple" §2.2, run per slot as Multi-Paxos).

Rules, for one stream:

* It promises the highest ballot it has seen in a Prepare or an Accept, and refuses
  (``Reject``, naming that promise) anything at a lower ballot. One promise covers every
  slot, which is what lets a Multi-Paxos leader skip phase 1 for each new slot.
* It accepts ``(slot, ballot, entry)`` when ``ballot`` is at least its promise, replacing
  whatever it had accepted for that slot at a lower ballot.
* A Prepare from ``from_slot`` is answered with every ``(slot, ballot, entry)`` accepted at
  or after ``from_slot``, in slot order, cut into pieces of ``promise_entries_max``.

It persists nothing: promises and accepted entries live in memory, so a restarted process
must not come back as the same acceptor (it could break a promise it no longer remembers).
In this design a failed region's replica rejoins through recovery (DESIGN.md §5) as a new
member, never with an empty memory under its old identity. If acceptors are ever made
durable, their state must be saved before the Promise or Accepted it produced is sent.
"""

from __future__ import annotations

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


class Acceptor:
    def __init__(self, stream: int, settings: StreamSettings = DEFAULT_STREAM_SETTINGS) -> None:
        self.stream = stream
        self.settings = settings
        self.promised: Ballot = ZERO_BALLOT
        # slot -> (ballot, entry), the highest-ballot value accepted for the slot.
        self._accepted: SortedDict = SortedDict()
        self._outbox: list[tuple[str, PaxosMessage]] = []
        self.forgotten_before = 0

    # ---- entry points ------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        assert message.stream == self.stream
        if isinstance(message, Prepare):
            self._outbox.append((src, self.prepare(message)))
        elif isinstance(message, Accept):
            self._outbox.append((src, self.accept(message)))
        # Anything else is not an acceptor's business; the replica routes it elsewhere.

    def tick(self, now_ns: int) -> None:
        """Acceptors keep no timers; here for the uniform role interface."""

    def ready(self) -> StreamReady:
        messages, self._outbox = self._outbox, []
        return StreamReady(messages)

    # ---- direct calls (the leader's own region uses its acceptor without the network) --

    def prepare(self, message: Prepare) -> Promise | Reject:
        if message.ballot < self.promised:
            return Reject(self.stream, message.ballot, self.promised)
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
        if message.ballot < self.promised:
            return Reject(self.stream, message.ballot, self.promised)
        self.promised = message.ballot
        if message.slot >= self.forgotten_before:
            self._accepted[message.slot] = (message.ballot, message.entry)
        return Accepted(self.stream, message.ballot, message.slot)

    def accepted(self, slot: int) -> tuple[Ballot, Entry] | None:
        found: tuple[Ballot, Entry] | None = self._accepted.get(slot)
        return found

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
