"""evaluation/stats.py on cases small enough to check by hand."""

from __future__ import annotations

import math

import pytest

from evaluation.stats import (
    bootstrap_ci,
    detectable_difference,
    paired,
    pass_at_k,
    sign_flip_p_value,
)


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the success rate
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)/C(4,2) = 1/6 of the pairs miss
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_the_exact_sign_flip_test_on_three_units():
    # differences 1, 2, 3: |sum| = 6 is reached by all-plus and all-minus, 2 of the 8 sign patterns
    assert sign_flip_p_value([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # 1, -1: every pattern has |sum| >= 0
    assert sign_flip_p_value([1.0, -1.0]) == 1.0


def test_the_monte_carlo_sign_flip_test_agrees_with_the_exact_one():
    differences = [float(i % 5 - 1) for i in range(17)]  # 17 units: past the exact enumeration
    observed = abs(sum(differences))
    exact = sum(
        abs(sum(d if (pattern >> i) & 1 else -d for i, d in enumerate(differences))) >= observed
        for pattern in range(1 << len(differences))
    ) / (1 << len(differences))
    assert sign_flip_p_value(differences, permutations=20_000, rng_seed=1) == pytest.approx(exact, abs=0.015)
    assert sign_flip_p_value([5.0] * 20, rng_seed=2) < 0.001  # every unit better: far in the tail


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [0.0, 10.0, 20.0, 30.0, 40.0]
    low, high = bootstrap_ci(values, rng_seed=3)
    assert (low, high) == bootstrap_ci(values, rng_seed=3)
    assert low < 20.0 < high and 0.0 <= low and high <= 40.0
    assert bootstrap_ci([7.0, 7.0, 7.0]) == (7.0, 7.0)


def test_paired_uses_the_common_units_only():
    a = {("boil", 0, 0): 10.0, ("boil", 0, 1): 20.0, ("boil", 1, 0): 30.0, ("boil", 9, 9): 99.0}
    b = {("boil", 0, 0): 0.0, ("boil", 0, 1): 10.0, ("boil", 1, 0): 20.0}
    result = paired("empo2", a, "base", b)
    assert result.difference.n == 3 and result.difference.mean == pytest.approx(10.0)
    assert result.difference.ci_low == result.difference.ci_high == pytest.approx(10.0)
    assert result.p_value == pytest.approx(2 / 8)  # three positive differences: the smallest exact p
    assert result.detectable == pytest.approx(0.0)  # no spread in the differences


def test_detectable_difference_shrinks_with_the_square_root_of_the_units():
    assert detectable_difference(10.0, 100) == pytest.approx(detectable_difference(10.0, 25) / 2)
    assert detectable_difference(10.0, 0) == math.inf
