"""TPC-C's random inputs (clauses 2.1.6, 4.3.2 and 5.2.4.2), drawn from a seeded ``random.Random``.

* ``NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x``, with one
  constant C per A. The loader and the run use different C for C_LAST, and the difference
  must obey clause 2.1.6.1 (``run_constants``).
* Last names are three syllables chosen by the digits of a number 0..999 (clause 4.3.2.3).
* The mix and New-Order's 1% rollback are dealt from shuffled decks (clause 5.2.4.2 permits
  a deck for the mix), so each 100 draws hold exactly 45/43/4/4/4 transactions and exactly
  one rollback.

Time and chance are arguments (STYLE.md): every function takes the ``random.Random`` it
draws from, so a run's inputs replay from its seed.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")

# The A of each NURand use (clause 2.1.6).
A_C_LAST = 255
A_C_ID = 1023
A_OL_I_ID = 8191

# Clause 2.1.6.1: |C_run - C_load| for C_LAST lies in [65, 119] and is neither 96 nor 112.
C_LAST_DELTA_MIN = 65
C_LAST_DELTA_MAX = 119
C_LAST_DELTA_FORBIDDEN = frozenset({96, 112})

# The transaction mix of clause 5.2.3, as a deck of 100 cards.
MIX = (("new_order", 45), ("payment", 43), ("order_status", 4), ("delivery", 4), ("stock_level", 4))
ROLLBACK_DECK_SIZE = 100  # one New-Order in each 100 rolls back (clause 2.4.1.4)

ALPHANUMERIC = string.ascii_letters + string.digits
LETTERS = string.ascii_letters


@dataclass(frozen=True, slots=True)
class NURandConstants:
    c_last: int
    c_id: int
    ol_i_id: int

    def __post_init__(self) -> None:
        assert 0 <= self.c_last <= A_C_LAST
        assert 0 <= self.c_id <= A_C_ID
        assert 0 <= self.ol_i_id <= A_OL_I_ID


def load_constants(rng: random.Random) -> NURandConstants:
    return NURandConstants(
        rng.randint(0, A_C_LAST), rng.randint(0, A_C_ID), rng.randint(0, A_OL_I_ID)
    )


def valid_c_last_delta(load: int, run: int) -> bool:
    delta = abs(run - load)
    return C_LAST_DELTA_MIN <= delta <= C_LAST_DELTA_MAX and delta not in C_LAST_DELTA_FORBIDDEN


def run_constants(load: NURandConstants, rng: random.Random) -> NURandConstants:
    """Constants for the measurement run: C_LAST differs from the load's as clause 2.1.6.1 says."""
    candidates = [c for c in range(A_C_LAST + 1) if valid_c_last_delta(load.c_last, c)]
    assert candidates, "every C_LAST in 0..255 has a valid run constant"
    return NURandConstants(
        rng.choice(candidates), rng.randint(0, A_C_ID), rng.randint(0, A_OL_I_ID)
    )


def nurand(rng: random.Random, a: int, x: int, y: int, c: int) -> int:
    assert x <= y
    return (((rng.randint(0, a) | rng.randint(x, y)) + c) % (y - x + 1)) + x


def last_name(number: int) -> str:
    """C_LAST for a number 0..999: one syllable per decimal digit (clause 4.3.2.3)."""
    assert 0 <= number <= 999
    return SYLLABLES[number // 100] + SYLLABLES[(number // 10) % 10] + SYLLABLES[number % 10]


def last_name_bound(customers_per_district: int) -> int:
    """The largest name number in use: 999, or fewer when a shrunk district has fewer customers.

    The loader names customer c (c <= 1000) after number c - 1, so with fewer than 1000
    customers only the numbers below their count are certain to exist (as py-tpcc does).
    """
    return min(999, customers_per_district - 1)


def random_last_name(
    rng: random.Random, constants: NURandConstants, customers_per_district: int
) -> str:
    bound = last_name_bound(customers_per_district)
    return last_name(nurand(rng, A_C_LAST, 0, bound, constants.c_last))


def customer_id(rng: random.Random, constants: NURandConstants, customers_per_district: int) -> int:
    return nurand(rng, A_C_ID, 1, customers_per_district, constants.c_id)


def item_id(rng: random.Random, constants: NURandConstants, items: int) -> int:
    return nurand(rng, A_OL_I_ID, 1, items, constants.ol_i_id)


def a_string(rng: random.Random, length_min: int, length_max: int) -> str:
    """Random alphanumeric string (clause 4.3.2.2); never contains '/', so it fits in keys."""
    return "".join(rng.choices(ALPHANUMERIC, k=rng.randint(length_min, length_max)))


def letters(rng: random.Random, length_min: int, length_max: int) -> str:
    return "".join(rng.choices(LETTERS, k=rng.randint(length_min, length_max)))


def n_string(rng: random.Random, length_min: int, length_max: int) -> str:
    return "".join(rng.choices(string.digits, k=rng.randint(length_min, length_max)))


def zip_code(rng: random.Random) -> str:
    return n_string(rng, 4, 4) + "11111"


def data_field(rng: random.Random, length_min: int, length_max: int) -> str:
    """I_DATA / S_DATA: 10% hold "ORIGINAL" at a random position (clause 4.3.3.1)."""
    data = a_string(rng, length_min, length_max)
    if rng.random() < 0.10:
        at = rng.randint(0, len(data) - 8)
        data = data[:at] + "ORIGINAL" + data[at + 8 :]
    return data


Card = TypeVar("Card")


class Deck(Generic[Card]):
    """Cards dealt in shuffled rounds: each full round deals every card exactly once."""

    def __init__(self, cards: Sequence[Card], rng: random.Random) -> None:
        assert cards, "a deck needs cards"
        self.cards = list(cards)
        self.rng = rng
        self._remaining: list[Card] = []
        self.dealt = 0

    def draw(self) -> Card:
        if not self._remaining:
            self._remaining = list(self.cards)
            self.rng.shuffle(self._remaining)
        self.dealt += 1
        return self._remaining.pop()


def mix_deck(rng: random.Random) -> Deck[str]:
    return Deck([name for name, count in MIX for _ in range(count)], rng)


def rollback_deck(rng: random.Random) -> Deck[bool]:
    return Deck([True] + [False] * (ROLLBACK_DECK_SIZE - 1), rng)
