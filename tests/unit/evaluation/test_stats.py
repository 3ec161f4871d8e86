"""evaluation/stats.py on cases small enough to check by hand."""

from __future__ import annotations

import math

import pytest

from evaluation.stats import (
    bootstrap_ci,
    cluster_bootstrap_ci,
    clustered_detectable,
    clustered_estimate,
    detectable_difference,
    detectable_effect,
    holm,
    one_sample_t_test,
    paired,
    pass_at_k,
    permutation_floor,
    permutation_p_value,
    seed_level_independent,
    seed_level_vs_fixed,
    sign_flip_floor,
    sign_flip_p_value,
    t_cdf,
    t_quantile,
    welch_t_test,
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


def test_holm_on_three_p_values_by_hand():
    # sorted 0.01 (a), 0.03 (c), 0.04 (b); times 3, 2, 1: 0.03, 0.06, 0.04; monotone: b is lifted to 0.06
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert list(adjusted) == ["a", "b", "c"]  # the caller's order
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"x": 0.5, "y": 0.6}) == {"x": 1.0, "y": 1.0}  # 2 x 0.5 capped at 1, and y never below it
    assert holm({"only": 0.02}) == {"only": 0.02} and holm({}) == {}


def test_the_t_distribution_matches_its_closed_forms():
    for t in (0.3, 1.0, 2.5, -4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)  # 12.706
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, rel=1e-6)  # 0.975 = 0.5 + t / (2 sqrt(2 + t^2))
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, rel=1e-5)  # the normal's


def test_welch_t_by_hand():
    # a = 0, 2 and b = 4, 6: means 1 and 5, variances 2 and 2, se = sqrt(2/2 + 2/2) = sqrt 2, t = -4 / sqrt 2;
    # df = (1 + 1)^2 / (1/1 + 1/1) = 2; with 2 df, p = 1 - |t| / sqrt(2 + t^2) = 1 - sqrt(8) / sqrt(10)
    result = welch_t_test([0.0, 2.0], [4.0, 6.0])
    assert result.t == pytest.approx(-math.sqrt(8)) and result.df == pytest.approx(2.0)
    assert result.p == pytest.approx(1 - math.sqrt(8 / 10))
    # a = 1, 2, 3 and b = 4..7: va = 1/3, vb = (5/3)/4 = 5/12; se^2 = 3/4; t = -3.5 / sqrt(3/4);
    # df = (3/4)^2 / ((1/3)^2 / 2 + (5/12)^2 / 3) = 4.9592
    result = welch_t_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
    assert result.t == pytest.approx(-3.5 / math.sqrt(0.75))
    assert result.df == pytest.approx(0.5625 / (1 / 18 + 25 / 432))
    assert 0.005 < result.p < 0.02
    assert welch_t_test([1.0], [2.0, 3.0]).p is None and welch_t_test([1.0, 1.0], [2.0, 2.0]).p is None
    # one sample: 1, 2, 3 against 0: t = 2 / (1 / sqrt 3), 2 df
    one = one_sample_t_test([1.0, 2.0, 3.0])
    assert one.t == pytest.approx(2 * math.sqrt(3)) and one.df == 2
    assert one.p == pytest.approx(1 - one.t / math.sqrt(2 + one.t**2))


