"""SharedCounter (native/mr_counter.c): the per-shard counter that a shard's worker processes
draw from. What a user of workers relies on: no two draws anywhere return the same value, the
value never goes down, and a file that is not a counter is refused and left alone."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from store.rpc._native import SharedCounter

DRAWS_PER_PROCESS = 20_000


def _draw_many(path: str, start: Any, out: Any) -> None:
    counter = SharedCounter(path)
    start.wait()
    out.put([counter.draw() for _ in range(DRAWS_PER_PROCESS)])


def test_processes_drawing_at_once_never_share_a_value(tmp_path: Path) -> None:
    path = str(tmp_path / "counter")
    SharedCounter(path, create=True).close()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    workers = [ctx.Process(target=_draw_many, args=(path, start, out)) for _ in range(3)]
    for worker in workers:
        worker.start()
    start.set()
    drawn = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    every = [value for values in drawn for value in values]
    # Each process sees its own draws increase, and together they are exactly 1..N: nothing
    # drawn twice, nothing skipped.
    assert all(values == sorted(values) for values in drawn)
    assert sorted(every) == list(range(1, 3 * DRAWS_PER_PROCESS + 1))
    assert SharedCounter(path).value() == 3 * DRAWS_PER_PROCESS


def test_value_only_grows_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "counter"
    counter = SharedCounter(path, create=True)
    assert counter.value() == 0
    assert [counter.draw(), counter.draw()] == [1, 2]
    assert counter.raise_to(1 << 40) == 1 << 40
    assert counter.raise_to(7) == 1 << 40  # never lowered
    assert counter.draw() == (1 << 40) + 1
    counter.close()
    again = SharedCounter(path, create=True)  # create on an existing counter keeps its value
    assert again.value() == (1 << 40) + 1
    with pytest.raises(ValueError, match=">= 0"):
        again.raise_to(-1)
    assert again.value() == (1 << 40) + 1


def test_a_file_that_is_not_a_counter_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a counter")
    with pytest.raises(ValueError, match="not a Meridian counter"):
        SharedCounter(path, create=True)
    assert path.read_bytes() == b"not a counter"
    wrong_magic = tmp_path / "other"
    wrong_magic.write_bytes(b"X" * 64)
    with pytest.raises(ValueError, match="MRCOUNT1"):
        SharedCounter(wrong_magic)
    assert wrong_magic.read_bytes() == b"X" * 64


def test_missing_file_without_create_and_use_after_close(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SharedCounter(tmp_path / "absent")
    with pytest.raises(ValueError, match="not a Meridian counter"):
        (tmp_path / "empty").touch()
        SharedCounter(tmp_path / "empty")  # an empty file is only made a counter by create
    counter = SharedCounter(tmp_path / "c", create=True)
    counter.close()
    counter.close()
    for use in (counter.draw, counter.value, lambda: counter.raise_to(1)):
        with pytest.raises(RuntimeError, match="after close"):
            use()


def test_opening_does_not_keep_the_file_locked(tmp_path: Path) -> None:
    """Every worker of a shard maps the same file; an open counter must not block the next
    opener (the flock taken while checking the header is released, though the mapping keeps
    the open file alive)."""
    path = tmp_path / "counter"
    first = SharedCounter(path, create=True)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    start = ctx.Event()
    start.set()
    other = ctx.Process(target=_draw_many, args=(str(path), start, out))
    other.start()
    assert out.get(timeout=30)[-1] == DRAWS_PER_PROCESS
    other.join(timeout=30)
    assert first.draw() == DRAWS_PER_PROCESS + 1


def test_claims_published_by_one_process_are_read_by_another_and_only_grow(tmp_path: Path) -> None:
    path = tmp_path / "shard-0"
    worker0 = SharedCounter(path, create=True)
    worker1 = SharedCounter(path)
    assert worker1.claim(0) == 0
    assert worker0.publish(0, 17) == 17
    assert worker1.claim(0) == 17 and worker1.claim(1) == 0
    assert worker0.publish(0, 9) == 17  # a claim never goes back
    assert worker1.publish(5, 3) == 3 and worker0.claim(5) == 3
    with pytest.raises(ValueError):
        worker0.publish(6, 1)  # six slots
    with pytest.raises(ValueError):
        worker0.publish(0, -1)
    worker0.draw()
    assert worker1.value() == 1 and worker1.claim(0) == 17  # the value is apart from the claims
    worker0.close()
    worker1.close()
