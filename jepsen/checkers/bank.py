"""The bank invariant, after Jepsen's ``jepsen.tests.bank`` checker.

A bank test keeps a fixed set of accounts; clients transfer amounts between them and read
all balances in one transaction. Money is neither made nor lost, so in a serializable store
every committed (``:ok``) read must see balances that sum to the same total, and, unless the
workload lets balances go negative, none below zero.

Only ``:ok`` reads are judged: a failed or indeterminate read returned nothing we can trust.
Transfers are not judged directly; their effect shows in the reads.

Error kinds, one per bad read (a read may have several):

- ``wrong-total``: the balances do not sum to the expected total;
- ``negative-value``: some balance is below zero (skipped with ``negative_ok=True``);
- ``nil-balance``: some account has no balance (``nil``);
- ``unexpected-key``: an account outside the given ``accounts``;
- ``wrong-n``: the read does not cover exactly the given ``accounts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jepsen.history import Op

__all__ = ["check_bank"]


def _is_read(op: Op) -> bool:
    if not isinstance(op.value, dict):
        return False
    if op.f is None:
        # Without :f, tell a read from a transfer by its keys.
        return "from" not in op.value and "amount" not in op.value
    return op.f == "read"


def _balances(op: Op) -> dict[Any, Any] | None:
    value = op.value
    return value if isinstance(value, dict) else None


def check_bank(
    history: Sequence[Op],
    *,
    total: int | None = None,
    accounts: Iterable[Any] | None = None,
    negative_ok: bool = False,
) -> dict[str, Any]:
    """Check every ``:ok`` read of a bank history.

    `total` is the sum every read must have; when ``None`` it is taken from the first ``:ok``
    read. `accounts`, when given, is the exact set of accounts a read must cover.

    Returns a dict with:

    - ``valid`` (bool);
    - ``read_count``: the number of ``:ok`` reads checked;
    - ``total``: the total the reads were held to (``None`` if there were no reads);
    - ``error_count``: the number of bad reads;
    - ``error_types``: sorted list of the error kinds seen;
    - ``bad_reads``: one dict per bad read, in history order, with ``index``, ``process``,
      ``time``, ``value`` (the balances), ``total`` (their sum, nil balances counted as 0)
      and ``errors`` (list of kinds), plus ``negative`` (accounts below zero) when present;
    - ``first_error``: the first of ``bad_reads`` or ``None``.
    """
    expected_accounts = None if accounts is None else set(accounts)
    reads = [op for op in history if op.type == "ok" and _is_read(op)]
    expected_total: float | None = total
    bad_reads: list[dict[str, Any]] = []
    for op in reads:
        balances = _balances(op)
        assert balances is not None
        if expected_total is None:
            expected_total = sum(b for b in balances.values() if isinstance(b, int | float))
        errors: list[str] = []
        report: dict[str, Any] = {}
        if any(b is None for b in balances.values()):
            errors.append("nil-balance")
        observed_total = sum(b for b in balances.values() if b is not None)
        if observed_total != expected_total:
            errors.append("wrong-total")
        negative = sorted(
            (account for account, b in balances.items() if b is not None and b < 0), key=repr
        )
        if negative and not negative_ok:
            errors.append("negative-value")
            report["negative"] = negative
        if expected_accounts is not None:
            if any(account not in expected_accounts for account in balances):
                errors.append("unexpected-key")
            if set(balances) != expected_accounts:
                errors.append("wrong-n")
        if errors:
            bad_reads.append(
                {
                    "index": op.index,
                    "process": op.process,
                    "time": op.time,
                    "value": balances,
                    "total": observed_total,
                    "errors": errors,
                    **report,
                }
            )
    return {
        "valid": not bad_reads,
        "read_count": len(reads),
        "total": expected_total,
        "error_count": len(bad_reads),
        "error_types": sorted({kind for read in bad_reads for kind in read["errors"]}),
        "bad_reads": bad_reads,
        "first_error": bad_reads[0] if bad_reads else None,
    }
