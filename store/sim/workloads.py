"""Workloads for simulated (and later real) clients: list-append and bank.

A workload hands each client its next operation: the transaction to submit (a procedure
name and arguments), the Jepsen ``:f`` and ``:value`` to record at invocation, and how to turn
the transaction's result into the ``:value`` of the completion. Key choice follows Elle's
advice for list-append: a small pool of active keys, each retired after a bounded number of
appends, so version orders stay short and every read is informative.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from store.core.oplist import OPS_PROCEDURE
from store.core.txn import Procedures, Tx


@dataclass
class Operation:
    procedure: str
    args: list[Any]
    f: str
    value: Any
    complete: Callable[[Any], Any]
    keys: list[str]
    # Told how the operation ended ("ok", "fail" or "info"), after ``complete`` for "ok".
    settled: Callable[[str], None] | None = None


def list_append_key(k: int) -> str:
    # Zero-padded, so that key order is number order and a range of keys is a range of k.
    return f"la/{k:06d}"


def cleared_key(k: int) -> str:
    """The history's name for "key k was cleared": a key of the history only, never stored."""
    return f"cleared/{k}"


class ListAppend:
    """Transactions of 1..max_ops micro-operations: append a unique value, read a list, or
    (with ``scan_fraction``) scan a range of keys, from its end with ``reverse_fraction``.

    A scan's result enters the history as a read of every key of its range that the
    workload has ever handed out — absent keys read as empty lists — up to the last key
    returned when the scan was cut short by its limit, so the list-append checker sees
    phantoms: a key inserted into a scanned range is a read the scan must agree with.

    With ``clear_fraction``, that share of operations clears a range of 1..3 retired keys
    (``clear_range``) once the workload knows every append to them has ended, none with an
    unknown outcome: from then on each such key holds its final list F or, once cleared,
    nothing, for ever. A list-append history cannot say "emptied", so the clear is recorded
    as a read of each key (its own scan, F) and an append of a unique marker X to a key of
    the history only, ``cleared/k``. A later read of k that shows a list says ``cleared/k``
    was still empty; one that shows nothing says ``cleared/k`` holds [X] when it began after
    k's first append was acknowledged (k was not empty then, so only the clear can have
    emptied it), and is left out of the history otherwise (it may have run before that
    append). So a read that misses a finished clear is an rw edge against real time, and a
    read that sees one before it began, or sees a failed one, is caught too.
    """

    name = "list-append"

    def __init__(
        self,
        rng: random.Random,
        active_keys: int = 6,
        max_ops: int = 4,
        appends_per_key_max: int = 24,
        read_fraction: float = 0.5,
        scan_fraction: float = 0.0,
        scan_span_max: int = 5,
        reverse_fraction: float = 0.0,
        clear_fraction: float = 0.0,
    ) -> None:
        self.rng = rng
        self.max_ops = max_ops
        self.appends_per_key_max = appends_per_key_max
        self.read_fraction = read_fraction
        self.scan_fraction = scan_fraction
        self.scan_span_max = scan_span_max
        self.reverse_fraction = reverse_fraction
        self.clear_fraction = clear_fraction
        self.active = list(range(active_keys))
        self.next_key = active_keys
        self.appends: dict[int, int] = {}
        self.next_value = 1
        # What a clear needs to know of each key (see the class docstring).
        self.clock = 0  # counts invocations and endings: orders them as the history does
        self.pending: dict[int, int] = {}  # appends invoked and not ended, by key
        self.unknown: set[int] = set()  # keys an append with an unknown outcome went to
        self.first_ok: dict[int, int] = {}  # clock when k's first append was acknowledged
        self.retired: list[int] = []  # keys no longer handed out for appends, not cleared
        self.markers: dict[int, int] = {}  # key cleared (or being cleared) -> its marker
        self.ranges_cleared = 0  # clears that committed

    def next(self) -> Operation:
        rng = self.rng
        self.clock += 1
        if self.clear_fraction and rng.random() < self.clear_fraction:
            clear = self._clear()
            if clear is not None:
                return clear
        micro: list[list[Any]] = []
        ops: list[list[Any]] = []
        keys: list[str] = []
        for _ in range(rng.randint(1, self.max_ops)):
            slot = rng.randrange(len(self.active))
            k = self.active[slot]
            roll = rng.random()
            if roll < self.scan_fraction:
                lo = max(0, k - rng.randrange(self.scan_span_max))
                hi = lo + rng.randint(2, self.scan_span_max)
                limit = rng.randint(1, hi - lo)  # often short of the range: cut by its limit
                if self.reverse_fraction and rng.random() < self.reverse_fraction:
                    limit = -limit  # from the range's end, highest key first
                micro.append(["scan", lo, hi, limit])
                ops.append(["scan", list_append_key(lo), list_append_key(hi), limit])
                keys.append(list_append_key(lo))
            elif roll < self.scan_fraction + (1 - self.scan_fraction) * self.read_fraction:
                micro.append(["r", k, None])
                ops.append(["get", list_append_key(k)])
                keys.append(list_append_key(k))
            else:
                value = self.next_value
                self.next_value += 1
                micro.append(["append", k, value])
                ops.append(["append", list_append_key(k), value])
                keys.append(list_append_key(k))
                self.appends[k] = self.appends.get(k, 0) + 1
                self.pending[k] = self.pending.get(k, 0) + 1
                if self.appends[k] >= self.appends_per_key_max:
                    self.active[slot] = self.next_key
                    self.next_key += 1
                    self.retired.append(k)
        began = self.clock

        def complete(results: Any) -> Any:
            done = []
            for mop, result in zip(micro, results, strict=True):
                if mop[0] == "scan":
                    for read in self._scan_reads(mop, result):
                        done.extend(self.reads_of(read[1], read[2], began))
                elif mop[0] == "r":
                    done.extend(self.reads_of(mop[1], list(result) if result is not None else [], began))
                else:
                    done.append(mop)
            return done

        appended = [mop[1] for mop in micro if mop[0] == "append"]

        def settled(outcome: str) -> None:
            self.clock += 1
            for k in appended:
                self.pending[k] -= 1
                if outcome == "ok":
                    self.first_ok.setdefault(k, self.clock)
                elif outcome == "info":
                    self.unknown.add(k)

        return Operation(
            OPS_PROCEDURE, [ops], "txn", self._invoked(micro), complete, keys, settled
        )

    def begin(self) -> int:
        """A moment in the workload's order, for a read made outside ``next`` (a final
        read): pass it to ``reads_of``."""
        self.clock += 1
        return self.clock

    def reads_of(self, k: int, found: list[Any], began: int) -> list[list[Any]]:
        """The history's reads for a read of key k that began at ``began`` and found
        ``found`` (see the class docstring on cleared keys)."""
        marker = self.markers.get(k)
        if marker is None:
            return [["r", k, found]]
        if found:
            return [["r", k, found], ["r", cleared_key(k), []]]
        if began > self.first_ok[k]:
            return [["r", cleared_key(k), [marker]]]
        return []  # it may have run before k held anything: no evidence either way

    def _clearable(self, k: int) -> bool:
        return not self.pending.get(k) and k not in self.unknown

    def _clear(self) -> Operation | None:
        """A transaction that scans a range of retired, settled keys and clears it; None when
        no key may be cleared now."""
        ready = [k for k in self.retired if self._clearable(k)]
        if not ready:
            return None
        lo = self.rng.choice(ready)
        hi = lo + 1
        while hi - lo < 3 and hi in self.retired and self._clearable(hi):
            hi += 1
        marked: list[int] = []
        for k in range(lo, hi):
            self.retired.remove(k)
            if k in self.first_ok:  # else it holds nothing: clearing it changes nothing
                self.markers[k] = self.next_value
                self.next_value += 1
                marked.append(k)
        ops = [
            ["scan", list_append_key(lo), list_append_key(hi), hi - lo],
            ["clear_range", list_append_key(lo), list_append_key(hi)],
        ]
        marks = [["append", cleared_key(k), self.markers[k]] for k in marked]

        def complete(results: Any) -> Any:
            seen = {int(key.split("/", 1)[1]): list(value) for key, value in results[0]}
            return [["r", k, seen.get(k, [])] for k in range(lo, hi)] + marks

        def settled(outcome: str) -> None:
            self.clock += 1
            self.ranges_cleared += outcome == "ok"

        invoked = [["r", k, None] for k in range(lo, hi)] + marks
        return Operation(
            OPS_PROCEDURE, [ops], "txn", invoked, complete, [list_append_key(lo)], settled
        )

    def _invoked(self, micro: list[list[Any]]) -> list[list[Any]]:
        """The invocation's value: a scan is a read of every key of its range handed out."""
        value: list[list[Any]] = []
        for mop in micro:
            if mop[0] == "scan":
                value.extend(["r", k, None] for k in range(mop[1], min(mop[2], self.next_key)))
            else:
                value.append(mop)
        return value

    def _scan_reads(self, mop: list[Any], found: list[Any]) -> list[list[Any]]:
        _, lo, hi, limit = mop
        seen = {int(key.split("/", 1)[1]): list(value) for key, value in found}
        if len(found) >= abs(limit):  # cut short: nothing is known past the last key returned
            last = int(found[-1][0].split("/", 1)[1])
            if limit < 0:
                lo = last  # a reverse scan ends at its lowest key
            else:
                hi = last + 1
        return [["r", k, seen.get(k, [])] for k in range(lo, min(hi, self.next_key))]

    def snapshot_keys(self) -> list[str]:
        """Keys worth a follower snapshot read: the active ones, and the last keys cleared
        (a follower must show their tombstones once its watermark covers them)."""
        keys = [list_append_key(k) for k in self.active]
        if self.markers:
            keys += [list_append_key(k) for k in list(self.markers)[-3:]]
        return keys


