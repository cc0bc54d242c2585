"""A server's acceptor logs (store/node/durable.py; issue 14): records come back per stream
as written, an acceptor rebuilt from them keeps its promise and votes, a sync reports done
only after its fsync, and a log that cannot be trusted stops the process with the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from store.core.paxos import Accept, Acceptor, Ballot, Entry, EntryKind, Prepare, encode
from store.node.durable import WalDurable
from store.node.wal import Wal, WalCorrupt

OLD, NEW = Ballot(1, "leader/0"), Ballot(2, "eu/follower/0")


def _entry(counter: int) -> Entry:
    return Entry(EntryKind.BATCH, [("k", counter)], [counter], watermark=counter)


def _run(directory: Path, records: list, *, fsync: bool = True) -> tuple[list[str], dict]:
    """Writes ``records`` through a WalDurable and syncs; returns the events in order and
    what reopening the directory recovers."""
    events: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        durable, recovered = WalDurable.open(directory, loop, fsync=fsync, on_fatal=events.append)
        durable.inline = False  # the Syncer's path (the inline one: test_a_fast_disk_...)
        events.append(f"recovered {sum(len(r) for r in recovered.values())}")
        durable.write(records)
        synced = loop.create_future()
        durable.sync(lambda: (events.append("synced"), synced.set_result(None)))
        events.append("sync asked")
        await synced
        durable.close()

    asyncio.run(main())

    async def reopen() -> dict:
        durable, recovered = WalDurable.open(directory, asyncio.get_running_loop(), on_fatal=print)
        durable.close()
        return recovered

    return events, asyncio.run(reopen())


def test_records_come_back_per_stream_and_rebuild_the_acceptor(tmp_path: Path) -> None:
    records = [
        Prepare(0, OLD, 0), Accept(0, OLD, 0, _entry(1), 0), Accept(0, OLD, 1, _entry(2), 0),
        Prepare(7, OLD, 0), Prepare(0, NEW, 0), Accept(0, NEW, 1, _entry(3), 0),
    ]
    events, recovered = _run(tmp_path, records)
    assert events == ["recovered 0", "sync asked", "synced"]  # done only after the fsync
    assert sorted(recovered) == [0, 7]
    assert [encode(r) for r in recovered[0]] == [encode(r) for r in records if r.stream == 0]
    assert (tmp_path / "stream-0").is_dir() and (tmp_path / "stream-7").is_dir()
    acceptor = Acceptor.recover(0, recovered[0])
    assert acceptor.promised == NEW
    assert acceptor.accepted(0) is not None and acceptor.accepted(0)[0] == OLD  # type: ignore[index]
    held = acceptor.accepted(1)
    assert held is not None and held[0] == NEW and held[1].watermark == 3
    # A restarted acceptor keeps its promise: the old leader's ballot is refused.
    refused = acceptor.accept(Accept(0, OLD, 2, _entry(4), 0))
    assert type(refused).__name__ == "Reject"


def test_without_fsync_a_sync_is_done_at_once_and_the_log_is_written_all_the_same(tmp_path: Path) -> None:
    events, recovered = _run(tmp_path, [Prepare(0, OLD, 0)], fsync=False)
    assert events == ["recovered 0", "synced", "sync asked"]
    assert len(recovered[0]) == 1


def test_a_flipped_byte_in_the_middle_stops_recovery_with_the_file(tmp_path: Path) -> None:
    records = [Accept(0, OLD, slot, _entry(slot + 1), 0) for slot in range(20)]
    _run(tmp_path, records)
    segment = sorted((tmp_path / "stream-0").glob("wal-*.log"))[-1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x40
    segment.write_bytes(bytes(data))

    async def reopen() -> None:
        WalDurable.open(tmp_path, asyncio.get_running_loop(), on_fatal=print)

    with pytest.raises(WalCorrupt, match=str(segment)):
        asyncio.run(reopen())


def test_a_torn_tail_is_cut_and_the_records_before_it_recover(tmp_path: Path) -> None:
    records = [Accept(0, OLD, slot, _entry(slot + 1), 0) for slot in range(20)]
    _run(tmp_path, records)
    segment = sorted((tmp_path / "stream-0").glob("wal-*.log"))[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # the last record half written
    _, recovered = _run(tmp_path, [])
    assert [r.slot for r in recovered[0]] == list(range(19))  # type: ignore[attr-defined]


def test_a_record_that_checks_but_does_not_decode_is_corruption(tmp_path: Path) -> None:
    wal, _, _ = Wal.open(tmp_path / "stream-0")
    wal.append(b"\xc1 not a stream message")
    wal.close()

    async def reopen() -> None:
        WalDurable.open(tmp_path, asyncio.get_running_loop(), on_fatal=print)

    with pytest.raises(WalCorrupt, match="does not decode"):
        asyncio.run(reopen())


def test_a_record_filed_under_another_stream_is_corruption(tmp_path: Path) -> None:
    wal, _, _ = Wal.open(tmp_path / "stream-3")
    wal.append(encode(Prepare(0, OLD, 0)))
    wal.close()

    async def reopen() -> None:
        WalDurable.open(tmp_path, asyncio.get_running_loop(), on_fatal=print)

    with pytest.raises(WalCorrupt, match="belongs to stream 0"):
        asyncio.run(reopen())


def _vote_3000_slots(tmp_path: Path, bound: int, keep: int) -> tuple[WalDurable, list[int]]:
    """Votes for 3,000 slots into a log bound by ``bound``, the acceptor keeping the last
    ``keep`` (forget_before, as the replicas do); the directory's size after each write."""
    acceptor = Acceptor(0)
    sizes: list[int] = []

    async def main() -> WalDurable:
        durable, _ = WalDurable.open(tmp_path, asyncio.get_running_loop(), on_fatal=print)
        durable.data_bytes_max = bound
        durable.checkpoint = lambda stream: acceptor.checkpoint()
        durable.write([Prepare(0, OLD, 0)])
        acceptor.promised = OLD
        for slot in range(3000):
            acceptor.accept(Accept(0, OLD, slot, _entry(slot + 1), 0))
            acceptor.forget_before(slot - keep)
            durable.write(acceptor.take_persist())
            sizes.append(durable.data_bytes())
        durable.close()
        assert durable.data_bytes() == durable.disk_bytes()  # kept without asking the disk
        return durable

    return asyncio.run(main()), sizes


