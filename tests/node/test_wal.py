"""The write-ahead log (store/node/wal.py; issue 14): records come back as written, across
segments and reopenings; a torn tail is cut at the last good record; a flipped byte or a
broken length in the middle is corruption, reported with the file and the byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.node.wal import HEADER, Wal, WalCorrupt
from store.rpc._native import crc32c


def test_crc32c_is_castagnolis() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")  # it continues


def _write(directory: Path, payloads: list[bytes], **kwargs: int) -> Wal:
    wal, _, _ = Wal.open(directory, **kwargs)  # type: ignore[arg-type]
    for payload in payloads:
        wal.append(payload)
    wal.sync()
    return wal


def test_records_come_back_across_segments_and_reopenings(tmp_path: Path) -> None:
    payloads = [os.urandom(n) for n in range(0, 3000, 37)]
    wal = _write(tmp_path, payloads[:40], segment_bytes_max=4096)
    wal.close()
    wal = _write(tmp_path, payloads[40:], segment_bytes_max=4096)
    assert wal.next_index == len(payloads)
    wal.close()
    again, records, first = Wal.open(tmp_path, segment_bytes_max=4096)
    assert (records, first) == (payloads, 0)
    assert len(list(tmp_path.glob("wal-*.log"))) > 3
    again.close()


def test_truncation_removes_whole_segments_below_an_index(tmp_path: Path) -> None:
    payloads = [bytes([i]) * 500 for i in range(60)]
    wal = _write(tmp_path, payloads, segment_bytes_max=2048)
    before = wal.disk_bytes()
    assert wal.truncate_before(40) > 0
    assert wal.disk_bytes() < before
    wal.close()
    _, records, first = Wal.open(tmp_path, segment_bytes_max=2048)
    assert 0 < first <= 40 and records == payloads[first:]


def _last_segment(directory: Path) -> Path:
    return sorted(directory.glob("wal-*.log"))[-1]


@pytest.mark.parametrize("tear", ["half a header", "half a payload", "garbage", "zeros"])
def test_a_torn_tail_is_cut_at_the_last_good_record(tmp_path: Path, tear: str) -> None:
    payloads = [f"record {i}".encode() * 10 for i in range(20)]
    _write(tmp_path, payloads).close()
    segment = _last_segment(tmp_path)
    good = segment.stat().st_size
    with open(segment, "ab") as handle:
        if tear == "half a header":
            handle.write(HEADER.pack(0x4D45524C, 100, 0)[:7])
        elif tear == "half a payload":
            handle.write(HEADER.pack(0x4D45524C, 100, 0) + b"x" * 40)
        elif tear == "garbage":
            handle.write(os.urandom(333))
        else:
            handle.write(bytes(4096))
    wal, records, _ = Wal.open(tmp_path)
    assert records == payloads
    assert segment.stat().st_size == good  # the tail is gone from the file
    wal.append(b"after")  # and the log goes on from the last good record
    wal.close()
    assert Wal.open(tmp_path)[1] == [*payloads, b"after"]


@given(st.integers(min_value=0, max_value=10**9))
@settings(max_examples=60, deadline=None)
def test_a_tail_cut_anywhere_keeps_every_whole_record(cut: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        payloads = [bytes([i % 251]) * (i * 13 % 300) for i in range(30)]
        _write(directory, payloads).close()
        segment = _last_segment(directory)
        size = segment.stat().st_size
        at = cut % (size + 1)
        with open(segment, "r+b") as handle:
            handle.truncate(at)
        records = Wal.open(directory)[1]
        assert records == payloads[: len(records)]
        # Every record wholly before the cut survives.
        whole = 0
        offset = 0
        for payload in payloads:
            offset += HEADER.size + len(payload)
            if offset <= at:
                whole += 1
        assert len(records) == whole


@pytest.mark.parametrize("where", ["payload", "length", "checksum", "magic"])
def test_a_flipped_byte_in_the_middle_is_corruption(tmp_path: Path, where: str) -> None:
    payloads = [f"record {i}".encode() * 10 for i in range(20)]
    _write(tmp_path, payloads).close()
    segment = _last_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    record = HEADER.size + len(payloads[0])
    at = 5 * record + {"payload": HEADER.size + 3, "length": 6, "checksum": 9, "magic": 1}[where]
    data[at] ^= 0x40
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorrupt, match=rf"{segment.name}: the record at byte {5 * record}"):
        Wal.open(tmp_path)


def test_a_bad_ending_of_a_segment_before_the_last_is_corruption(tmp_path: Path) -> None:
    payloads = [bytes([i]) * 500 for i in range(30)]
    _write(tmp_path, payloads, segment_bytes_max=2048).close()
    first = sorted(tmp_path.glob("wal-*.log"))[0]
    with open(first, "r+b") as handle:
        handle.truncate(first.stat().st_size - 10)
    with pytest.raises(WalCorrupt, match="a later segment follows"):
        Wal.open(tmp_path, segment_bytes_max=2048)
