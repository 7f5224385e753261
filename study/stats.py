"""The held-out tests of a study: paired t over seeds, McNemar's exact test over problems pooled over seeds, a
two-level bootstrap, the design's minimum detectable difference, Fisher's exact test of collapse counts and Holm's
correction for the number of comparisons. docs/study.md, "Statistics".

The distributions and tests are scipy.stats's (`ttest_1samp` of the per-seed differences, `binomtest`, `fisher_exact`,
`t`, `chi2`). Two procedures stay here because scipy has none: Holm's step-down correction (arithmetic on sorted
p-values, no distribution; scipy.stats.false_discovery_control is Benjamini-Hochberg) and the two-level bootstrap
(seeds, then problems within a seed; scipy.stats.bootstrap resamples one level).

The unit of replication is the training run (a seed): the paired t-test over seeds is the primary test of whether a
method changes held-out accuracy. McNemar's test pools the problems of every seed pair and treats them as independent;
it asks whether these trained models differ on these problems, and ignores the run-to-run spread, so it is reported
beside the t-test, never instead of it."""

from __future__ import annotations

import math
import random
import statistics

ALPHA = 0.05
POWER = 0.80
RESAMPLES = 2000
BOOT_SEED = 0  # fixed: the bootstrap interval is part of the report and must recompute to the same bytes


# --------------------------------------------------------------------------------------------- distributions
# scipy.stats computes every distribution and test below (imported when first needed: `--help` and the trainer never
# load scipy). Until the v2 study the module carried its own incomplete beta function (Numerical Recipes) and t
# quantiles by bisection; the published reports recompute with scipy to the printed digits (study.md byte for byte;
# study.json and study_heldout.csv differ in the 13th significant digit or later, docs/study.md "Statistics").


def _sp():
    try:
        import scipy.stats
    except ImportError:  # pragma: no cover - the study extra installs it
        raise ImportError("the study's statistics need scipy: pip install 'sgrpo-kernels[study]' (or scipy)") from None
    return scipy.stats


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's T with `df` degrees of freedom (scipy.stats.t)."""
    if math.isnan(t) or not df > 0:
        return math.nan
    if math.isinf(t):
        return 0.0
    return float(2.0 * _sp().t.sf(abs(t), df))


def t_ppf(q: float, df: float) -> float:
    """The q quantile of Student's T (scipy.stats.t)."""
    if not 0.0 < q < 1.0 or not df > 0:
        raise ValueError(f"t_ppf: expected 0 < q < 1 and df > 0, got q={q}, df={df}")
    return float(_sp().t.ppf(q, df))


