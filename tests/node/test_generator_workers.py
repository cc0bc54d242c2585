"""The in-server generator's home rule with workers (store/node/generator.py): a transaction
runs on its own worker's keys, and a remote access goes to another shard, any of its
workers, never to a fellow worker of the same shard (Mako's benchmark: each worker thread
on its own partition)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from store.node.generator import GenerateSpec, Generator
from store.protocol.messages import Outcome, Submit


class _Host:
    def __init__(self) -> None:
        self.submitted: list[Submit] = []

    def submit_local(self, submissions: Sequence[tuple[Submit, Callable[[Outcome], None]]]) -> None:
        self.submitted.extend(submit for submit, _ in submissions)


def _units_touched(shards: int, workers: int, home: int) -> list[set[int]]:
    units = shards * workers
    keys = [[f"u{unit}/k{i}" for i in range(50)] for unit in range(units)]
    unit_of = {key: unit for unit, unit_keys in enumerate(keys) for key in unit_keys}
    host = _Host()
    calls: list[Callable[[], None]] = []
    generator = Generator(
        host, home, keys, GenerateSpec(10.0, 400, 50, 0.5, 3), workers=workers,
        now_s=lambda: 0.0, soon=calls.append, done=lambda result: None,
    )
    generator.start()
    for call in calls:
        call()
    touched: list[set[int]] = []
    for submit in host.submitted:
        ops: Any = submit.args[0]
        touched.append({unit_of[op[1]] for op in ops})
    return touched


def test_with_one_shard_every_access_is_on_the_home_worker() -> None:
    assert all(units == {1} for units in _units_touched(1, 2, home=1))


def test_remote_accesses_go_to_the_other_shards_workers_only() -> None:
    touched = _units_touched(2, 2, home=1)  # shard 0, worker 1
    seen = set().union(*touched)
    assert seen == {1, 2, 3}  # home, and both workers of shard 1; never unit 0
    assert any(len(units) > 1 for units in touched)
