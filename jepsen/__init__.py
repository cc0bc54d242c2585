"""Jepsen-style testing for Meridian: histories in Jepsen's EDN format and their checkers.

- `jepsen.edn`: EDN reader and writer;
- `jepsen.history`: `Op`, `read_history`, `write_history`, `format_op`;
- `jepsen.checkers.list_append`: an Elle-style transactional anomaly checker;
- `jepsen.checkers.bank`: the bank invariant;
- `python -m jepsen.check`: the command-line front end.
"""
