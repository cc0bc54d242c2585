"""Check a Jepsen ``history.edn`` from the command line.

    python -m jepsen.check --model list-append FILE.edn [--json]
    python -m jepsen.check --model bank FILE.edn [--total N] [--negative-ok] [--json]

Prints the verdict (or, with ``--json``, the checker's whole result as one JSON object).
Exit status: 0 valid, 1 invalid, 2 the history could not be read or checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from jepsen.checkers.bank import check_bank
from jepsen.checkers.list_append import InvalidHistory, check_list_append
from jepsen.edn import EdnError
from jepsen.history import read_history

__all__ = ["main"]

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jepsen.check", description="Check a Jepsen history.edn."
    )
    parser.add_argument("--model", required=True, choices=["list-append", "bank"])
    parser.add_argument("file", help="history in Jepsen's EDN format")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--consistency-model",
        action="append",
        dest="consistency_models",
        metavar="MODEL",
        help="list-append: model the history must satisfy (repeatable; "
        "default strict-serializable)",
    )
    parser.add_argument(
        "--no-realtime", action="store_true", help="list-append: leave out real-time edges"
    )
    parser.add_argument(
        "--process", action="store_true", help="list-append: add per-process order edges"
    )
    parser.add_argument("--total", type=int, help="bank: the total every read must sum to")
    parser.add_argument(
        "--negative-ok", action="store_true", help="bank: negative balances are allowed"
    )
    return parser


def _summary(model: str, result: dict[str, Any]) -> str:
    lines = [f"{model}: {'valid' if result['valid'] else 'INVALID'}"]
    if model == "bank":
        lines.append(
            f"  {result['read_count']} reads, total {result['total']}, {result['error_count']} bad"
        )
        for read in result["bad_reads"][:8]:
            lines.append(
                f"  index {read['index']}: {', '.join(read['errors'])} (sum {read['total']})"
            )
        return "\n".join(lines)
    lines.append(
        f"  {result['txn_count']} transactions ({result['ok_count']} ok, "
        f"{result['info_count']} info, {result['fail_count']} fail), "
        f"{result['edge_count']} dependency edges"
    )
    if result["not"]:
        lines.append(f"  not: {', '.join(result['not'])}")
    for kind in result["anomaly_types"]:
        lines.append(f"  {kind}: {result['anomaly_counts'][kind]}")
        example = result["anomalies"][kind][0]
        if "steps" in example:
            lines.extend(f"    {step['explanation']}" for step in example["steps"])
        elif "explanation" in example:
            lines.append(f"    {example['explanation']}")
        else:
            lines.append(f"    {json.dumps(example, default=str)[:300]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        history = read_history(arguments.file)
        if arguments.model == "bank":
            result = check_bank(history, total=arguments.total, negative_ok=arguments.negative_ok)
        else:
            result = check_list_append(
                history,
                consistency_models=arguments.consistency_models or ["strict-serializable"],
                realtime=False if arguments.no_realtime else None,
                process=arguments.process,
            )
    except (OSError, EdnError, InvalidHistory) as error:
        print(f"cannot check {arguments.file}: {error}", file=sys.stderr)
        return EXIT_ERROR
    text = json.dumps(result, default=str) if arguments.json else _summary(arguments.model, result)
    try:
        print(text)
    except BrokenPipeError:  # e.g. piped into head; the exit status still carries the verdict
        sys.stderr.close()
    return EXIT_VALID if result["valid"] else EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
