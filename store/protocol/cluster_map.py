"""The cluster map: who serves what, in which epoch (DESIGN.md §2, §5; docs/recovery.md).

The configuration manager (``store.core.cm``) keeps one as a replicated state machine —
its members apply the commands chosen on the CM's Paxos stream with ``ClusterMap.apply`` —
and hands it to replicas and clients in ``ConfigReply`` messages; a rejoining replica gets
it inside the transferred state. ``to_wire`` / ``cluster_map_from_wire`` are its wire
form (strictly validated). Pure: no I/O, no Paxos.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store.protocol.wirecheck import Fields


class ClusterMap:
    """Who serves what, in which epoch, and the FVW of every epoch that has ended.

    ``leaders[s]``: shard ``s``'s leader; ``followers[s]``: its other replicas. ``fvw[e]``:
    the finalized watermark of every shard for ended epoch ``e`` (complete ones only);
    ``finalized[e]``: the reports of an epoch still incomplete.
    """

    __slots__ = ("epoch", "finalized", "followers", "fvw", "leaders")

    def __init__(
        self,
        epoch: int,
        leaders: Sequence[str],
        followers: Sequence[Sequence[str]],
        fvw: dict[int, dict[int, int]] | None = None,
        finalized: dict[int, dict[int, int]] | None = None,
    ) -> None:
        assert len(leaders) == len(followers)
        self.epoch = epoch
        self.leaders = list(leaders)
        self.followers = [list(f) for f in followers]
        self.fvw = fvw or {}
        self.finalized = finalized or {}

    def copy(self) -> ClusterMap:
        return ClusterMap(
            self.epoch, self.leaders, self.followers,
            {e: dict(v) for e, v in self.fvw.items()},
            {e: dict(v) for e, v in self.finalized.items()},
        )

    @property
    def shards(self) -> int:
        return len(self.leaders)

    def replicas(self) -> list[str]:
        """Every replica of the map: the leaders, then the followers."""
        return list(self.leaders) + [a for followers in self.followers for a in followers]

    def fvw_epoch(self) -> int:
        """The latest ended epoch whose FVW is complete (-1: none)."""
        return max(self.fvw, default=-1)

    def apply(self, command: list[Any]) -> bool:
        """Applies one chosen command; True if the map changed. Stale ones change nothing."""
        kind = command[0]
        if kind == "failover":
            _, shard, old, new, epoch = command
            if (
                epoch != self.epoch + 1
                or not 0 <= shard < self.shards
                or self.leaders[shard] != old
                or new not in self.followers[shard]
            ):
                return False
            self.epoch = epoch
            self.leaders[shard] = new
            # The old leader stays a member of the shard's stream: the quorum is a majority
            # of all its regions, whether or not one of them is gone.
            self.followers[shard] = [old if f == new else f for f in self.followers[shard]]
            return True
        if kind == "finalized":
            _, epoch, shard, watermark = command
            if epoch >= self.epoch or epoch in self.fvw or not 0 <= shard < self.shards:
                return False
            parts = self.finalized.setdefault(epoch, {})
            if shard in parts:
                return False
            parts[shard] = watermark
            if len(parts) == self.shards:
                self.fvw[epoch] = self.finalized.pop(epoch)
            return True
        raise AssertionError(f"unknown CM command {command!r}")

    def to_wire(self) -> list[Any]:
        return [
            self.epoch, list(self.leaders), [list(f) for f in self.followers],
            [[e, [[s, w] for s, w in sorted(v.items())]] for e, v in sorted(self.fvw.items())],
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterMap) and self.to_wire() == other.to_wire()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ClusterMap(epoch={self.epoch}, leaders={self.leaders}, "
            f"fvw={ {e: v for e, v in sorted(self.fvw.items())} })"
        )


_FIELDS = Fields("cluster map")
_bad = _FIELDS.bad
_int = _FIELDS.integer
_list = _FIELDS.array


def _strs(value: Any, what: str) -> list[str]:
    return [_FIELDS.string(item, what) for item in _list(value, what)]


def cluster_map_from_wire(value: Any) -> ClusterMap:
    """``ClusterMap.to_wire``'s inverse; ``InvalidRequest`` for anything malformed."""
    raw = _list(value, "cluster map")
    if len(raw) != 4:
        raise _bad("a cluster map is [epoch, leaders, followers, fvw]")
    leaders = _strs(raw[1], "leaders")
    followers = [_strs(f, "followers") for f in _list(raw[2], "followers")]
    if len(followers) != len(leaders) or not leaders:
        raise _bad("a cluster map has followers for each of its shards")
    fvw: dict[int, dict[int, int]] = {}
    for item in _list(raw[3], "fvw"):
        item = _list(item, "fvw item")
        if len(item) != 2:
            raise _bad("an fvw item is [epoch, [[shard, watermark], ...]]")
        marks = {}
        for pair in _list(item[1], "fvw marks"):
            pair = _list(pair, "fvw mark")
            if len(pair) != 2:
                raise _bad("an fvw mark is [shard, watermark]")
            marks[_int(pair[0], "shard")] = _int(pair[1], "watermark")
        if set(marks) != set(range(len(leaders))):
            raise _bad("an fvw names every shard")
        fvw[_int(item[0], "epoch")] = marks
    return ClusterMap(_int(raw[0], "epoch"), leaders, followers, fvw)

