"""Type stub of the C extension built from native/ (see docs/rpc.md)."""

import os
from collections.abc import Mapping
from typing import Any

HEADER_BYTES: int
ADDR_MAX: int
MAGIC_DATA: int
MAGIC_SM: int
MAGIC_BUNDLE: int
MSG_SIZE_LIMIT: int
SM_BODY_BYTES: int

# Events returned by take_events / udp_recv:
#   (0, session, req_num, req_type, payload, generation)   request complete at a server
#   (1, tag, status, payload)                  response complete at a client
#   (2, tag, error_code)                       request failed at a client
#   (3, session, error_code)                   session connected (0) or failed
Event = tuple[Any, ...]

class Core:
    """Sans-I/O eRPC-style protocol core. Negative return values are -MR_ERR_* codes."""

    def __init__(
        self,
        *,
        mtu_bytes: int = ...,
        session_credits: int = ...,
        session_req_window: int = ...,
        rto_ns: int = ...,
        msg_size_max: int = ...,
        sessions_max: int = ...,
        server_credits_max: int = ...,
        session_timeout_ns: int = ...,
        backlog_max: int = ...,
        tx_queue_max: int = ...,
        rx_reassembly_bytes_max: int = ...,
        seed: int = ...,
    ) -> None: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def settings(self) -> dict[str, int]: ...
    def create_session(self, addr: bytes, now_ns: int, /) -> int: ...
    def destroy_session(self, session: int, now_ns: int, /) -> int: ...
    def enqueue_request(
        self, session: int, req_type: int, payload: bytes | bytearray | memoryview, tag: int,
        now_ns: int, /
    ) -> int: ...
    def respond(
        self, session: int, generation: int, req_num: int, status: int,
        payload: bytes | bytearray | memoryview, now_ns: int, /
    ) -> int: ...
    def feed(self, addr: bytes, packet: bytes | bytearray | memoryview, now_ns: int, /) -> None: ...
    def tick(self, now_ns: int, /) -> None: ...
    def next_deadline(self) -> int: ...
    def take_events(self) -> list[Event]: ...
    def take_packets(self) -> list[tuple[bytes, bytes]]: ...
    def pending_packets(self) -> int: ...
    def udp_recv(
        self, fd: int, now_ns: int, batches_max: int = ..., datagrams_max: int = ..., /
    ) -> list[Event]: ...
    def udp_send(self, fd: int, /) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def session_info(self, session: int, /) -> dict[str, Any]: ...
    def set_fault(
        self,
        addr: bytes | None,
        *,
        drop: float = ...,
        duplicate: float = ...,
        reorder: float = ...,
        delay_ns: int = ...,
        reorder_delay_ns: int = ...,
        partitioned: bool = ...,
    ) -> None: ...
    def clear_faults(self) -> None: ...
    def set_secret(self, key: bytes) -> None: ...

# (req_type, msg_size, dest_session, pkt_type, pkt_num, req_num, magic, session_tag)
def hmac_sha256(key: bytes, message: bytes) -> bytes: ...
def crc32c(data: bytes, crc: int = 0) -> int: ...
def decode_header(
    packet: bytes | bytearray | memoryview, /
) -> tuple[int, int, int, int, int, int, int, int] | None: ...
def encode_header(
    req_type: int, msg_size: int, dest_session: int, pkt_type: int, pkt_num: int, req_num: int,
    magic: int = ..., session_tag: int = ...,
) -> bytes: ...

class Syncer:
    """Runs ``fsync`` then ``close`` on file descriptors in a thread of its own (plain C: it
    never takes the GIL), and makes an eventfd readable when a job completes, for
    ``loop.add_reader`` (store/node/durable.py; the theory is in native/mr_sync.c). Jobs run
    one at a time, in the order submitted. At most 64 jobs may be submitted and not yet
    taken, and a job holds at most 1,024 file descriptors."""

    def __init__(self) -> None:
        """Starts the thread and opens the eventfd (non-blocking, close-on-exec)."""
    def submit(self, token: int, fds: tuple[int, ...], /) -> None:
        """Queues a job: the thread fsyncs every fd of ``fds``, then closes every one of them
        (always, also after a failure), and lists ``(token, errno)``: the errno of the first
        fsync or close that failed, or 0. The fds are the Syncer's once this returns; if it
        raises (RuntimeError: closed, or 64 jobs not yet taken; ValueError: too many fds or
        a negative one) they are still the caller's."""
    def fileno(self) -> int:
        """The eventfd: readable once a job has completed since the last ``take``.
        RuntimeError after ``close``."""
    def take(self) -> list[tuple[int, int]]:
        """Drains the eventfd and returns the completed jobs, ``(token, errno or 0)``, in the
        order they completed (possibly none: a wake-up can outlive the job it announced)."""
    def close(self) -> None:
        """Lets the thread finish every job already queued, joins it (the GIL released
        meanwhile) and closes the eventfd; a later ``submit`` raises RuntimeError and
        ``take`` still returns what completed. Again: nothing. Also done when the object is
        freed."""

