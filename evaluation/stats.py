"""The statistics an evaluation reports: Pass@k, bootstrap confidence intervals, and paired
comparisons of two policies played on the same (variation, seed) units.

Three levels, each answering its own question:
- unit level (`paired`): these two checkpoints on these (variation, evaluation seed) units, the units
  treated as independent, which they are not: an episode's score depends on its variation;
- variation level (`cluster_bootstrap_ci`, `clustered_estimate`, `clustered_detectable`): whole
  variations resampled, so the interval carries the variation-to-variation spread;
- seed level (`seed_level_independent`, `seed_level_vs_fixed`): the unit of a claim about a *method* is
  its training seed (one seed's mean over the evaluation units), since another training run of the same
  method gives another checkpoint; with 2 or 3 seeds the exact tests have floors (`permutation_floor`,
  `sign_flip_floor`) that may lie above 0.05.
`holm` adjusts a family of p-values for multiplicity.

Everything here is plain Python on lists of floats (no scipy: the Student-t distribution comes from the
regularized incomplete beta function), seeded where it samples, so a report can be reproduced and each
function checked by hand on a tiny case (tests/unit/evaluation/test_stats.py).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

BOOTSTRAP_SAMPLES = 10_000
PERMUTATIONS = 10_000  # Monte Carlo sign flips past EXACT_PERMUTATION_UNITS paired units
EXACT_PERMUTATION_UNITS = 16  # up to 2^16 sign patterns are enumerated: the exact p-value
Z_975, Z_80 = 1.959964, 0.841621  # standard normal quantiles: two-sided 5% test, 80% power


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k draws without replacement from n attempts, c of
    them successful, succeeds (the unbiased estimator of Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.fmean,
    samples: int = BOOTSTRAP_SAMPLES,
    rng_seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """The percentile bootstrap interval of `statistic` over `values` (resampled with replacement)."""
    if not values:
        raise ValueError("a bootstrap needs at least one value")
    rng = random.Random(rng_seed)
    n = len(values)
    draws = sorted(statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(samples))
    tail = (1.0 - level) / 2
    return draws[int(tail * (samples - 1))], draws[int(math.ceil((1.0 - tail) * (samples - 1)))]


def sign_flip_p_value(differences: Sequence[float], permutations: int = PERMUTATIONS, rng_seed: int = 0) -> float:
    """Two-sided p-value of the paired permutation test: under "no difference" each unit's
    difference is as likely negative as positive, so the mean's sign pattern is flipped at random.
    Exact (every pattern) up to EXACT_PERMUTATION_UNITS units, else `permutations` random ones
    (counting the observed one, so p > 0)."""
    if not differences:
        raise ValueError("a paired test needs at least one unit")
    observed = abs(sum(differences))
    eps = 1e-9 * max(1.0, observed)
    if len(differences) <= EXACT_PERMUTATION_UNITS:
        extreme = total = 0
        for signs in itertools.product((1, -1), repeat=len(differences)):
            total += 1
            extreme += abs(sum(s * d for s, d in zip(signs, differences))) >= observed - eps
        return extreme / total
    rng = random.Random(rng_seed)
    extreme = sum(
        abs(sum(d if rng.random() < 0.5 else -d for d in differences)) >= observed - eps for _ in range(permutations)
    )
    return (extreme + 1) / (permutations + 1)


def detectable_difference(sd: float, n: int) -> float:
    """The smallest true mean difference a paired design of n units with differences of standard
    deviation `sd` detects with 80% power at the two-sided 5% level (normal approximation)."""
    return (Z_975 + Z_80) * sd / math.sqrt(n) if n else math.inf


@dataclass
class Estimate:
    mean: float
    ci_low: float
    ci_high: float
    n: int

    def text(self, digits: int = 1) -> str:
        return f"{self.mean:.{digits}f} [{self.ci_low:.{digits}f}, {self.ci_high:.{digits}f}]"


@dataclass
class PairedComparison:
    """Policy a minus policy b over the units both played."""

    a: str
    b: str
    difference: Estimate
    p_value: float
    detectable: float  # the design's smallest difference found with 80% power (from the observed sd)


def estimate(values: Sequence[float], rng_seed: int = 0) -> Estimate:
    low, high = bootstrap_ci(values, rng_seed=rng_seed)
    return Estimate(statistics.fmean(values), low, high, len(values))


def paired(a: str, scores_a: dict, b: str, scores_b: dict, rng_seed: int = 0) -> PairedComparison:
    """Compare two policies on their common units (keys such as (task, variation, seed))."""
    units = sorted(set(scores_a) & set(scores_b))
    if not units:
        raise ValueError(f"{a} and {b} share no (variation, seed) unit")
    differences = [scores_a[u] - scores_b[u] for u in units]
    sd = statistics.stdev(differences) if len(differences) > 1 else math.inf
    return PairedComparison(
        a=a,
        b=b,
        difference=estimate(differences, rng_seed),
        p_value=sign_flip_p_value(differences, rng_seed=rng_seed),
        detectable=detectable_difference(sd, len(differences)),
    )


# --- multiplicity ---------------------------------------------------------------------------------


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down): the i-th smallest of m p-values is multiplied by
    m - i (i from 0), made monotone (never below an adjusted value of a smaller p) and capped at 1.
    Rejecting where the adjusted p < alpha controls the family-wise error rate at alpha."""
    ordered = sorted(p_values.items(), key=lambda item: item[1])
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[name] = running
    return {name: adjusted[name] for name in p_values}


