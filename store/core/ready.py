"""``Ready``: what a replica wants done after a step (the etcd-raft pattern)."""

from __future__ import annotations

from dataclasses import dataclass, field

from store.protocol.messages import Message


@dataclass(slots=True)
class Ready:
    """What the replica wants done: make ``persist`` durable, then send ``messages`` (in
    order), wake it at ``wake_at``, and
    if ``successor`` is set, host that replica from now on instead (a follower promoted to
    leader; its messages are in this Ready, the successor's come from its own)."""

    messages: list[tuple[str, Message]] = field(default_factory=list)
    wake_at: int | None = None
    successor: object | None = None
    # Records of the replica's Paxos acceptor (``StreamReady.persist``): written and synced
    # to stable storage BEFORE any of ``messages`` is sent. A host without a disk drops them.
    persist: list[object] = field(default_factory=list)
    # Whether ``messages`` (and every later message) must wait for ``persist``'s sync; a
    # leader whose records are only its own votes, counted after their sync, says no.
    hold: bool = True
    # Whether the replica's ``synced(now_ns)`` is to be called once ``persist`` is on disk
    # (once per such Ready, in order; at once by a host without a disk).
    wants_synced: bool = False
