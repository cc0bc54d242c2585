"""How the list-append workload records clears (``clear_range``) in its history.

A list-append history has no "emptied": the workload records a clear as an append of a
marker to a key of the history only (``cleared/k``) and reads of k after it as reads of that
key. These tests drive the workload by hand, playing the store's part."""

from __future__ import annotations

import random
from typing import Any

from store.sim.workloads import ListAppend, Operation, cleared_key, list_append_key


def _workload() -> ListAppend:
    # One active key, retired after two appends: key 0 is retired after two operations.
    return ListAppend(random.Random(7), active_keys=1, max_ops=1, appends_per_key_max=2,
                      read_fraction=0.0, clear_fraction=1.0)


def _ok(operation: Operation, results: list[Any]) -> Any:
    value = operation.complete(results)
    assert operation.settled is not None
    operation.settled("ok")
    return value


def _append_twice(workload: ListAppend) -> None:
    for expected in (1, 2):
        operation = workload.next()  # nothing retired yet: an append, not a clear
        assert operation.value == [["append", 0, expected]]
        _ok(operation, [None])


def _clear(workload: ListAppend) -> Operation:
    clear = workload.next()
    ops = clear.args[0]
    assert ops == [
        ["scan", list_append_key(0), list_append_key(1), 1],
        ["clear_range", list_append_key(0), list_append_key(1)],
    ]
    return clear


def _scan_of(workload: ListAppend, k: int) -> Operation:
    workload.clear_fraction = 0.0
    workload.scan_fraction = 1.0
    workload.scan_span_max = 2
    while True:
        operation = workload.next()
        scan = operation.args[0][0]
        if scan[1] == list_append_key(k) and scan[3] == 2:
            return operation


def test_a_clear_is_its_own_read_and_a_marker_append() -> None:
    workload = _workload()
    _append_twice(workload)
    clear = _clear(workload)
    marker = workload.markers[0]
    assert clear.value == [["r", 0, None], ["append", cleared_key(0), marker]]
    found = [[list_append_key(0), [1, 2]]]
    assert _ok(clear, [found, 1]) == [["r", 0, [1, 2]], ["append", cleared_key(0), marker]]
    assert workload.ranges_cleared == 1


def test_a_read_of_a_cleared_key_says_whether_it_saw_the_clear() -> None:
    workload = _workload()
    _append_twice(workload)
    clear = _clear(workload)
    marker = workload.markers[0]
    before = _scan_of(workload, 0)  # began after k's appends were acknowledged
    after = _scan_of(workload, 0)
    _ok(clear, [[[list_append_key(0), [1, 2]]], 1])
    # A read that shows the list ran before the clear: cleared/0 was still empty.
    assert _ok(before, [[[list_append_key(0), [1, 2]]]])[:2] == [
        ["r", 0, [1, 2]], ["r", cleared_key(0), []],
    ]
    # One that shows nothing ran after it (key 0 was not empty when it began).
    assert _ok(after, [[]])[0] == ["r", cleared_key(0), [marker]]


def test_an_empty_read_that_may_have_run_before_the_first_append_is_left_out() -> None:
    workload = _workload()
    early = _scan_of(workload, 0)  # begins before key 0 holds anything
    workload.scan_fraction = 0.0
    workload.clear_fraction = 1.0
    _append_twice(workload)
    clear = _clear(workload)
    _ok(clear, [[[list_append_key(0), [1, 2]]], 1])
    assert all(mop[1] not in (0, cleared_key(0)) for mop in _ok(early, [[]]))


def test_a_key_with_an_append_of_unknown_outcome_is_never_cleared() -> None:
    workload = _workload()
    first = workload.next()
    _ok(first, [None])
    second = workload.next()
    assert second.settled is not None
    second.settled("info")  # it may yet take effect: key 0 may change after any clear
    operation = workload.next()
    assert operation.args[0][0][0] == "append"  # no clear: nothing may be cleared
    assert 0 not in workload.markers
