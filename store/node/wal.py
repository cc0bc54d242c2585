"""A write-ahead log: framed, checksummed records in segment files, synced in groups.

Theory of operation. A log is a directory of segments ``wal-<first index, 16 hex>.log``;
records are numbered from 0 across segments. Each record is framed as

    magic u32 | length u32 | crc32c u32 | payload (length bytes)

little-endian, where the CRC-32C covers the length field and the payload. ``append``
writes records to the current segment (buffered by the OS); ``sync`` makes everything
appended so far durable (``fsync``), once for however many records came since the last
sync: group commit, the caller deciding when a group ends (after a batch of its stream).
A new segment starts when the current one passes ``segment_bytes_max``; its file and the
directory are synced before a record goes into it, so a synced record is never in a file a
crash could make disappear.

Recovery (``Wal.open``) reads every segment in order. A crash can leave the last segment
with a torn tail: a record partly written, or garbage after the last complete one. That
tail is cut at the last good record, and the log goes on from there. Anything else is
corruption, and opening fails with ``WalCorrupt`` naming the file and the byte: a bad
record followed by a good one (a bit flipped in a record that was synced, a length that
points into later records), or a segment other than the last with a bad ending. The
distinction: a torn write can only be the last thing written, so no valid record can follow
it; the magic number lets recovery look for one quickly.

``truncate_before(index)`` deletes whole segments every record of which is below
``index`` (once a snapshot covers them), so disk use stays bounded.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from store.rpc._native import crc32c

MAGIC = 0x4D45524C  # "MERL": a Meridian log record
HEADER = struct.Struct("<III")
SEGMENT_PREFIX = "wal-"
SEGMENT_SUFFIX = ".log"
# A record no larger than this; a length field above it is not a record's.
RECORD_BYTES_MAX = 64 << 20
SEGMENT_BYTES_MAX = 64 << 20


class WalCorrupt(Exception):
    """The log holds a record that fails its checksum with valid records after it (or a
    segment other than the last that does not end cleanly): not a torn write."""


@dataclass
class _Segment:
    first: int  # index of its first record
    path: Path


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<I", len(payload))
    return HEADER.pack(MAGIC, len(payload), crc32c(payload, crc32c(length))) + payload


def _record_at(data: bytes, offset: int) -> int | None:
    """The offset past the valid record at ``offset``, or None if none starts there."""
    if len(data) - offset < HEADER.size:
        return None
    magic, length, crc = HEADER.unpack_from(data, offset)
    if magic != MAGIC or length > RECORD_BYTES_MAX:
        return None
    end: int = offset + HEADER.size + length
    if end > len(data):
        return None
    payload = data[offset + HEADER.size : end]
    if crc32c(payload, crc32c(struct.pack("<I", length))) != crc:
        return None
    return end


def _valid_record_after(data: bytes, offset: int) -> int | None:
    """The offset of a valid record starting after ``offset``, if any (torn tails have
    none)."""
    marker = struct.pack("<I", MAGIC)
    at = data.find(marker, offset + 1)
    while at != -1:
        if _record_at(data, at) is not None:
            return at
        at = data.find(marker, at + 1)
    return None


def read_segment(path: Path, last: bool) -> tuple[list[bytes], int]:
    """Records of one segment and the offset where its good part ends. Raises WalCorrupt
    unless what follows that offset is a torn tail of the last segment."""
    data = path.read_bytes()
    records: list[bytes] = []
    offset = 0
    while offset < len(data):
        end = _record_at(data, offset)
        if end is None:
            later = _valid_record_after(data, offset)
            if later is not None:
                raise WalCorrupt(
                    f"{path}: the record at byte {offset} fails its checksum and a valid "
                    f"record follows at byte {later}: the log is corrupt, not torn"
                )
            if not last:
                raise WalCorrupt(
                    f"{path}: ends with {len(data) - offset} bytes that are not a record, "
                    f"and a later segment follows"
                )
            break  # a torn tail: cut here
        records.append(data[offset + HEADER.size : end])
        offset = end
    return records, offset


def fsync_directory(directory: Path) -> None:
    """Makes the directory's entries (a new file, a rename, a deletion) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Wal:
    """One log directory; see the module doc. Not thread-safe: one writer."""

    def __init__(
        self, directory: Path, segments: list[_Segment], next_index: int, *,
        fsync: bool = True, segment_bytes_max: int = SEGMENT_BYTES_MAX,
    ) -> None:
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes_max = segment_bytes_max
        self._segments = segments
        self.next_index = next_index  # the index the next appended record gets
        self._file = None if not segments else open(segments[-1].path, "ab")  # noqa: SIM115
        self._size = segments[-1].path.stat().st_size if segments else 0
        self._sealed_bytes = sum(segment.path.stat().st_size for segment in segments[:-1])
        self._unsynced = 0
        self.syncs = 0
        self.bytes_written = 0

    @classmethod
    def open(
        cls, directory: Path, *, fsync: bool = True, segment_bytes_max: int = SEGMENT_BYTES_MAX,
    ) -> tuple[Wal, list[bytes], int]:
        """Recovers the log in ``directory`` (made if missing): (log, every record from its
        first, the index of the first). A torn tail is cut from the file."""
        directory.mkdir(parents=True, exist_ok=True)
        segments = sorted(
            (
                _Segment(int(p.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)], 16), p)
                for p in directory.iterdir()
                if p.name.startswith(SEGMENT_PREFIX) and p.name.endswith(SEGMENT_SUFFIX)
            ),
            key=lambda s: s.first,
        )
        records: list[bytes] = []
        first = segments[0].first if segments else 0
        expected = first
        for number, segment in enumerate(segments):
            if segment.first != expected:
                raise WalCorrupt(
                    f"{segment.path}: starts at record {segment.first}, but the segments "
                    f"before it end at {expected}"
                )
            found, good_end = read_segment(segment.path, last=number == len(segments) - 1)
            if good_end < segment.path.stat().st_size:
                with open(segment.path, "r+b") as handle:  # cut the torn tail
                    handle.truncate(good_end)
                    handle.flush()
                    if fsync:
                        os.fsync(handle.fileno())
            records += found
            expected += len(found)
        wal = cls(directory, segments, expected, fsync=fsync, segment_bytes_max=segment_bytes_max)
        return wal, records, first

    def append(self, payload: bytes) -> int:
        """Appends one record; returns its index. Durable only after ``sync``."""
        if self._file is None or self._size >= self.segment_bytes_max:
            self._start_segment()
        assert self._file is not None
        framed = _frame(payload)
        self._file.write(framed)
        self._size += len(framed)
        self.bytes_written += len(framed)
        self._unsynced += 1
        index = self.next_index
        self.next_index += 1
        return index

    def sync(self) -> None:
        """Makes every appended record durable: one fsync for all of them."""
        if self._file is None or not self._unsynced:
            return
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._unsynced = 0
        self.syncs += 1

    def flush(self) -> int | None:
        """Hands every appended record to the operating system and returns a duplicate of
        the current segment's file descriptor, for the caller to ``fsync`` (on another
        thread) and close: what was appended before this call is then durable, whatever
        this log does meanwhile. None: nothing appended since the last sync or flush."""
        if self._file is None or not self._unsynced:
            return None
        self._file.flush()
        self._unsynced = 0
        self.syncs += 1
        return os.dup(self._file.fileno())

    def _start_segment(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
        if self._segments:
            self._sealed_bytes += self._size
        path = self.directory / f"{SEGMENT_PREFIX}{self.next_index:016x}{SEGMENT_SUFFIX}"
        self._file = open(path, "ab")  # noqa: SIM115
        if self.fsync:  # the new file exists durably before any record in it is synced
            os.fsync(self._file.fileno())
            fsync_directory(self.directory)
        self._segments.append(_Segment(self.next_index, path))
        self._size = 0

    def rewrite(self, payloads: list[bytes]) -> int:
        """Replaces every record by ``payloads`` (a checkpoint of the state they made):
        they go to a new segment, synced with the directory, and only then are the older
        segments deleted. A crash in between leaves both, old records first, which recovery
        reads as the same state. Returns the bytes freed."""
        before = self.disk_bytes()
        if not self._segments or self._segments[-1].first != self.next_index:
            self._start_segment()  # (else the last segment is empty: it takes them)
        first_new = len(self._segments) - 1
        for payload in payloads:
            self.append(payload)
        self.sync()
        old, self._segments = self._segments[:first_new], self._segments[first_new:]
        for segment in old:
            self._sealed_bytes -= segment.path.stat().st_size
            segment.path.unlink()
        if self.fsync:
            fsync_directory(self.directory)
        return before - self.disk_bytes()

    def truncate_before(self, index: int) -> int:
        """Deletes every segment whose records are all below ``index``; returns how many."""
        removed = 0
        while len(self._segments) > 1 and self._segments[1].first <= index:
            path = self._segments.pop(0).path
            self._sealed_bytes -= path.stat().st_size
            path.unlink()
            removed += 1
        if removed and self.fsync:
            fsync_directory(self.directory)
        return removed

    def disk_bytes(self) -> int:
        return sum(s.path.stat().st_size for s in self._segments if s.path.exists())

    @property
    def size(self) -> int:
        """The bytes its segments hold (``disk_bytes``, kept without asking the disk)."""
        return self._sealed_bytes + self._size

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None
