"""SharedCounter (native/mr_counter.c): the per-shard counter that a shard's worker processes
draw from. What a user of workers relies on: no two draws anywhere return the same value, the
value never goes down, and a file that is not a counter is refused and left alone."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from store.core.watermark import LocalCounter, ShardWatermark
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


@pytest.mark.parametrize("kind", ["shared", "local"])
def test_an_idle_marker_claims_the_live_value_up_to_its_ceiling(tmp_path: Path, kind: str) -> None:
    """What a worker with nothing unsettled publishes (``ShardWatermark.share_claim``): its
    fellows read the counter's live value as its claim, capped at the end of its epoch, until
    it publishes a plain claim again; the simulator's LocalCounter behaves the same."""
    counter: Any = SharedCounter(tmp_path / "c", create=True) if kind == "shared" else LocalCounter()
    assert counter.publish(0, 4) == 4
    counter.idle(0, 10)
    for _ in range(7):
        counter.draw()
    assert counter.claim(0) == 7  # the live value
    for _ in range(5):
        counter.draw()
    assert counter.claim(0) == 10  # never past the ceiling
    assert counter.publish(0, 2) == 2  # a plain claim replaces the marker, even a lower one
    assert counter.claim(0) == 2 and counter.publish(0, 1) == 2  # and only grows again
    with pytest.raises(ValueError):
        counter.idle(0, -1)
    with pytest.raises(ValueError):
        counter.idle(6, 1)


ROUNDS = 30_000


class _Recorded:
    """The worker's shared counter, recording every value drawn in a register the moment the
    fetch-and-add returns, whatever ShardWatermark.draw does around it."""

    def __init__(self, counter: SharedCounter, drawn: SharedCounter) -> None:
        self._counter, self._drawn = counter, drawn

    def draw(self) -> int:
        value = self._counter.draw()
        self._drawn.raise_to(value)
        return value

    def value(self) -> int:
        return self._counter.value()

    def raise_to(self, floor: int, /) -> int:
        return self._counter.raise_to(floor)

    def publish(self, slot: int, claim: int, /) -> int:
        return self._counter.publish(slot, claim)

    def idle(self, slot: int, ceiling: int, /) -> None:
        self._counter.idle(slot, ceiling)

    def claim(self, slot: int, /) -> int:
        return self._counter.claim(slot)


def _busy_then_idle(path: str, registers: str, start: Any) -> None:
    """One worker: each round it leaves idle, draws, settles and goes idle again, recording
    what it drew as soon as it drew it and what it settled before its slot can say so."""
    drawn = SharedCounter(registers + "-drawn")
    settled = SharedCounter(registers + "-settled")
    watermark = ShardWatermark(counter=_Recorded(SharedCounter(path), drawn))
    watermark.share_claim(0)
    start.wait()
    for _ in range(ROUNDS):
        value = watermark.draw()
        settled.raise_to(value)
        watermark.settle(value)
        watermark.share_claim(0)


def _race(tmp_path: Path) -> int:
    """Runs a worker (above) against a reader of its claim in this process; how many reads
    found a claim covering a value the worker held unsettled."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path, registers = str(tmp_path / "shard"), str(tmp_path / "reg")
    for name in (path, registers + "-drawn", registers + "-settled"):
        SharedCounter(name, create=True).close()
    counter = SharedCounter(path)
    drawn = SharedCounter(registers + "-drawn")
    settled = SharedCounter(registers + "-settled")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    worker = ctx.Process(target=_busy_then_idle, args=(path, registers, start))
    worker.start()
    start.set()
    wrong = 0
    while worker.is_alive():
        held = drawn.value()  # drawn before the claim is read
        claim = counter.claim(0)
        if settled.value() < held and claim >= held:  # ... and still unsettled after it
            wrong += 1
    worker.join(timeout=60)
    assert worker.exitcode == 0
    return wrong


def test_no_reader_sees_an_idle_claim_cover_a_value_its_worker_holds(tmp_path: Path) -> None:
    """The order that makes the idle marker right across processes: the worker publishes a
    plain claim BEFORE it draws (ShardWatermark.draw), the reader loads the value BEFORE the
    slot (SharedCounter.claim). Two processes race through 30,000 rounds, three times."""
    assert [_race(tmp_path / str(attempt)) for attempt in range(3)] == [0, 0, 0]


@pytest.mark.patches_core
def test_drawing_before_replacing_the_idle_marker_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with the order broken on purpose: the worker draws first and replaces
    its marker after (its fellows meanwhile read the live value, past what it holds)."""
    def late(self: ShardWatermark) -> int:
        shared = self._counter
        assert shared is not None
        counter = self._last_drawn = shared.draw()
        slot, self._idle_slot = self._idle_slot, None
        if slot is not None:
            self._published = shared.publish(slot, counter - 1)
        self._unsettled.add(counter)
        self._drawn.append(counter)
        return counter

    monkeypatch.setattr(ShardWatermark, "draw", late)
    # The window is a few instructions wide; a race now and then finds the two processes on
    # one core and never in it: up to ten races, each in a fresh directory.
    assert any(_race(tmp_path / str(attempt)) > 0 for attempt in range(10))