class TimerFd:
    """A Linux timerfd on CLOCK_MONOTONIC (``time.monotonic_ns``'s clock), non-blocking and
    close-on-exec, for ``loop.add_reader``: it fires within the kernel's timer slack of the
    instant asked, where the loop's own timers round to whole milliseconds
    (store/rpc/timers.py keeps the deadlines; native/mr_timer.c)."""

    def __init__(self) -> None:
        """Creates the fd, disarmed. OSError if the kernel refuses."""
    def arm(self, when_ns: int, /) -> None:
        """Fires at this instant (nanoseconds of CLOCK_MONOTONIC), at once if it is past;
        replaces the instant armed before."""
    def disarm(self) -> None:
        """No expiry until the next ``arm``."""
    def clear(self) -> int:
        """The expirations since the last ``clear`` (0: none); the fd is not readable after
        it until the next expiry."""
    def fileno(self) -> int:
        """The fd. RuntimeError after ``close`` (as ``arm``, ``disarm`` and ``clear``)."""
    def close(self) -> None:
        """Closes the fd; again: nothing. Also done when the object is freed."""

class SharedCounter:
    """One 64-bit counter in a shared memory file that several processes draw from with an
    atomic fetch-and-add (native/mr_counter.c): the per-shard counter the worker processes of
    a shard leader share. Values stay in ``[0, 2**63)`` and only grow."""

    def __init__(self, path: str | bytes | os.PathLike[str], create: bool = False) -> None:
        """Maps the counter file at ``path``. With ``create`` a missing or empty file becomes
        a counter at 0. OSError if the file cannot be opened or mapped; ValueError if it is
        not a counter file (it is left as it was)."""
    def draw(self) -> int:
        """Adds one and returns the new value; no two draws, in any process, return the
        same value."""
    def value(self) -> int:
        """The value now (the last value drawn, or raised to)."""
    def raise_to(self, floor: int, /) -> int:
        """Lifts the value to at least ``floor`` (ValueError if negative) and returns the
        value after: never lowers it."""
    def publish(self, slot: int, claim: int, /) -> int:
        """Raises claim slot ``slot`` (a worker of the shard, ``[0, 6)``) to at
        least ``claim`` (an idle marker is replaced whatever it said) and returns it after
        (ValueError for a bad slot or a negative claim)."""
    def idle(self, slot: int, ceiling: int, /) -> None:
        """Slot ``slot``'s worker has nothing unsettled: until its next ``publish`` it claims
        the live value, never above ``ceiling`` (ValueError for a bad slot or a negative
        ceiling). It must publish a plain claim before it draws again."""
    def claim(self, slot: int, /) -> int:
        """Slot ``slot``'s claim: the largest published (0: none), or while it is idle
        ``min(value(), ceiling)``, the value read before the slot."""
    def close(self) -> None:
        """Unmaps the file (the value stays in it); any later call but ``close`` raises
        RuntimeError."""

class SharedWatermarks:
    """What the worker processes of one shard know of every shard's watermark, in a shared
    memory file (native/mr_vwshare.c): one slot per worker, each written by its worker alone
    under a sequence lock and read by its fellows. Entries are watermarks (>= 0) by shard in
    ``[0, shards)``."""

    def __init__(
        self, path: str | bytes | os.PathLike[str], shards: int, slots: int, create: bool = False
    ) -> None:
        """Maps the file at ``path``. With ``create`` a missing or empty file becomes a board
        of ``shards`` entries in each of ``slots`` slots, all 0. OSError if the file cannot be
        opened or mapped; ValueError if it is not such a board (it is left as it was) or the
        sizes are out of range."""
    def publish(self, slot: int, epoch: int, entries: Mapping[int, int], /) -> None:
        """Slot ``slot``'s worker, in ``epoch``, knows ``entries`` (every shard it does not
        name: 0). ValueError (the slot unchanged) for a bad slot, shard or watermark."""
    def pull(
        self, slot: int, epoch: int, known: list[int], seen: int, /
    ) -> tuple[int, list[tuple[int, int]]] | None:
        """What slot ``slot`` holds above ``known`` (a list of ``shards`` ints, raised in
        place), as (its sequence number, [(shard, watermark), ...]). None when its sequence
        number is ``seen`` (nothing new), when its writer is in a later epoch than ``epoch``,
        or while it is being written (or its writer died writing)."""
    def close(self) -> None:
        """Unmaps the file; any later call but ``close`` raises RuntimeError."""