def binom_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided binomial test of k successes in n trials at p = 1/2 (scipy.stats.binomtest)."""
    if n == 0:
        return 1.0
    return float(_sp().binomtest(k, n, 0.5).pvalue)


def chi2_1_sf(x: float) -> float:
    """P(X >= x) for a chi-square with 1 degree of freedom (scipy.stats.chi2)."""
    return float(_sp().chi2.sf(x, 1)) if x > 0 else 1.0


# --------------------------------------------------------------------------------------------- tests


def paired_t(diffs: list[float], alpha: float = ALPHA, power: float = POWER) -> dict:
    """Paired t-test of per-seed differences: {n, mean, sd, se, df, t, p, ci: [lo, hi], mdd}. With one difference
    nothing but the mean exists (the rest nan); a zero SD gives p 1 (mean 0) or 0 and a zero-width interval.
    `mdd`: the minimum detectable difference of this design at the observed SD (see `mdd_paired`)."""
    n = len(diffs)
    mean = math.fsum(diffs) / n if n else math.nan
    out = {"n": n, "mean": mean, "sd": math.nan, "se": math.nan, "df": n - 1, "t": math.nan, "p": math.nan,
           "ci": [math.nan, math.nan], "mdd": math.nan}  # fmt: skip
    if n < 2:
        return out
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    if se > 0:
        res = _sp().ttest_1samp(diffs, 0.0)
        t, p = float(res.statistic), float(res.pvalue)
        ci = [float(x) for x in res.confidence_interval(1.0 - alpha)]
    else:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
        ci = [mean, mean]
    out.update(sd=sd, se=se, t=t, p=p, ci=ci, mdd=mdd_paired(sd, n, alpha, power))
    return out


def mdd_paired(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t-test over `n` seeds detects with probability `power` at
    level `alpha` when the differences have standard deviation `sd`: (t_{1-alpha/2, n-1} + t_{power, n-1}) sd /
    sqrt(n) (the usual approximation to the noncentral-t power)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return (t_ppf(1.0 - alpha / 2.0, n - 1) + t_ppf(power, n - 1)) * sd / math.sqrt(n)


def mcnemar(b: int, c: int) -> dict:
    """McNemar's test of b (arm right, baseline wrong) against c (arm wrong, baseline right) discordant problems:
    the exact two-sided binomial p-value, and the chi-square with continuity correction for reference."""
    chi2 = (abs(b - c) - 1) ** 2 / (b + c) if b + c > 0 else 0.0
    return {"b": b, "c": c, "p_exact": binom_two_sided_p(b, b + c), "chi2_cc": chi2,
            "p_chi2_cc": chi2_1_sf(chi2) if b + c > 0 else 1.0}  # fmt: skip


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test of k1 events in n1 runs against k2 in n2 (scipy.stats.fisher_exact of the 2 x 2
    table [[k1, n1 - k1], [k2, n2 - k2]])."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"fisher_exact: expected 0 <= k <= n, got {k1}/{n1} and {k2}/{n2}")
    return float(_sp().fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m p-values times (m - i), i from
    0, made non-decreasing in that order and capped at 1. Rejecting every adjusted p below alpha keeps the chance of
    any false rejection in the family at most alpha, whatever the tests' dependence."""
    if any(not 0.0 <= p <= 1.0 for p in ps):
        raise ValueError(f"holm: expected p-values in [0, 1], got {ps}")
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def mdd_pooled(discordant: int, problems: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The per-problem test's minimum detectable difference, normal approximation: (z_{1-alpha/2} + z_power)
    sqrt(discordant) / problems (the variance of a per-problem difference in {-1, 0, 1} is about the discordant
    fraction). It treats problems as independent, ignoring the seed-to-seed spread: a lower bound, optimistic."""
    if problems == 0:
        return math.nan
    z = statistics.NormalDist()
    return (z.inv_cdf(1.0 - alpha / 2.0) + z.inv_cdf(power)) * math.sqrt(discordant) / problems


def bootstrap_ci(per_seed: list[list[int]], resamples: int = RESAMPLES, seed: int = BOOT_SEED,
                 level: float = 1.0 - ALPHA) -> list[float]:  # fmt: skip
    """Percentile interval of the mean difference by a two-level bootstrap: draw the seeds with replacement, then each
    drawn seed's problems with replacement; the statistic is the mean over drawn seeds of their mean difference.
    `per_seed`: for each seed, the per-problem differences (arm - baseline, each -1, 0 or 1). Fixed RNG seed."""
    if not per_seed or not all(per_seed):
        return [math.nan, math.nan]
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        total = 0.0
        for s in rng.choices(range(len(per_seed)), k=len(per_seed)):
            d = per_seed[s]
            total += sum(rng.choices(d, k=len(d))) / len(d)
        stats.append(total / len(per_seed))
    stats.sort()
    lo = stats[int(math.floor((1.0 - level) / 2.0 * (resamples - 1)))]
    hi = stats[int(math.ceil((1.0 + level) / 2.0 * (resamples - 1)))]
    return [lo, hi]


# --------------------------------------------------------------------------------------------- one comparison


def _pair_problems(arm: dict[int, dict], base: dict[int, dict], where: str) -> list[tuple[dict, dict]]:
    """The two runs' problems paired by id; the same seed draws the same held-out set, so a differing set (or the same
    id with another question) is refused: such runs cannot be paired."""
    if set(arm) != set(base) or any(arm[i]["q"] != base[i]["q"] for i in arm):
        raise ValueError(f"{where}: the two runs' held-out problems differ (ids or questions); they cannot be paired")
    return [(arm[i], base[i]) for i in sorted(arm)]


def compare(arm: dict[int, dict[int, dict]], base: dict[int, dict[int, dict]], name: str = "arm",
            baseline: str = "baseline") -> dict:  # fmt: skip
    """Held-out accuracy of `arm` against `base` over the seeds both have. Each is {seed: {problem id: record}}, a
    record being a heldout.jsonl line. Returns the paired t over seeds of the accuracy after training (`after`) and
    of the change after - before (`gain`), McNemar pooled over seeds, the bootstrap interval, and the MDDs."""
    seeds = sorted(set(arm) & set(base))
    per_seed, b, c, before_differs = [], 0, 0, False
    after_d, gain_d = [], []
    for s in seeds:
        pairs = _pair_problems(arm[s], base[s], f"{name} vs {baseline}, seed {s}")
        d = [int(x["after"]) - int(y["after"]) for x, y in pairs]
        d_before = [int(x["before"]) - int(y["before"]) for x, y in pairs]
        before_differs |= any(d_before)
        per_seed.append(d)
        b += d.count(1)
        c += d.count(-1)
        after_d.append(sum(d) / len(d))
        gain_d.append((sum(d) - sum(d_before)) / len(d))
    problems = sum(len(d) for d in per_seed)
    after = paired_t(after_d)
    return {
        "seeds": seeds,
        "problems": problems,
        "after": after,
        "gain": paired_t(gain_d),
        "before_differs": before_differs,
        "per_seed_diff": after_d,
        "mcnemar": mcnemar(b, c),
        "mdd_pooled": mdd_pooled(b + c, problems),
        "bootstrap_ci": bootstrap_ci(per_seed),
        "reading": reading(after, baseline),
    }


def reading(t: dict, baseline: str) -> str:
    """The t-test's result in words."""
    if t["n"] < 2:
        return "one seed: no test"
    lo, hi = t["ci"]
    if lo <= 0.0 <= hi:
        return "within noise"
    return f"{'higher' if t['mean'] > 0 else 'lower'} than {baseline} beyond noise"
