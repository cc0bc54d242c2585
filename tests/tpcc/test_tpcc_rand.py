"""TPC-C's random inputs: NURand (clause 2.1.6), last names (4.3.2.3), decks (5.2.4.2)."""

from __future__ import annotations

import random
from collections import Counter

from bench.tpcc import rand


def nurand_distribution(a: int, x: int, y: int, c: int) -> dict[int, float]:
    """The exact distribution of NURand(a, x, y) with constant c, by enumeration."""
    counts: Counter[int] = Counter()
    for random_a in range(a + 1):
        for random_xy in range(x, y + 1):
            counts[((random_a | random_xy) + c) % (y - x + 1) + x] += 1
    total = (a + 1) * (y - x + 1)
    return {value: count / total for value, count in counts.items()}


def total_variation(p: dict[int, float], q: dict[int, float]) -> float:
    return sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q)) / 2


def test_nurand_draws_follow_the_specified_distribution() -> None:
    """Clause 2.1.6: C_LAST numbers, NURand(255, 0, 999), against the exact distribution."""
    rng = random.Random(1)
    samples = 100_000
    draws = Counter(rand.nurand(rng, rand.A_C_LAST, 0, 999, 123) for _ in range(samples))
    assert min(draws) >= 0 and max(draws) <= 999
    empirical = {value: count / samples for value, count in draws.items()}
    exact = nurand_distribution(rand.A_C_LAST, 0, 999, 123)
    uniform = {value: 1 / 1000 for value in range(1000)}
    # Sampling noise over 1000 values at 100,000 draws is about 0.04 of total variation.
    assert total_variation(empirical, exact) < 0.06
    assert total_variation(exact, uniform) > 0.2  # and NURand is far from uniform


def test_nurand_customer_and_item_ids_stay_in_range() -> None:
    rng = random.Random(7)
    constants = rand.load_constants(rng)
    customers = {rand.customer_id(rng, constants, 3000) for _ in range(20_000)}
    items = {rand.item_id(rng, constants, 100_000) for _ in range(20_000)}
    assert min(customers) >= 1 and max(customers) <= 3000
    assert min(items) >= 1 and max(items) <= 100_000


def test_nurand_of_a_shrunk_range_covers_it() -> None:
    rng = random.Random(2)
    draws = {rand.nurand(rng, rand.A_C_LAST, 0, 29, 17) for _ in range(2000)}
    assert draws == set(range(30))


def test_last_names_follow_the_syllables() -> None:
    assert rand.last_name(0) == "BARBARBAR"
    assert rand.last_name(371) == "PRICALLYOUGHT"
    assert rand.last_name(999) == "EINGEINGEING"
    assert len({rand.last_name(n) for n in range(1000)}) == 1000


def test_run_constant_of_c_last_keeps_the_required_distance() -> None:
    """Clause 2.1.6.1: delta in [65, 119], not 96 nor 112."""
    rng = random.Random(3)
    for _ in range(300):
        load = rand.load_constants(rng)
        run = rand.run_constants(load, rng)
        delta = abs(run.c_last - load.c_last)
        assert 65 <= delta <= 119 and delta not in (96, 112)
    assert not rand.valid_c_last_delta(0, 96) and rand.valid_c_last_delta(0, 97)


def test_mix_deck_deals_exactly_45_43_4_4_4_per_100() -> None:
    deck = rand.mix_deck(random.Random(4))
    for _ in range(5):
        counts = Counter(deck.draw() for _ in range(100))
        assert counts == {"new_order": 45, "payment": 43, "order_status": 4, "delivery": 4,
                          "stock_level": 4}


def test_rollback_deck_rolls_back_exactly_one_in_100() -> None:
    deck = rand.rollback_deck(random.Random(5))
    rounds = [[deck.draw() for _ in range(100)] for _ in range(50)]
    assert all(sum(round_) == 1 for round_ in rounds)
    # The rollback's place within a round is shuffled, not fixed.
    assert len({round_.index(True) for round_ in rounds}) > 10


def test_random_strings_fit_in_keys_and_data_holds_original_about_10_percent() -> None:
    rng = random.Random(6)
    assert all("/" not in rand.a_string(rng, 8, 16) for _ in range(500))
    data = [rand.data_field(rng, 26, 50) for _ in range(5000)]
    share = sum("ORIGINAL" in d for d in data) / len(data)
    assert 0.08 < share < 0.12
    assert all(26 <= len(d) <= 50 for d in data)