def bank_key(account: int) -> str:
    return f"bank/{account}"


async def bank_transfer(tx: Tx, source: int, target: int, amount: int) -> int:
    balances = await tx.get_many([bank_key(source), bank_key(target)])
    if balances[0] < amount:
        tx.abort("insufficient funds")
    tx.put(bank_key(source), balances[0] - amount)
    tx.put(bank_key(target), balances[1] + amount)
    return int(balances[0] - amount)


async def bank_read(tx: Tx, accounts: int) -> dict[str, int]:
    balances = await tx.get_many([bank_key(a) for a in range(accounts)])
    return {str(a): b for a, b in enumerate(balances)}


def register_bank(procedures: Procedures) -> None:
    procedures.register("bank_transfer", bank_transfer)
    procedures.register("bank_read", bank_read)


class Bank:
    """Transfers between accounts and reads of all balances; the total never changes."""

    name = "bank"

    def __init__(
        self, rng: random.Random, accounts: int = 8, total: int = 100, read_fraction: float = 0.4
    ) -> None:
        self.rng = rng
        self.accounts = accounts
        self.total = total
        self.read_fraction = read_fraction

    def snapshot_keys(self) -> list[str]:
        return [bank_key(a) for a in range(self.accounts)]

    def initial_data(self) -> dict[str, int]:
        base, extra = divmod(self.total, self.accounts)
        return {bank_key(a): base + (1 if a < extra else 0) for a in range(self.accounts)}

    def next(self) -> Operation:
        rng = self.rng
        if rng.random() < self.read_fraction:
            keys = [bank_key(a) for a in range(self.accounts)]
            return Operation(
                "bank_read",
                [self.accounts],
                "read",
                None,
                lambda result: {int(a): b for a, b in result.items()},
                keys,
            )
        source, target = rng.sample(range(self.accounts), 2)
        amount = rng.randint(1, 5)
        value = {"from": source, "to": target, "amount": amount}

        def complete(_result: Any) -> Any:
            return value

        return Operation(
            "bank_transfer",
            [source, target, amount],
            "transfer",
            value,
            complete,
            [bank_key(source), bank_key(target)],
        )


WORKLOADS = {"list-append": ListAppend, "bank": Bank}
