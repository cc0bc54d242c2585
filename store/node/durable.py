"""A server's stable storage for its acceptors: one write-ahead log per Paxos stream.

Theory of operation. The host (``store.node.host.ReplicaHost``) hands ``write`` the
records of each ``Ready`` (an acceptor's promises and votes, ``Acceptor.take_persist``) and
asks ``sync`` to make them durable before the messages that follow them go out. Each record
goes, encoded as the stream transport encodes it (``store.core.paxos.encode``), to the log of
its stream: ``<data_dir>/stream-<id>/`` (``store.node.wal``). ``sync`` pushes what Python
buffered to the operating system on the event loop's thread, then runs the ``fsync`` of
every log written since the last sync in a worker thread, and calls ``done`` back on the
loop: one ``fsync`` per log for every record written before the sync started (group commit);
records written meanwhile wait for the next one, which the host starts when this one ends.

``fsync = false`` (for benchmarks only: a power cut then loses votes the cluster counted,
and with them transactions clients were told were committed) writes the same logs and
reports each sync done at once.

Recovery. ``open`` reads every stream's log (a torn tail is cut; corruption in the middle
raises ``WalCorrupt``, and the server stops with the file and byte) and hands back the
decoded records per stream, for ``Acceptor.recover``. A record that does not decode is
corruption too: its checksum was good, so the bytes are what was written, and a log this
version cannot read must not be half-recovered.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from store.core.errors import InvalidRequest
from store.core.paxos import PaxosMessage, decode, encode
from store.core.transfer import FollowerState
from store.node.snapshot import SnapshotWriter
from store.node.wal import SEGMENT_BYTES_MAX, Wal, WalCorrupt

STREAM_PREFIX = "stream-"


class WalDurable:
    """The ``Durable`` of a server process (see the module doc)."""

    def __init__(
        self, directory: Path, logs: dict[int, Wal], loop: asyncio.AbstractEventLoop, *,
        fsync: bool, on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.directory = directory
        self._on_fatal = on_fatal
        self.fsync = fsync
        self._logs = logs
        self._loop = loop
        self._dirty: set[int] = set()
        self._segment_bytes_max = SEGMENT_BYTES_MAX
        # One thread: syncs run one at a time anyway (the host starts the next when one ends).
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="meridian-fsync")
        # Compaction: a stream's log past ``compact_bytes`` is rewritten as a checkpoint of
        # its acceptor (``checkpoint(stream)``, set by the server; None: never).
        self.compact_bytes = 0
        self.checkpoint: Callable[[int], list[PaxosMessage] | None] | None = None
        self._written_since: dict[int, int] = {}
        self.compactions = 0
        self.records_written = 0
        self.syncs = 0
        self.sync_ns_total = 0
        self.closed = False
        # A follower's snapshot (store.node.snapshot; the host decides when): set by the
        # server for a shard replica.
        self.snapshots: SnapshotWriter | None = None
        self.snapshot_wanted = False

    @classmethod
    def open(
        cls, directory: Path, loop: asyncio.AbstractEventLoop, *,
        on_fatal: Callable[[BaseException], None], fsync: bool = True,
        segment_bytes_max: int = SEGMENT_BYTES_MAX,
    ) -> tuple[WalDurable, dict[int, list[PaxosMessage]]]:
        """The logs under ``directory`` (made if missing), and every stream's records.
        ``on_fatal``: told when an fsync fails (the disk is gone: the process stops)."""
        directory.mkdir(parents=True, exist_ok=True)
        logs: dict[int, Wal] = {}
        recovered: dict[int, list[PaxosMessage]] = {}
        for path in sorted(directory.iterdir()):
            if not (path.is_dir() and path.name.startswith(STREAM_PREFIX)):
                continue
            try:
                stream = int(path.name[len(STREAM_PREFIX):])
            except ValueError:
                raise WalCorrupt(f"{path}: not a stream's log directory") from None
            wal, payloads, first = Wal.open(path, fsync=fsync, segment_bytes_max=segment_bytes_max)
            records = []
            for number, payload in enumerate(payloads):
                try:
                    record = decode(payload)
                except InvalidRequest as exc:
                    raise WalCorrupt(
                        f"{path}: record {first + number} has a valid checksum but does not "
                        f"decode ({exc}): written by another version, or not by Meridian"
                    ) from None
                if record.stream != stream:
                    raise WalCorrupt(
                        f"{path}: record {first + number} belongs to stream {record.stream}"
                    )
                records.append(record)
            logs[stream] = wal
            recovered[stream] = records
        durable = cls(directory, logs, loop, fsync=fsync, on_fatal=on_fatal)
        durable._segment_bytes_max = segment_bytes_max
        return durable, recovered

    def _log(self, stream: int) -> Wal:
        wal = self._logs.get(stream)
        if wal is None:
            wal, _, _ = Wal.open(
                self.directory / f"{STREAM_PREFIX}{stream}", fsync=self.fsync,
                segment_bytes_max=self._segment_bytes_max,
            )
            self._logs[stream] = wal
        return wal

    def write(self, records: list[PaxosMessage]) -> None:
        for record in records:
            self._log(record.stream).append(encode(record))
            self._dirty.add(record.stream)
        self.records_written += len(records)
        if self.compact_bytes and self.checkpoint is not None:
            for stream in {record.stream for record in records}:
                wal = self._logs[stream]
                if wal.bytes_written - self._written_since.get(stream, 0) > self.compact_bytes:
                    self._compact(stream, wal)

    def _compact(self, stream: int, wal: Wal) -> None:
        """Rewrites the stream's log as its acceptor's checkpoint (synced before the old
        segments go), so the log holds what the acceptor still keeps: its promise and the
        last ``log_retained_slots`` values, not every vote since the start."""
        assert self.checkpoint is not None
        records = self.checkpoint(stream)
        if records is None:
            return
        wal.rewrite([encode(record) for record in records])
        self._dirty.discard(stream)  # the rewrite synced everything
        self._written_since[stream] = wal.bytes_written
        self.compactions += 1

    def save_snapshot(self, state: FollowerState, done: Callable[[int], None]) -> None:
        """Writes a follower's snapshot (``SnapshotDisk``), without stopping the loop."""
        assert self.snapshots is not None, "this process keeps no snapshot"
        self.snapshots.start(state, done)

    def sync(self, done: Callable[[], None]) -> None:
        dirty, self._dirty = self._dirty, set()
        files = [fd for stream in sorted(dirty) if (fd := self._logs[stream].flush()) is not None]
        if not self.fsync:
            for fd in files:
                os.close(fd)
            self.syncs += 1
            done()
            return
        loop = self._loop
        started = loop.time()

        def run() -> None:
            try:
                for fd in files:
                    os.fsync(fd)
            finally:
                for fd in files:
                    os.close(fd)

        def finished(future: asyncio.Future[None]) -> None:
            if self.closed:
                return
            error = future.exception()
            if error is not None:
                # Whether the data reached the disk is unknown (Linux may even have dropped
                # the dirty pages: "fsyncgate"); going on could acknowledge lost votes.
                self.closed = True
                self._on_fatal(error)
                return
            self.syncs += 1
            self.sync_ns_total += int((loop.time() - started) * 1e9)
            done()

        loop.run_in_executor(self._executor, run).add_done_callback(finished)

    def disk_bytes(self) -> int:
        return sum(wal.disk_bytes() for wal in self._logs.values())

    def close(self) -> None:
        self.closed = True
        if self.snapshots is not None:
            self.snapshots.close()
        self._executor.shutdown(wait=True)
        for wal in self._logs.values():
            wal.close()
