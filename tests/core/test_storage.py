"""The versioned store (DESIGN.md §3): chains, locks, ordered scans, garbage collection."""

from __future__ import annotations

from store.core.storage import ROLLED_BACK, VersionedStore
from store.core.vclock import VectorClock


def vc(**entries: int) -> VectorClock:
    return VectorClock({int(k[1:]): v for k, v in entries.items()})


def test_latest_version_wins_and_tombstones_hide_keys() -> None:
    store = VersionedStore()
    assert store.latest("t/a") is None
    first = store.install("t/a", 1, False, vc(s0=1), 0, 11)
    second = store.install("t/a", 2, False, vc(s0=2), 0, 12)
    assert store.latest("t/a") is second and second.vid > first.vid
    store.install("t/a", None, True, vc(s0=3), 0, 13)
    latest = store.latest("t/a")
    assert latest is not None and latest.deleted
    assert store.scan("t/", "t0", 10) == []


def test_scans_are_ordered_bounded_and_per_table() -> None:
    store = VersionedStore()
    for key in ["t/c", "t/a", "u/a", "t/b", "t/d"]:
        store.install(key, key, False, vc(s0=1), 0, 1)
    assert [k for k, _ in store.scan("t/", "t0", 10)] == ["t/a", "t/b", "t/c", "t/d"]
    assert [k for k, _ in store.scan("t/b", "t/d", 10)] == ["t/b", "t/c"]
    assert [k for k, _ in store.scan("t/", "t0", 2)] == ["t/a", "t/b"]


def test_locks_are_all_or_nothing_and_owned() -> None:
    store = VersionedStore()
    assert store.try_lock_all(["t/a", "t/new"], owner=1)
    assert not store.try_lock_all(["t/b", "t/a"], owner=2)
    assert store.lock_owner("t/b") is None  # nothing taken by the failed attempt
    assert store.try_lock_all(["t/a"], owner=1)  # re-entrant for the owner
    assert store.range_locked_by_other("t/", "t0", owner=2, inclusive_hi=False)
    assert not store.range_locked_by_other("t/", "t0", owner=1, inclusive_hi=False)
    store.unlock_all(["t/a", "t/new"], owner=1)
    assert store.locked_count() == 0


def test_a_range_sees_exactly_the_locks_inside_its_bounds() -> None:
    # A scan's phantom check: a lock on the range's first key counts, on its end only when
    # the end is inclusive, outside it or in another table never; unlocked keys leave it.
    store = VersionedStore()
    assert store.try_lock_all(["t/b", "t/d", "u/c"], owner=1)
    assert store.range_locked_by_other("t/b", "t/c", owner=2, inclusive_hi=False)
    assert not store.range_locked_by_other("t/c", "t/d", owner=2, inclusive_hi=False)
    assert store.range_locked_by_other("t/c", "t/d", owner=2, inclusive_hi=True)
    assert not store.range_locked_by_other("t/ba", "t/cz", owner=2, inclusive_hi=True)
    assert not store.range_locked_by_other("t/b", "t/e", owner=1, inclusive_hi=True)
    store.unlock_all(["t/b", "t/d"], owner=1)
    assert not store.range_locked_by_other("t/", "t0", owner=2, inclusive_hi=True)
    assert store.range_locked_by_other("u/", "u0", owner=2, inclusive_hi=False)


def test_rolled_back_versions_are_invisible() -> None:
    store = VersionedStore()
    store.install("t/a", 1, False, vc(s0=1), 0, 1)
    store.install("t/a", 2, False, vc(s0=2), 0, 2)
    assert store.roll_back("t/a", 2)
    latest = store.latest("t/a")
    assert latest is not None and latest.value == 1
    assert store.chain("t/a")[-1].state == ROLLED_BACK


def test_gc_keeps_the_newest_durable_version_and_everything_above_it() -> None:
    store = VersionedStore()
    for counter in range(1, 6):
        store.install("t/a", counter, False, vc(s0=counter), 0, counter)
    dropped = store.collect_garbage({0: 3})
    assert dropped == 2
    assert [v.value for v in store.chain("t/a")] == [3, 4, 5]
    assert store.latest_at_or_below("t/a", {0: 3}).value == 3
    store.install("t/b", 1, False, vc(s0=6), 0, 6)
    store.install("t/b", None, True, vc(s0=7), 0, 7)
    store.collect_garbage({0: 7})
    assert store.chain("t/b") == []  # a durable tombstone with nothing above: gone
    assert [v.value for v in store.chain("t/a")] == [5]


