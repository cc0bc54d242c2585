"""The learner of a Paxos stream: delivers chosen entries in slot order, exactly once.

How a learner knows a slot is chosen. The leader of ballot ``b`` piggybacks its commit
index ``n`` on every Accept and Commit: every slot below ``n`` is chosen, and for every slot
it proposed in ``b`` the chosen value is the one it proposed (a leader proposes one value
per slot per ballot, and only after phase 1 made that value the only one that can be
chosen; "Paxos Made Simple" §3). So a proposal ``(slot, b, entry)`` the learner saw in an
Accept is chosen as soon as it hears ``n > slot`` from the leader of the same ``b``. A
proposal seen at another ballot proves nothing; such slots, and slots whose Accept never
arrived, are gaps: the learner asks the leader (``Fetch``) and takes its ``Chosen`` answer,
which carries only values the leader knows chosen.

Delivery: entries are handed out through ``ready().chosen`` in slot order from
``first_slot``, each slot once; proposals are kept only within ``learner_window_slots`` of
the delivery point, so memory stays bounded whatever the leader sends.

``StreamFollower`` puts an acceptor and a learner of one stream side by side, as a follower
region hosts them, and routes each message to the role that wants it.
"""

from __future__ import annotations

from store.core.paxos.acceptor import Acceptor
from store.core.paxos.messages import Accept, Chosen, Commit, Fetch, PaxosMessage, Prepare
from store.core.paxos.types import (
    DEFAULT_STREAM_SETTINGS,
    ZERO_BALLOT,
    Ballot,
    Entry,
    StreamReady,
    StreamSettings,
)