def test_the_exact_permutation_floors():
    # 3 vs 3 fully separated: 2 of the C(6, 3) = 20 splits are as extreme (it and its swap)
    assert permutation_p_value([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(0.1) == permutation_floor(3, 3)
    assert permutation_p_value([3.0, 4.0], [0.0, 1.0]) == pytest.approx(1 / 3) == permutation_floor(2, 2)
    assert permutation_floor(3, 2) == pytest.approx(1 / 10)  # unequal groups: the swap is not as extreme
    assert permutation_p_value([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert sign_flip_p_value([1.0, 2.0]) == sign_flip_floor(2) == 0.5
    assert sign_flip_p_value([1.0, 2.0, 3.0]) == sign_flip_floor(3) == 0.25
    assert sign_flip_floor(6) == pytest.approx(1 / 32)  # the first n whose floor is below 0.05


def _clustered(cluster_values: dict[int, list[float]]) -> dict:
    """(task, variation, seed) units: variation v's seeds score cluster_values[v]."""
    return {("t", v, s): x for v, xs in cluster_values.items() for s, x in enumerate(xs)}


def test_a_clustered_bootstrap_of_identical_clusters_collapses():
    values = _clustered({v: [0.0, 10.0, 20.0] for v in range(4)})  # every variation the same three scores
    assert cluster_bootstrap_ci(values) == pytest.approx((10.0, 10.0))  # every resample: the same multiset
    low, high = bootstrap_ci(list(values.values()))
    assert low < 10.0 < high  # the unit-level bootstrap does not know the units are alike by cluster
    assert cluster_bootstrap_ci(values, rng_seed=5) == cluster_bootstrap_ci(values, rng_seed=5)


def test_a_clustered_ci_is_wider_than_the_unit_level_one_on_clustered_data():
    # the score is the variation's: 0, 25, 50, 75 for all five seeds of it
    values = _clustered({v: [25.0 * v] * 5 for v in range(4)})
    unit_low, unit_high = bootstrap_ci(list(values.values()), rng_seed=1)
    low, high = cluster_bootstrap_ci(values, rng_seed=1)
    assert low < unit_low and high > unit_high and high - low > 1.5 * (unit_high - unit_low)
    assert (low, high) == cluster_bootstrap_ci(values, rng_seed=1)  # seeded
    estimate = clustered_estimate(values, rng_seed=1)
    assert (
        estimate.mean == pytest.approx(37.5) and estimate.n == 20 and (estimate.ci_low, estimate.ci_high) == (low, high)
    )


def test_detectable_effects_at_the_seed_and_the_cluster_level():
    # t quantiles with 2 df: 4.3027 + 1.0607 against the normal's 1.96 + 0.84
    assert detectable_effect(10.0, 3, df=2) == pytest.approx((4.302653 + 1.060660) * 10 / math.sqrt(3), rel=1e-5)
    assert detectable_effect(10.0, 3) == pytest.approx(detectable_difference(10.0, 3))
    assert detectable_effect(10.0, 1, df=0) == math.inf
    # cluster means of the differences 0, 10, 20 (sd 10, k = 3): the seeds inside a cluster do not count
    differences = _clustered({0: [0.0, 0.0], 1: [5.0, 15.0], 2: [20.0, 20.0]})
    assert clustered_detectable(differences) == pytest.approx(detectable_effect(10.0, 3, df=2))
    assert clustered_detectable(_clustered({0: [1.0, 2.0]})) == math.inf  # one cluster


def test_seed_level_tests_of_two_methods_and_of_a_method_against_the_base_model():
    units = [("t", v, s) for v in range(2) for s in range(2)]
    a = [dict.fromkeys(units, x) for x in (30.0, 40.0, 50.0)]  # three training seeds
    b = [dict.fromkeys(units, x) for x in (0.0, 10.0, 20.0)]
    result = seed_level_independent("a", a, "b", b)
    assert result.seed_values_a == [30.0, 40.0, 50.0] and result.difference == pytest.approx(30.0)
    assert result.p_permutation == pytest.approx(0.1) == result.p_floor  # every a seed above every b seed
    assert result.above_in_every_seed and result.units == 4
    # Welch: equal variances 100, se = sqrt(200 / 3), t = 30 / se, df = 4
    assert result.t == pytest.approx(30 / math.sqrt(200 / 3)) and result.df == pytest.approx(4.0)
    assert result.detectable == pytest.approx(detectable_effect(10.0, 1.5, df=4))
    base = dict.fromkeys(units, 20.0)
    versus = seed_level_vs_fixed("b", b, "base", base)
    assert versus.seed_values_a == [-20.0, -10.0, 0.0] and versus.difference == pytest.approx(-10.0)
    assert versus.p_permutation == pytest.approx(sign_flip_p_value([-20.0, -10.0, 0.0]))
    assert versus.p_floor == 0.25 and not versus.above_in_every_seed
    assert versus.t == pytest.approx(-10.0 / (10.0 / math.sqrt(3))) and versus.df == 2
    above = seed_level_vs_fixed("a", a, "base", base)
    assert above.above_in_every_seed and above.p_permutation == pytest.approx(0.25)  # the 3-seed floor