# --- the Student-t distribution, without scipy ----------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1 and a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / (df + t * t), df / 2.0, 0.5)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = t_two_sided_p(t, df) / 2.0
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with df degrees of freedom (bisection on t_cdf)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"a quantile needs 0 < q < 1, got {q}")
    low, high = -1e7, 1e7
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


@dataclass
class TTest:
    """A t-test's statistic, degrees of freedom and two-sided p; all None where it is undefined (fewer
    than two values in a group, or no spread at all)."""

    t: float | None
    df: float | None
    p: float | None


UNDEFINED = TTest(None, None, None)


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's two-sample t-test of mean(a) = mean(b), variances not assumed equal; the degrees of freedom
    by Welch-Satterthwaite: (va + vb)^2 / (va^2 / (na - 1) + vb^2 / (nb - 1)) with v = s^2 / n."""
    if len(a) < 2 or len(b) < 2:
        return UNDEFINED
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:
        return UNDEFINED
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return TTest(t, df, t_two_sided_p(t, df))


def one_sample_t_test(values: Sequence[float], mu: float = 0.0) -> TTest:
    """The one-sample t-test of mean(values) = mu (n - 1 degrees of freedom)."""
    if len(values) < 2:
        return UNDEFINED
    sd = statistics.stdev(values)
    if sd == 0.0:
        return UNDEFINED
    t = (statistics.fmean(values) - mu) / (sd / math.sqrt(len(values)))
    df = len(values) - 1
    return TTest(t, df, t_two_sided_p(t, df))


# --- exact permutation tests over few seeds -------------------------------------------------------

EXACT_RELABELINGS = 100_000  # two-sample relabelings enumerated up to this many, else Monte Carlo


def permutation_p_value(
    a: Sequence[float], b: Sequence[float], permutations: int = PERMUTATIONS, rng_seed: int = 0
) -> float:
    """Two-sided p-value of the two-sample permutation test of |mean(a) - mean(b)|: under "no difference"
    the labels are exchangeable, so every split of the pooled values into groups of len(a) and len(b) is
    as likely. Exact (every split) up to EXACT_RELABELINGS splits, else `permutations` random ones."""
    if not a or not b:
        raise ValueError("a two-sample test needs at least one value in each group")
    pooled, na = [*a, *b], len(a)
    total_sum = sum(pooled)

    def gap(chosen_sum: float) -> float:
        return abs(chosen_sum / na - (total_sum - chosen_sum) / len(b))

    observed = gap(sum(a))
    eps = 1e-9 * max(1.0, observed)
    if math.comb(len(pooled), na) <= EXACT_RELABELINGS:
        splits = [gap(sum(pooled[i] for i in idx)) for idx in itertools.combinations(range(len(pooled)), na)]
        return sum(g >= observed - eps for g in splits) / len(splits)
    rng = random.Random(rng_seed)
    extreme = sum(gap(sum(rng.sample(pooled, na))) >= observed - eps for _ in range(permutations))
    return (extreme + 1) / (permutations + 1)


def permutation_floor(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the exact two-sample permutation test can give: 2 / C(n_a + n_b, n_a)
    with equal groups (a split and its swap are as extreme), else 1 / C(n_a + n_b, n_a). 3 vs 3: 0.1;
    2 vs 2: 1/3; 5 vs 5: 0.0079."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p of the exact sign-flip test on n paired values: 2 / 2^n (all signs
    the same, either way). 2: 0.5; 3: 0.25; 5: 0.0625; 6: 0.03125."""
    return min(1.0, 2.0 / 2**n)


