"""The statistics an evaluation reports: Pass@k, bootstrap confidence intervals, and paired
comparisons of two policies played on the same (variation, seed) units.

Everything here is plain Python on lists of floats, seeded where it samples, so a report can be
reproduced and each function checked by hand on a tiny case (tests/unit/evaluation/test_stats.py).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
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
