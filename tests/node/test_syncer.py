"""The fsync thread of the write-ahead logs (native/mr_sync.c, ``store.rpc._native.Syncer``;
docs/durability.md, "What is written, and when"): it fsyncs and then closes every fd it is
handed, whatever fails, reports each job's first errno in submission order through an
eventfd, never needs the GIL, and finishes what is queued before close() returns. And
``WalDurable`` on top of it: ``done`` runs on the loop's thread, a failed fsync is fatal.

Nothing here sleeps to synchronise: a test waits on the eventfd (``select``) or a future,
bounded by ``DEADLINE_S``."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import select
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.core.paxos import Ballot, Prepare
from store.node.durable import WalDurable
from store.node.wal import Wal
from store.rpc._native import Syncer

DEADLINE_S = 10.0
JOBS_MAX = 64  # MR_SYNC_JOBS_MAX: jobs submitted and not yet taken


def _take_until(syncer: Syncer, count: int) -> list[tuple[int, int]]:
    """Waits on the eventfd until ``count`` jobs have completed; returns them in order."""
    taken: list[tuple[int, int]] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(taken) < count:
        left_s = deadline - time.monotonic()
        assert left_s > 0, f"{len(taken)} of {count} jobs completed within {DEADLINE_S} s"
        select.select([syncer.fileno()], [], [], left_s)
        taken += syncer.take()
    assert len(taken) == count, taken
    return taken


def _is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF, exc
        return True
    return False


def _never_open_fd() -> int:
    """An fd number no file can have: at or above the soft limit on open files, so the
    thread's fsync and close of it fail with EBADF without touching anything of ours (a
    closed fd's number could be handed to another file before the thread gets to it)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 2**31 - 1:
        pytest.skip("no fd number is beyond the open-file limit")
    return soft