# --- detectable effects ---------------------------------------------------------------------------


def detectable_effect(sd: float, n: float, df: float | None = None) -> float:
    """The smallest true difference detected with 80% power by a two-sided 5% test whose estimate has
    standard error sd / sqrt(n): (q_0.975 + q_0.80) * sd / sqrt(n), with the quantiles q of Student's t
    with df degrees of freedom (the usual approximation to the noncentral t: right to a few percent for
    df >= 2, and far larger than the normal one with few seeds: (4.30 + 1.06) at df 2 against
    (1.96 + 0.84)), or of the standard normal where df is None. For two independent groups of n_a and
    n_b pass the pooled sd and n = n_a n_b / (n_a + n_b); inf where there is nothing to estimate."""
    if n <= 0 or df is not None and df < 1 or math.isinf(sd) or math.isnan(sd):
        return math.inf
    quantiles = Z_975 + Z_80 if df is None else t_quantile(0.975, df) + t_quantile(0.80, df)
    return quantiles * sd / math.sqrt(n)


# --- variation-clustered bootstrap ----------------------------------------------------------------


def variation_of(unit: tuple) -> tuple:
    """The cluster of a (task, variation, seed) unit: (task, variation)."""
    return tuple(unit[:-1])


def clusters(values: Mapping[Hashable, float], cluster_of: Callable[[Hashable], Hashable] = variation_of) -> list:
    """The values grouped by cluster, clusters and units in sorted order (so resampling is reproducible)."""
    grouped: dict = {}
    for unit in sorted(values):
        grouped.setdefault(cluster_of(unit), []).append(values[unit])
    return [grouped[c] for c in sorted(grouped)]


