"""Checkers that judge Jepsen-format histories: Elle-style list-append and the bank invariant."""

from jepsen.checkers.bank import check_bank
from jepsen.checkers.list_append import InvalidHistory, check_list_append

__all__ = ["InvalidHistory", "check_bank", "check_list_append"]