@pytest.fixture
def syncer() -> Iterator[Syncer]:
    syncer = Syncer()
    yield syncer
    syncer.close()


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[int]:
    """A file with something written in it, to hand out duplicates of."""
    fd = os.open(tmp_path / "log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    os.write(fd, b"a record")
    yield fd
    os.close(fd)


def test_a_job_is_synced_and_its_fds_are_closed(syncer: Syncer, log_file: int) -> None:
    fds = (os.dup(log_file), os.dup(log_file))
    syncer.submit(7, fds)
    assert _take_until(syncer, 1) == [(7, 0)]
    assert all(_is_closed(fd) for fd in fds)
    assert not _is_closed(log_file)  # only the duplicates handed over
    assert syncer.take() == []


def test_errors_are_reported_per_job_with_their_errno_and_later_jobs_go_on(
    syncer: Syncer, log_file: int,
) -> None:
    """fsync refuses a pipe with EINVAL (close accepts it, so EINVAL shows the thread did
    fsync); an fd that is not open gives EBADF. A job reports its first failure, still
    closes all its fds, and the jobs after it are synced as usual."""
    pipe_read, pipe_write = os.pipe()
    try:
        after_failure = os.dup(log_file)
        syncer.submit(1, (os.dup(log_file),))
        syncer.submit(2, (pipe_read, after_failure))
        syncer.submit(3, (_never_open_fd(),))
        syncer.submit(4, (os.dup(log_file),))
        syncer.submit(5, (_never_open_fd(), os.dup(pipe_write)))
        assert _take_until(syncer, 5) == [
            (1, 0), (2, errno.EINVAL), (3, errno.EBADF), (4, 0), (5, errno.EBADF),
        ]
        assert _is_closed(pipe_read) and _is_closed(after_failure)
    finally:
        os.close(pipe_write)


def test_many_jobs_complete_in_submission_order_and_leak_no_fd(
    syncer: Syncer, log_file: int,
) -> None:
    open_before = len(os.listdir("/proc/self/fd"))
    rounds = 20
    taken: list[tuple[int, int]] = []
    for round_number in range(rounds):
        batch = range(round_number * JOBS_MAX, (round_number + 1) * JOBS_MAX)
        for token in batch:
            syncer.submit(token, tuple(os.dup(log_file) for _ in range(token % 3)))
        taken += _take_until(syncer, len(batch))
    assert taken == [(token, 0) for token in range(rounds * JOBS_MAX)]
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_jobs_not_yet_taken_are_bounded_and_a_refused_job_keeps_its_fds(
    syncer: Syncer, log_file: int,
) -> None:
    for token in range(JOBS_MAX):
        syncer.submit(token, ())
    refused = os.dup(log_file)
    with pytest.raises(RuntimeError, match="not yet taken"):
        syncer.submit(JOBS_MAX, (refused,))
    assert not _is_closed(refused)  # still the caller's
    assert [token for token, _ in _take_until(syncer, JOBS_MAX)] == list(range(JOBS_MAX))
    syncer.submit(JOBS_MAX, (refused,))  # room again once taken
    assert _take_until(syncer, 1) == [(JOBS_MAX, 0)]
    assert _is_closed(refused)


def test_bad_arguments_are_refused_before_anything_is_queued(syncer: Syncer) -> None:
    with pytest.raises(ValueError, match="not a file descriptor"):
        syncer.submit(1, (-1,))
    with pytest.raises(ValueError, match="at most 1024 fds"):
        syncer.submit(1, tuple(range(1025)))
    with pytest.raises(TypeError):
        syncer.submit(1, [0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Syncer(1)  # type: ignore[call-arg]


def test_close_runs_the_queued_jobs_joins_the_thread_and_refuses_more(log_file: int) -> None:
    syncer = Syncer()
    event_fd = syncer.fileno()
    fds = [os.dup(log_file) for _ in range(10)]
    for token, fd in enumerate(fds):
        syncer.submit(token, (fd,))
    syncer.close()  # returns once the thread has ended: every queued job has run
    assert syncer.take() == [(token, 0) for token in range(10)]
    assert all(_is_closed(fd) for fd in fds) and _is_closed(event_fd)
    spare = os.dup(log_file)
    with pytest.raises(RuntimeError, match="after close"):
        syncer.submit(10, (spare,))
    assert not _is_closed(spare)
    os.close(spare)
    with pytest.raises(RuntimeError, match="after close"):
        syncer.fileno()
    syncer.close()  # again: nothing


def test_the_thread_never_waits_for_the_gil(syncer: Syncer, log_file: int) -> None:
    """The main thread holds the GIL throughout (``take`` does not release it, and a switch
    interval of a minute keeps the interpreter from handing it over): a job still completes,
    as the thread runs no Python. A thread that needed the GIL would wait out the minute."""
    interval_s = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        syncer.submit(1, (os.dup(log_file),))
        deadline = time.monotonic() + DEADLINE_S
        taken: list[tuple[int, int]] = []
        while not taken and time.monotonic() < deadline:
            taken = syncer.take()
    finally:
        sys.setswitchinterval(interval_s)
    assert taken == [(1, 0)]


def test_a_dropped_syncer_finishes_its_jobs(log_file: int) -> None:
    """Freeing a Syncer that was not closed stops and joins its thread the same way."""
    fds = [os.dup(log_file) for _ in range(3)]
    syncer = Syncer()
    for token, fd in enumerate(fds):
        syncer.submit(token, (fd,))
    del syncer
    assert all(_is_closed(fd) for fd in fds)


def test_wal_durable_calls_done_on_the_loop_and_a_failed_fsync_is_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync's ``done`` runs later, on the loop's thread, counted in ``syncs``. Then the log
    is made to hand the Syncer the read end of a pipe instead of its own fd (monkeypatched
    ``Wal.flush``): fsync refuses it with EINVAL, as a failing disk would refuse the log,
    and ``on_fatal`` gets that OSError; the sync's ``done`` is never called."""
    ballot = Ballot(1, "leader/0")

    async def main(directory: Path) -> None:
        loop = asyncio.get_running_loop()
        fatal: asyncio.Future[BaseException] = loop.create_future()
        durable, _ = WalDurable.open(directory, loop, on_fatal=fatal.set_result)
        assert durable.fsync
        durable.inline = False  # the Syncer's path, whatever this disk's speed
        durable.write([Prepare(0, ballot, 0)])
        synced: asyncio.Future[int] = loop.create_future()
        durable.sync(lambda: synced.set_result(threading.get_ident()))
        assert not synced.done()  # done comes from the loop, not from within sync
        assert await asyncio.wait_for(synced, DEADLINE_S) == threading.get_ident()
        assert durable.syncs == 1 and durable.sync_ns_total > 0

        pipe_read, pipe_write = os.pipe()
        real_flush = Wal.flush

        def flush_to_a_pipe(wal: Wal) -> int | None:
            fd = real_flush(wal)
            if fd is not None:
                os.close(fd)
            return pipe_read

        monkeypatch.setattr(Wal, "flush", flush_to_a_pipe)
        durable.write([Prepare(0, ballot, 0)])
        late_done: list[str] = []
        durable.sync(lambda: late_done.append("done"))
        error = await asyncio.wait_for(fatal, DEADLINE_S)
        assert isinstance(error, OSError) and error.errno == errno.EINVAL, error
        assert durable.closed and durable.syncs == 1 and not late_done
        durable.close()
        os.close(pipe_write)

    asyncio.run(main(tmp_path))