def cluster_bootstrap_ci(
    values: Mapping[Hashable, float],
    cluster_of: Callable[[Hashable], Hashable] = variation_of,
    statistic: Callable[[Sequence[float]], float] = statistics.fmean,
    samples: int = BOOTSTRAP_SAMPLES,
    rng_seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """The percentile bootstrap interval of `statistic` over the units, resampling whole clusters: as
    many clusters as there are, drawn with replacement, each with all its units. Units of one cluster
    (the evaluation seeds of one variation) move together, so the interval carries the spread between
    clusters instead of treating correlated units as independent."""
    groups = clusters(values, cluster_of)
    if not groups:
        raise ValueError("a bootstrap needs at least one value")
    rng = random.Random(rng_seed)
    k = len(groups)
    draws = sorted(statistic([v for _ in range(k) for v in groups[rng.randrange(k)]]) for _ in range(samples))
    tail = (1.0 - level) / 2
    return draws[int(tail * (samples - 1))], draws[int(math.ceil((1.0 - tail) * (samples - 1)))]


def clustered_estimate(
    values: Mapping[Hashable, float], cluster_of: Callable[[Hashable], Hashable] = variation_of, rng_seed: int = 0
) -> Estimate:
    """The mean over the units with its variation-clustered bootstrap 95% CI."""
    low, high = cluster_bootstrap_ci(values, cluster_of, rng_seed=rng_seed)
    return Estimate(statistics.fmean(values.values()), low, high, len(values))


def paired_differences(scores_a: Mapping, scores_b: Mapping) -> dict:
    """a - b on every unit both played."""
    return {u: scores_a[u] - scores_b[u] for u in sorted(set(scores_a) & set(scores_b))}


def clustered_detectable(differences: Mapping[Hashable, float], cluster_of=variation_of) -> float:
    """The smallest mean difference a design of k clusters detects with 80% power: `detectable_effect`
    with the sd of the k cluster means of the differences, n = k, and t quantiles with k - 1 degrees of
    freedom (the clusters are the independent draws; inf below 2 clusters)."""
    means = [statistics.fmean(g) for g in clusters(differences, cluster_of)]
    if len(means) < 2:
        return math.inf
    return detectable_effect(statistics.stdev(means), len(means), df=len(means) - 1)


# --- seed-level tests: the unit of a method claim is the training seed ----------------------------


@dataclass
class SeedComparison:
    """Policy a minus policy b with the training seed as the unit. design "independent": two methods,
    each seed's mean over the common units (seed_values_a, seed_values_b), Welch's t-test and the exact
    two-sample permutation test; design "paired": a method's seeds against one fixed policy (the base
    model, no seeds), seed_values_a the per-seed differences (seed mean - fixed policy's mean on the
    same units), the one-sample t-test and the exact sign-flip test. p_floor: the exact test's smallest
    possible p; above_in_every_seed: every seed of a above every seed of b (paired: every difference > 0);
    detectable: `detectable_effect` at the seed level (t quantiles; inf with one seed per group)."""

    a: str
    b: str
    design: str
    seed_values_a: list[float]
    seed_values_b: list[float]
    difference: float
    t: float | None
    df: float | None
    p_t: float | None
    p_permutation: float
    p_floor: float
    above_in_every_seed: bool
    detectable: float
    units: int


def _common_units(evaluations: Sequence[Mapping]) -> list:
    return sorted(set.intersection(*(set(e) for e in evaluations))) if evaluations else []


def seed_level_independent(a: str, seeds_a: Sequence[Mapping], b: str, seeds_b: Sequence[Mapping]) -> SeedComparison:
    """Two methods, each a list of per-training-seed unit scores ({unit: score}, one dict per seed):
    each seed's mean over the units every seed of both played, then a - b on those seed means."""
    units = _common_units([*seeds_a, *seeds_b])
    if not units:
        raise ValueError(f"{a} and {b} share no unit across their seeds")
    means_a = [statistics.fmean(s[u] for u in units) for s in seeds_a]
    means_b = [statistics.fmean(s[u] for u in units) for s in seeds_b]
    na, nb = len(means_a), len(means_b)
    if na >= 2 and nb >= 2:
        pooled = math.sqrt(
            ((na - 1) * statistics.variance(means_a) + (nb - 1) * statistics.variance(means_b)) / (na + nb - 2)
        )
        detectable = detectable_effect(pooled, na * nb / (na + nb), df=na + nb - 2)
    else:
        detectable = math.inf
    test = welch_t_test(means_a, means_b)
    return SeedComparison(
        a=a,
        b=b,
        design="independent",
        seed_values_a=means_a,
        seed_values_b=means_b,
        difference=statistics.fmean(means_a) - statistics.fmean(means_b),
        t=test.t,
        df=test.df,
        p_t=test.p,
        p_permutation=permutation_p_value(means_a, means_b),
        p_floor=permutation_floor(na, nb),
        above_in_every_seed=min(means_a) > max(means_b),
        detectable=detectable,
        units=len(units),
    )


def seed_level_vs_fixed(a: str, seeds_a: Sequence[Mapping], b: str, fixed: Mapping) -> SeedComparison:
    """A method's training seeds against one fixed policy b (the base model: one policy, no seeds): per
    seed the paired difference of means on the units every seed and b played; the one-sample t-test
    and the exact sign-flip test of those differences. b's own evaluation noise is shared by every
    difference, so the test is about a against this evaluation of b."""
    differences, means_b = [], []
    units = _common_units([*seeds_a, fixed])
    if not units:
        raise ValueError(f"{a} and {b} share no unit")
    base_mean = statistics.fmean(fixed[u] for u in units)
    for s in seeds_a:
        differences.append(statistics.fmean(s[u] for u in units) - base_mean)
        means_b.append(base_mean)
    n = len(differences)
    test = one_sample_t_test(differences)
    return SeedComparison(
        a=a,
        b=b,
        design="paired",
        seed_values_a=differences,
        seed_values_b=means_b,
        difference=statistics.fmean(differences),
        t=test.t,
        df=test.df,
        p_t=test.p,
        p_permutation=sign_flip_p_value(differences),
        p_floor=sign_flip_floor(n),
        above_in_every_seed=all(d > 0 for d in differences),
        detectable=detectable_effect(statistics.stdev(differences), n, df=n - 1) if n >= 2 else math.inf,
        units=len(units),
    )
