"""A server's stable storage for its acceptors: one write-ahead log per Paxos stream.

Theory of operation. The host (``store.node.host.ReplicaHost``) hands ``write`` the
records of each ``Ready`` (an acceptor's promises and votes, ``Acceptor.take_persist``) and
asks ``sync`` to make them durable before the messages that follow them go out. Each record
goes, encoded as the stream transport encodes it (``store.core.paxos.encode``), to the log of
its stream: ``<data_dir>/stream-<id>/`` (``store.node.wal``). ``sync`` pushes what Python
buffered to the operating system on the event loop's thread, then hands a duplicate of the
file descriptor of every log written since the last sync to a ``Syncer`` (``store.rpc._native``,
native/mr_sync.c). Its thread, plain C that never takes the GIL, runs ``fsync`` on each and
closes it, then makes an eventfd readable; the loop watches that (``add_reader``) and
``_on_synced_fds`` calls ``done`` on the loop's thread. (A Python worker thread cost 9% of a
shard leader's CPU and 17% of a follower's in hand-offs, and its waits for the GIL delayed
commits while the loop was busy.) One ``fsync`` per log covers every record written before
the sync started (group commit); records written meanwhile wait for the next one, which the
host starts when this one ends.

A sync on a fast disk is done on the loop's thread instead (``inline``): where an ``fsync``
takes microseconds (a log on tmpfs; a disk whose write cache survives a power cut), waking
the Syncer's thread costs more than the sync, and on a busy machine with few cores the woken
thread preempts the loop (measured on two cores: 860 us of a follower's loop per hand-off,
against an ``fsync`` of 0.3 us on tmpfs). When more than ``INLINE_SLOW_MAX`` of the last
``INLINE_WINDOW`` syncs took longer than ``INLINE_SYNC_MAX_NS``, every later one goes to the
Syncer, for the process's life: the loop stalls a few times at most for a slow disk. One slow
sync is not enough: a return from a system call is where the kernel preempts a thread that
a wake-up has displaced, so on two busy cores a sync of 0.3 us now and then measures
milliseconds of wall time (with the first slow sync as the rule, every replica of a geo3
cluster under load had left inline syncs within seconds, after 105 to 1,511 of them).

``fsync = false`` (for benchmarks only: a power cut then loses votes the cluster counted,
and with them transactions clients were told were committed) writes the same logs and
reports each sync done at once.

Recovery. ``open`` reads every stream's log (a torn tail is cut; corruption in the middle
raises ``WalCorrupt``, and the server stops with the file and byte) and hands back the
decoded records per stream, for ``Acceptor.recover``. A record that does not decode is
corruption too: its checksum was good, so the bytes are what was written, and a log this
version cannot read must not be half-recovered.

Bound. ``data_bytes_max`` (``[cluster]``) bounds the whole data directory: every log and,
at a follower, its snapshot files (the one on disk and the one being written). A log is
rewritten as its acceptor's checkpoint (``Wal.rewrite``: the new segment is synced before
the old ones go, so for a moment both are on disk) while the directory plus one checkpoint
plus a margin of a sixteenth of the bound still fits (``_rewrite_due``). The checkpoint is
what the acceptor keeps, its promise and the last ``log_retained_slots`` values; a bound
below twice that plus the snapshot cannot be held, and ``over_bound`` (in the status)
counts the rewrites that found so. ``peak_bytes`` is the largest total seen, the rewrites'
transients included.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from store.core.errors import InvalidRequest
from store.core.paxos import PaxosMessage, decode, encode
from store.core.transfer import FollowerState
from store.node.snapshot import SnapshotWriter
from store.node.wal import SEGMENT_BYTES_MAX, Wal, WalCorrupt
from store.rpc._native import Syncer

STREAM_PREFIX = "stream-"

# Syncs on the loop's thread go on while at most INLINE_SLOW_MAX of the last INLINE_WINDOW
# took longer than INLINE_SYNC_MAX_NS; then every later one goes to the Syncer's thread
# (module doc).
INLINE_SYNC_MAX_NS = 200_000
INLINE_WINDOW = 32
INLINE_SLOW_MAX = 8
_WINDOW_MASK = (1 << INLINE_WINDOW) - 1


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
        # The fsyncs' thread (module doc), started by the first sync with fsync on; one
        # thread, as syncs run one at a time anyway (the host starts the next when one ends).
        self._syncer: Syncer | None = None
        self._sync_token = 0
        # What to do when the Syncer reports a job: its done and when it started (loop.time()).
        self._syncs_running: dict[int, tuple[Callable[[], None], float]] = {}
        # Compaction (module doc, "Bound"): a log is rewritten as a checkpoint of its
        # acceptor (``checkpoint(stream)``, set by the server) before the directory would
        # pass ``data_bytes_max`` (0: never).
        self.data_bytes_max = 0
        self.checkpoint: Callable[[int], list[PaxosMessage] | None] | None = None
        self._written_since: dict[int, int] = {}
        self._checkpoint_bytes: dict[int, int] = {}  # the size of each log's last rewrite
        # Streams whose last rewrite left the directory over the bound (_rewrite_due).
        self._over_bound_streams: set[int] = set()
        self.compactions = 0
        self.over_bound = 0  # rewrites that left the directory above the bound
        self.peak_bytes = 0
        self.records_written = 0
        self.syncs = 0
        self.sync_ns_total = 0
        # Syncs run on the loop's thread until too many are slow (module doc); how many did.
        self.inline = True
        self.inline_syncs = 0
        self._slow_history = 0  # bit i: the i-th latest inline sync was slow
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
        if self.data_bytes_max and self.checkpoint is not None:
            for stream in {record.stream for record in records}:
                if self._rewrite_due(stream):
                    self._compact(stream, self._logs[stream])

    def data_bytes(self) -> int:
        """What the data directory holds: every log, and the snapshot files."""
        snapshots = self.snapshots.disk_bytes() if self.snapshots is not None else 0
        return sum(wal.size for wal in self._logs.values()) + snapshots

    def _rewrite_due(self, stream: int) -> bool:
        """Whether ``stream``'s log is rewritten now: a rewrite holds the old segments and
        the new one together until it ends, so it must start while the directory plus a
        checkpoint (the size of its last, or the whole log before the first) plus a margin
        for what the stream writes meanwhile is still within the bound. Not before the log
        has grown by a sixteenth of the bound since its last rewrite, so that a bound too
        small for what the acceptor keeps costs a rewrite per sixteenth, not per write; and
        after a rewrite that left the directory over the bound, not before the log has grown
        by that checkpoint's size: a rewrite costs (on the event loop) what it writes, and a
        checkpoint many sixteenths large rewritten every sixteenth cost a leader 16% of its
        time and a third of its throughput (bench/peers at certification, 0 ms, 2026-12-06).
        Rewriting at most once per checkpoint written keeps that at most what the stream
        writes itself."""
        wal = self._logs[stream]
        bound = self.data_bytes_max
        grown = wal.bytes_written - self._written_since.get(stream, 0)
        if grown < bound // 16:
            return False
        if stream in self._over_bound_streams and grown < self._checkpoint_bytes[stream]:
            return False
        total = self.data_bytes()
        self.peak_bytes = max(self.peak_bytes, total)
        checkpoint = self._checkpoint_bytes.get(stream, wal.size)
        return total + checkpoint + bound // 16 > bound

    def _compact(self, stream: int, wal: Wal) -> None:
        """Rewrites the stream's log as its acceptor's checkpoint (synced before the old
        segments go), so the log holds what the acceptor still keeps: its promise and the
        last ``log_retained_slots`` values, not every vote since the start."""
        assert self.checkpoint is not None
        records = self.checkpoint(stream)
        if records is None:
            return
        before = wal.size
        wal.rewrite([encode(record) for record in records])
        self.peak_bytes = max(self.peak_bytes, self.data_bytes() + before)
        self._dirty.discard(stream)  # the rewrite synced everything
        self._written_since[stream] = wal.bytes_written
        self._checkpoint_bytes[stream] = wal.size
        self.compactions += 1
        if self.data_bytes() + wal.size + self.data_bytes_max // 16 > self.data_bytes_max:
            self.over_bound += 1  # what the acceptor keeps does not fit: the status says so
            self._over_bound_streams.add(stream)
        else:
            self._over_bound_streams.discard(stream)

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
        if self.inline:
            self._sync_inline(files, done)
            return
        syncer = self._syncer if self._syncer is not None else self._start_syncer()
        self._sync_token += 1
        token = self._sync_token
        started = self._loop.time()
        try:
            syncer.submit(token, tuple(files))  # from here the Syncer closes the fds
        except BaseException:
            for fd in files:
                os.close(fd)
            raise
        self._syncs_running[token] = (done, started)

    def _sync_inline(self, files: list[int], done: Callable[[], None]) -> None:
        """``fsync`` and close ``files`` here, as the Syncer's thread would; too many slow
        ones end the inline syncs (module doc)."""
        started = time.monotonic_ns()
        error: OSError | None = None
        for fd in files:
            try:
                os.fsync(fd)
            except OSError as exc:
                error = error or exc
        for fd in files:
            os.close(fd)
        took = time.monotonic_ns() - started
        slow = took > INLINE_SYNC_MAX_NS
        self._slow_history = ((self._slow_history << 1) | slow) & _WINDOW_MASK
        if slow and self._slow_history.bit_count() > INLINE_SLOW_MAX:
            self.inline = False
        if error is not None:
            self._fsync_failed(error.errno or 0)
            return
        self.syncs += 1
        self.inline_syncs += 1
        self.sync_ns_total += took
        done()

    def _fsync_failed(self, error: int) -> None:
        """Whether the data reached the disk is unknown (Linux may even have dropped the
        dirty pages: "fsyncgate"); going on could acknowledge lost votes: the process stops."""
        self.closed = True
        self._on_fatal(OSError(error, f"fsync of a write-ahead log: {os.strerror(error)}"))

    def _start_syncer(self) -> Syncer:
        if self.closed:  # its logs are closed: there is nothing a sync could cover
            raise RuntimeError("WalDurable.sync after close")
        syncer = self._syncer = Syncer()
        self._loop.add_reader(syncer.fileno(), self._on_synced_fds)
        return syncer

    def _on_synced_fds(self) -> None:
        """The Syncer's eventfd is readable: finishes the syncs it completed, in order."""
        assert self._syncer is not None
        for token, error in self._syncer.take():
            done, started = self._syncs_running.pop(token)
            if self.closed:
                continue
            if error != 0:
                self._fsync_failed(error)
                continue
            self.syncs += 1
            self.sync_ns_total += int((self._loop.time() - started) * 1e9)
            done()

    def disk_bytes(self) -> int:
        return sum(wal.disk_bytes() for wal in self._logs.values())

    def close(self) -> None:
        self.closed = True
        if self.snapshots is not None:
            self.snapshots.close()
        if self._syncer is not None:
            # Lets the fsync in flight end before the process may (the Syncer joins its
            # thread); its done is not called, as after a fatal error.
            self._loop.remove_reader(self._syncer.fileno())
            self._syncer.close()
            self._syncer = None
        for wal in self._logs.values():
            wal.close()