def test_a_log_is_rewritten_as_the_acceptors_checkpoint_before_it_passes_its_bound(
    tmp_path: Path,
) -> None:
    """The directory stays under ``data_bytes_max`` at every moment, the rewrites' own
    (old and new segments together) included, and reopening the log rebuilds the acceptor
    as it is (its promise, the values it keeps), not as it once was."""
    bound = 32 << 10
    durable, sizes = _vote_3000_slots(tmp_path, bound, keep=100)
    assert durable.compactions > 5 and durable.over_bound == 0
    assert max(sizes) <= bound and durable.peak_bytes <= bound, (max(sizes), durable.peak_bytes)
    _, recovered = _run(tmp_path, [])
    again = Acceptor.recover(0, recovered[0])
    assert again.promised == OLD
    assert again.accepted(2999) is not None and again.accepted(2899) is not None
    assert again.accepted(100) is None  # forgotten before the last rewrite
    one_vote = len(encode(Accept(0, OLD, 2999, _entry(3000), 0))) + 12
    assert again.accepted_count() <= 101 + bound // one_vote


def test_a_bound_below_what_the_acceptor_keeps_is_reported_not_chased(tmp_path: Path) -> None:
    """An acceptor that keeps more than the bound allows (log_retained_slots too many for
    data_bytes_max): the log cannot be held under it. The rewrites then come once per
    sixteenth of the bound written, not after every write, and no more often than once per
    checkpoint written (each rewrites the whole checkpoint: more often, the rewrites would
    cost more than the votes); each is counted (``over_bound``, in the status) so an
    operator sees the bound is not held."""
    bound = 8 << 10
    durable, sizes = _vote_3000_slots(tmp_path, bound, keep=1000)
    one_vote = len(encode(Accept(0, OLD, 2999, _entry(3000), 0))) + 12
    assert max(sizes) > bound and durable.over_bound > 0
    written = 3000 * one_vote
    assert durable.compactions <= written // (bound // 16) + 1, durable.compactions
    checkpoint = 1000 * one_vote  # what the acceptor keeps once it has 1,000 votes
    assert durable.compactions <= 1 + 2 * written // checkpoint, (durable.compactions, written)