class Learner:
    def __init__(
        self,
        stream: int,
        settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        first_slot: int = 0,
        leader: str | None = None,
    ) -> None:
        self.stream = stream
        self.settings = settings
        # Next slot to deliver; every slot below it has been handed out.
        self.delivered_through = first_slot
        # Every slot below it is known chosen (the largest commit index heard).
        self.chosen_through = first_slot
        # Where to fetch gaps: the sender of the highest-ballot Accept or Commit heard.
        self.leader = leader
        self._leader_ballot: Ballot = ZERO_BALLOT
        self._proposals: dict[int, tuple[Ballot, Entry]] = {}
        self._chosen: dict[int, Entry] = {}
        # The last commit index heard per ballot, to recognise proposals that arrive late.
        self._commit_by_ballot: dict[Ballot, int] = {}
        self._delivered: list[tuple[int, Entry]] = []
        self._outbox: list[tuple[str, PaxosMessage]] = []
        self._gap_since: int | None = None
        self._fetch_at: int | None = None
        self._fetched_to = first_slot  # the end of the last slot range asked for
        self.fetches_sent = 0

    # ---- entry points ------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        assert message.stream == self.stream
        if isinstance(message, Accept):
            self._note_leader(src, message.ballot)
            self._on_proposal(message.slot, message.ballot, message.entry)
            self._on_commit(message.ballot, message.chosen_through)
        elif isinstance(message, Commit):
            self._note_leader(src, message.ballot)
            self._on_commit(message.ballot, message.chosen_through)
        elif isinstance(message, Chosen):
            before = self.delivered_through
            self._on_chosen(message)
            self._deliver()
            if self.delivered_through > before and self.delivered_through < self.chosen_through:
                # A catch-up answer that helped: ask for the next piece at once rather than
                # after fetch_retry_ns, keeping fetches_in_flight_max pieces on the wire, so
                # a far-behind learner catches up at network speed.
                self._fetch_next_piece()
        else:
            return
        self._deliver()
        self._check_gap(now_ns)

    def tick(self, now_ns: int) -> None:
        self._check_gap(now_ns)
        if self._fetch_at is not None and now_ns >= self._fetch_at:
            self._send_fetch(now_ns)

    def ready(self) -> StreamReady:
        messages, self._outbox = self._outbox, []
        delivered, self._delivered = self._delivered, []
        return StreamReady(messages, delivered, self._fetch_at)

    # ---- internals ---------------------------------------------------------------------

    def _note_leader(self, src: str, ballot: Ballot) -> None:
        if ballot >= self._leader_ballot:
            self._leader_ballot = ballot
            self.leader = src

    def _on_proposal(self, slot: int, ballot: Ballot, entry: Entry) -> None:
        if slot < self.delivered_through or slot in self._chosen:
            return
        if slot >= self.delivered_through + self.settings.learner_window_slots:
            return  # too far ahead to hold; it will be fetched when delivery gets there
        held = self._proposals.get(slot)
        if held is None or ballot >= held[0]:
            self._proposals[slot] = (ballot, entry)
        if slot < self._commit_by_ballot.get(ballot, 0):
            self._mark_chosen(slot, entry)

    def _on_commit(self, ballot: Ballot, chosen_through: int) -> None:
        if chosen_through <= self._commit_by_ballot.get(ballot, 0):
            return
        previous = self._commit_by_ballot.get(ballot, 0)
        self._commit_by_ballot[ballot] = chosen_through
        if len(self._commit_by_ballot) > 8:  # only recent ballots matter; bound the map
            del self._commit_by_ballot[min(self._commit_by_ballot)]
        self.chosen_through = max(self.chosen_through, chosen_through)
        # Proposals are only held within the window, so only the window needs a look.
        window_end = self.delivered_through + self.settings.learner_window_slots
        for slot in range(max(previous, self.delivered_through), min(chosen_through, window_end)):
            held = self._proposals.get(slot)
            if held is not None and held[0] == ballot:
                self._mark_chosen(slot, held[1])

    def _on_chosen(self, message: Chosen) -> None:
        for offset, entry in enumerate(message.entries):
            slot = message.first_slot + offset
            if slot >= self.delivered_through:
                self._mark_chosen(slot, entry)
            self.chosen_through = max(self.chosen_through, slot + 1)

    def _mark_chosen(self, slot: int, entry: Entry) -> None:
        if slot < self.delivered_through:
            return
        known = self._chosen.get(slot)
        assert known is None or known == entry, f"two values chosen for slot {slot}"
        self._chosen[slot] = entry
        self._proposals.pop(slot, None)

    def _deliver(self) -> None:
        slot = self.delivered_through
        while slot in self._chosen:
            self._delivered.append((slot, self._chosen.pop(slot)))
            self._proposals.pop(slot, None)
            slot += 1
        self.delivered_through = slot

    def _check_gap(self, now_ns: int) -> None:
        """A gap is a slot known chosen that cannot be delivered; fetch it once it is old."""
        if self.delivered_through >= self.chosen_through:
            self._gap_since = None
            self._fetch_at = None
            return
        if self._gap_since is None:
            self._gap_since = now_ns
            self._fetch_at = now_ns + self.settings.fetch_retry_ns

    def _send_fetch(self, now_ns: int) -> None:
        """The gap is old: ask again from the delivery point, several pieces at once."""
        self._fetch_at = now_ns + self.settings.fetch_retry_ns
        self._fetched_to = self.delivered_through
        for _ in range(self.settings.fetches_in_flight_max):
            self._fetch_next_piece()

    def _fetch_next_piece(self) -> None:
        from_slot = max(self._fetched_to, self.delivered_through)
        if self.leader is None or from_slot >= self.chosen_through:
            return
        to_slot = min(self.chosen_through, from_slot + self.settings.fetch_entries_max)
        self._outbox.append((self.leader, Fetch(self.stream, from_slot, to_slot)))
        self._fetched_to = to_slot
        self.fetches_sent += 1


class StreamFollower:
    """The acceptor and the learner of one stream in a follower region.

    Prepare goes to the acceptor only; Accept to both (the learner needs the proposal
    whether or not the acceptor took it); Commit and Chosen to the learner. ``ready()``
    merges the two roles' outputs: the acceptor's replies first.
    """

    def __init__(
        self,
        stream: int,
        settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        first_slot: int = 0,
        acceptor: Acceptor | None = None,
    ) -> None:
        self.stream = stream
        self.acceptor = acceptor if acceptor is not None else Acceptor(stream, settings)
        self.learner = Learner(stream, settings, first_slot=first_slot)

    def handle(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        if isinstance(message, (Prepare, Accept)):
            self.acceptor.handle(now_ns, src, message)
        if not isinstance(message, Prepare):
            self.learner.handle(now_ns, src, message)

    def tick(self, now_ns: int) -> None:
        self.learner.tick(now_ns)

    def ready(self) -> StreamReady:
        accepted = self.acceptor.ready()
        learned = self.learner.ready()
        return StreamReady(
            accepted.messages + learned.messages, learned.chosen, learned.wake_at,
            accepted.persist,
        )
