"""SharedWatermarks (native/mr_vwshare.c) and the simulator's LocalWatermarks: the board on
which the worker processes of a shard share what each knows of every shard's watermark. What
a worker relies on: it reads whole publications of a fellow (never half of one, even while
the fellow writes), only what is new, never what a fellow in a later epoch knows, and bad
input is refused without touching the board."""

from __future__ import annotations

import mmap
import multiprocessing
import struct
from pathlib import Path
from typing import Any

import pytest

from store.core.watermark import LocalWatermarks, WatermarkBoard
from store.rpc._native import SharedWatermarks

SHARDS = 5
PUBLISHES = 20_000


def _boards(kind: str, tmp_path: Path, shards: int = SHARDS, slots: int = 2) -> tuple[Any, Any]:
    """Two handles on one board: a writer's and a reader's (two mappings of one file)."""
    if kind == "local":
        board = LocalWatermarks(shards, slots)
        return board, board
    path = tmp_path / "board.vw"
    return SharedWatermarks(path, shards, slots, create=True), SharedWatermarks(path, shards, slots)


@pytest.mark.parametrize("kind", ["shared", "local"])
def test_a_reader_learns_only_what_is_new_and_only_once(tmp_path: Path, kind: str) -> None:
    writer, reader = _boards(kind, tmp_path)
    board: WatermarkBoard = reader
    known = [0] * SHARDS
    assert board.pull(0, 1, known, 0) is None  # nothing published yet
    writer.publish(0, 1, {0: 5, 2: 7})
    got = board.pull(0, 1, known, 0)
    assert got is not None
    seq, raised = got
    assert raised == [(0, 5), (2, 7)] and known == [5, 0, 7, 0, 0]
    assert board.pull(0, 1, known, seq) is None  # the same publication: nothing to do
    writer.publish(0, 1, {0: 5, 2: 9, 4: 1})
    got = board.pull(0, 1, known, seq)
    assert got is not None and got[1] == [(2, 9), (4, 1)] and known == [5, 0, 9, 0, 1]
    # What the reader already knows from elsewhere is not news.
    known[3] = 50
    writer.publish(0, 1, {3: 40})
    got = board.pull(0, 1, known, got[0])
    assert got is not None and got[1] == [] and known[3] == 50
    # Slots are apart: slot 1 has published nothing.
    assert board.pull(1, 1, [0] * SHARDS, 0) is None


@pytest.mark.parametrize("kind", ["shared", "local"])
def test_a_reader_takes_nothing_from_a_fellow_in_a_later_epoch(tmp_path: Path, kind: str) -> None:
    """An entry of a worker already in a later epoch can rest on claims of that epoch (the
    rollback of what was drawn above the ended epoch's finalized watermark); a worker still
    in the earlier epoch must not count it (the rule of gossip). Once it is in that epoch
    it reads it."""
    writer, reader = _boards(kind, tmp_path)
    writer.publish(1, 3, {0: 11})
    known = [0] * SHARDS
    assert reader.pull(1, 2, known, 0) is None and known == [0] * SHARDS
    got = reader.pull(1, 3, known, 0)
    assert got is not None and got[1] == [(0, 11)]
    writer.publish(1, 2, {0: 12})  # an earlier epoch's publication is read by a later reader
    got = reader.pull(1, 3, known, got[0])
    assert got is not None and got[1] == [(0, 12)]


@pytest.mark.parametrize("kind", ["shared", "local"])
def test_bad_input_is_refused_and_the_board_left_as_it_was(tmp_path: Path, kind: str) -> None:
    writer, reader = _boards(kind, tmp_path)
    writer.publish(0, 1, {1: 3})
    for entries in ({SHARDS: 1}, {-1: 1}, {0: -5}):
        with pytest.raises(ValueError):
            writer.publish(0, 1, {0: 99, **entries})
    known = [0] * SHARDS
    got = reader.pull(0, 1, known, 0)
    assert got is not None and got[1] == [(1, 3)]  # the good publication, untouched
    if kind == "shared":
        with pytest.raises(ValueError, match="slot 2"):
            writer.publish(2, 1, {})
        with pytest.raises(ValueError, match="known is a list of 5"):
            reader.pull(0, 1, [0] * 4, 0)


def test_a_file_that_is_not_this_board_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "board.vw"
    SharedWatermarks(path, 4, 2, create=True).publish(0, 1, {3: 8})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="not a Meridian watermark file of 9 shards"):
        SharedWatermarks(path, 9, 2, create=True)
    with pytest.raises(ValueError, match="of 4 shards and 3 slots"):
        SharedWatermarks(path, 4, 3)
    other = tmp_path / "other"
    other.write_bytes(b"x" * len(before))
    with pytest.raises(ValueError):
        SharedWatermarks(other, 4, 2)
    assert path.read_bytes() == before and other.read_bytes() == b"x" * len(before)
    with pytest.raises(ValueError, match="shards"):
        SharedWatermarks(tmp_path / "none", 0, 2, create=True)
    with pytest.raises(OSError):
        SharedWatermarks(tmp_path / "missing", 4, 2)
    board = SharedWatermarks(path, 4, 2)
    board.close()
    with pytest.raises(RuntimeError, match="after close"):
        board.pull(0, 1, [0] * 4, 0)


def test_a_writer_that_died_mid_write_is_skipped_until_its_slot_is_written_again(
    tmp_path: Path,
) -> None:
    """A worker killed while publishing leaves its slot's sequence number odd: readers skip
    the slot (its entries may be half written) until a new worker in that slot publishes."""
    path = tmp_path / "board.vw"
    board = SharedWatermarks(path, 3, 2, create=True)
    board.publish(1, 1, {0: 4})
    known = [0] * 3
    got = board.pull(1, 1, known, 0)
    assert got is not None
    # The slot's block starts after the 64-byte header (slot 0's block is 64 bytes).
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as raw:
        seq = struct.unpack_from("<Q", raw, 128)[0]
        struct.pack_into("<Q", raw, 128, seq + 1)  # odd: a write begun, never finished
        struct.pack_into("<q", raw, 128 + 16, 77)  # and half of it done
    assert board.pull(1, 1, [0] * 3, 0) is None
    board.publish(1, 1, {0: 5, 2: 6})
    got = board.pull(1, 1, known, got[0])
    assert got is not None and got[1] == [(0, 5), (2, 6)]


def _publish_many(path: str, start: Any) -> None:
    board = SharedWatermarks(path, SHARDS, 2)
    start.wait()
    for value in range(1, PUBLISHES + 1):
        board.publish(0, 1, dict.fromkeys(range(SHARDS), value))


def test_a_reader_never_sees_half_of_a_publication(tmp_path: Path) -> None:
    """One process publishes every entry equal to 1, 2, 3, ... while another reads: each read
    is one whole publication (all entries equal), and they only grow."""
    path = str(tmp_path / "board.vw")
    reader = SharedWatermarks(path, SHARDS, 2, create=True)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    writer = ctx.Process(target=_publish_many, args=(path, start))
    writer.start()
    start.set()
    seen, reads, last = 0, 0, 0
    while last < PUBLISHES:
        got = reader.pull(0, 1, [0] * SHARDS, seen)
        if got is None:
            assert writer.is_alive() or writer.exitcode == 0
            continue
        seen, raised = got
        values = {value for _, value in raised}
        assert len(raised) == SHARDS and len(values) == 1, raised
        assert values.pop() >= last
        last = raised[0][1]
        reads += 1
    writer.join(timeout=60)
    assert writer.exitcode == 0 and reads > 1