def test_a_checkpoint_keeps_a_promise_above_every_vote() -> None:
    """What a rewritten log holds rebuilds the acceptor exactly: a promise made after its
    last vote (a new leader's phase 1) survives, or the acceptor could vote for an older
    leader after a restart."""
    acceptor = Acceptor(0)
    for slot in range(5):
        acceptor.accept(Accept(0, OLD, slot, _entry(slot + 1), 0))
    acceptor.forget_before(2)
    acceptor.prepare(Prepare(0, NEW, 0))
    again = Acceptor.recover(0, acceptor.checkpoint())
    assert again.promised == NEW
    assert [again.accepted(slot) for slot in range(5)] == [acceptor.accepted(slot) for slot in range(5)]
    assert again.accepted(1) is None and again.accepted(4) is not None


def test_a_fast_disk_syncs_on_the_loop_until_syncs_are_often_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where fsync takes microseconds, a sync is done within ``sync`` (done called before it
    returns, counted in ``inline_syncs``). A slow fsync now and then (a preemption at the
    system call's return) leaves syncs inline; once more than INLINE_SLOW_MAX of the last
    INLINE_WINDOW were slower than INLINE_SYNC_MAX_NS, the later ones go to the Syncer's
    thread (done called afterwards, from the loop). An inline fsync that fails is fatal, and
    done is never called."""
    from store.node import durable as durable_module

    # The disk's speed is what this clock says: a slow fsync takes twice the limit, a fast
    # one a microsecond (the real fsync of tmp_path is left out: its time is the machine's).
    clock = {"ns": 0}
    slow = {"on": False, "fail": False}

    def fsync(fd: int) -> None:
        if slow["fail"]:
            raise OSError(5, "Input/output error")
        clock["ns"] += durable_module.INLINE_SYNC_MAX_NS * 2 if slow["on"] else 1_000

    monkeypatch.setattr(durable_module.os, "fsync", fsync)
    monkeypatch.setattr(durable_module.time, "monotonic_ns", lambda: clock["ns"])
    slots = iter(range(1, 1000))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fatal: list[BaseException] = []
        durable, _ = WalDurable.open(tmp_path / "a", loop, on_fatal=fatal.append)
        events: list[str] = []
        durable.write([Prepare(0, OLD, 0)])
        durable.sync(lambda: events.append("synced"))
        events.append("sync asked")
        assert events == ["synced", "sync asked"] and durable.inline_syncs == 1

        def sync_one(is_slow: bool) -> None:
            slow["on"] = is_slow
            slot = next(slots)
            durable.write([Accept(0, OLD, slot - 1, _entry(slot), 0)])
            durable.sync(lambda: events.append(f"synced {slot}"))
            assert events[-1] == f"synced {slot}"  # inline: done before sync returned

        # Slow syncs spread out (one in five) never make a quarter of the window.
        for i in range(3 * durable_module.INLINE_WINDOW):
            sync_one(i % 5 == 0)
        assert durable.inline
        # Slow ones close together do: the one past INLINE_SLOW_MAX in the window ends it.
        for _ in range(durable_module.INLINE_WINDOW):
            sync_one(True)
            if not durable.inline:
                break
        assert not durable.inline
        assert durable._slow_history.bit_count() == durable_module.INLINE_SLOW_MAX + 1
        inline_count = durable.inline_syncs
        slow["on"] = False
        synced = loop.create_future()
        slot = next(slots)
        durable.write([Accept(0, OLD, slot - 1, _entry(slot), 0)])
        durable.sync(lambda: synced.set_result("synced by the thread"))
        assert not synced.done()
        assert await asyncio.wait_for(synced, 10) == "synced by the thread"
        assert durable.syncs == inline_count + 1 and durable.inline_syncs == inline_count
        assert not fatal
        durable.close()

        failing, _ = WalDurable.open(tmp_path / "b", loop, on_fatal=fatal.append)
        failing.write([Prepare(0, OLD, 0)])
        slow["fail"] = True  # the disk fails now (the log's segment exists already)
        failing.sync(lambda: events.append("never"))
        assert "never" not in events and failing.closed
        assert isinstance(fatal[0], OSError) and fatal[0].errno == 5
        slow["fail"] = False
        failing.close()

    asyncio.run(main())
    recovered = _run(tmp_path / "a", [])[1]
    assert len(recovered[0]) == next(slots)  # every sync's records are in the log