def test_gc_drops_a_key_whose_every_version_was_rolled_back() -> None:
    """An insert undone by recovery leaves a chain of rolled-back versions only: GC drops
    the key (it was kept for ever before, dirty, a miss in every pass), unless a
    transaction holds its lock; a tombstone above them stays until it is durable."""
    store = VersionedStore()
    store.install("t/a", 1, False, vc(s0=5), 0, 5)
    store.install("t/b", 1, False, vc(s0=6), 0, 6)
    store.install("t/c", 1, False, vc(s0=7), 0, 7)
    store.install("t/c", None, True, vc(s0=9), 0, 9)
    for key, txn in (("t/a", 5), ("t/b", 6), ("t/c", 7)):
        assert store.roll_back(key, txn)
    assert store.try_lock_all(["t/b"], 42)
    assert store.collect_garbage({0: 8}) == 2  # t/a whole, t/c's rolled-back insert
    assert store.chain("t/a") == [] and [k for k, _ in store.scan("t/", "t0", 10)] == []
    assert len(store.chain("t/b")) == 1  # locked: kept, and visited again
    assert [v.deleted for v in store.chain("t/c")] == [True]
    assert store.garbage_candidates() == 2
    store.unlock_all(["t/b"], 42)
    assert store.collect_garbage({0: 9}) == 2  # t/b; t/c's tombstone, durable now
    assert store.garbage_candidates() == 0 and store.key_count() == 0


def test_gc_keeps_a_locked_durable_tombstone_dirty_and_drops_it_once_unlocked() -> None:
    """A delete durable over the version it replaced, while another transaction holds the
    key's lock: the old version goes, the tombstone stays (its holder may still install)
    and is visited again; once the lock is gone the key goes."""
    store = VersionedStore()
    store.install("t/a", 1, False, vc(s0=1), 0, 1)
    store.install("t/a", None, True, vc(s0=2), 0, 2)
    assert store.try_lock_all(["t/a"], 42)
    assert store.collect_garbage({0: 2}) == 1
    assert [v.deleted for v in store.chain("t/a")] == [True]
    assert store.garbage_candidates() == 1
    store.unlock_all(["t/a"], 42)
    assert store.collect_garbage({0: 2}) == 1
    assert store.key_count() == 0 and store.garbage_candidates() == 0


def test_a_gc_pass_is_bounded_and_resumes_where_it_stopped() -> None:
    store = VersionedStore()
    for i in range(10):
        store.install(f"t/{i}", 0, False, vc(s0=1), 0, 1)
    assert store.garbage_candidates() == 0  # a first version leaves nothing to collect
    for i in range(10):
        store.install(f"t/{i}", 1, False, vc(s0=2), 0, 2)
    assert store.collect_garbage({0: 2}, keys_max=4) == 4
    assert store.garbage_candidates() == 6
    assert store.collect_garbage({0: 2}, keys_max=100) == 6
    assert all(len(store.chain(f"t/{i}")) == 1 for i in range(10))


def test_a_gc_pass_ends_at_a_run_of_keys_not_durable_yet_without_being_held_up_by_them() -> None:
    """Keys are dirtied in certification order: behind GC_MISSES_MAX keys in a row with
    nothing durable, the rest most likely have nothing either, and are not visited (at
    50 ms between regions every key was visited three times before it could be collected).
    Keys that never become collectable go to the back, so later garbage is still reached."""
    from store.core.storage import GC_MISSES_MAX

    store = VersionedStore()
    stuck = [f"t/stuck{i}" for i in range(GC_MISSES_MAX + 5)]
    ready = [f"t/ready{i}" for i in range(10)]
    for key in stuck + ready:
        store.install(key, 0, False, vc(s0=1), 0, 1)
    for key in stuck:
        store.install(key, 1, False, vc(s0=100), 0, 100)  # above the watermark for good
    for key in ready:
        store.install(key, 1, False, vc(s0=2), 0, 2)
    assert store.collect_garbage({0: 2}) == 0  # ended at the run of stuck keys
    assert store.garbage_candidates() == len(stuck) + len(ready)
    passes = 1
    while any(len(store.chain(key)) > 1 for key in ready):
        store.collect_garbage({0: 2})
        passes += 1
        assert passes < 10, "garbage behind keys that never become durable was never reached"
    assert all(len(store.chain(key)) == 2 for key in stuck)
