"""Checkers that judge Jepsen-format histories: Elle-style list-append and the bank invariant."""
