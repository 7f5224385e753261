"""The per-problem part of a study's report (from each run's heldout.jsonl): paired tests against the baselines,
the contrasts between methods, the collapse counts' Fisher tests, and their study.md section and study_heldout.csv.
docs/study.md, "Statistics"."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from . import stats
from .results import load_heldout, write_file

HELDOUT_BASELINES = ("grpo", "grpo_nokl")  # with a reference, and the naive reference-free baseline

# Contrasts between two methods, each answering one question: (arm, baseline, what arm - baseline measures). Tested
# like the baselines' tables when both arms have heldout.jsonl and shared seeds; a study without such pairs (every
# study before the decisive one) gets no section, key or row.
CONTRASTS = (
    ("s_grpo", "grpo_nokl", "S-GRPO's masks and filters, without a reference"),
    ("grpo_nokl_tr", "grpo_nokl", "the trust region alone, without a reference"),
    ("s_grpo_tr", "s_grpo", "the trust region, added to S-GRPO"),
    ("s_grpo_tr", "grpo_nokl_tr", "S-GRPO's masks and filters, under the trust region"),
    ("s_grpo_afn", "s_grpo", "the all-fail negative advantage, added to S-GRPO"),
)


def heldout_tests(dirs: list[Path], runs: list[dict], order: list[str]) -> tuple[dict, dict]:
    """({arm: {seed: heldout}} of the runs that have heldout.jsonl (each checked against its summary.json), {baseline:
    {arm: stats.compare}} for each baseline of HELDOUT_BASELINES present, arms in `order`)."""
    held: dict[str, dict[int, dict]] = {}
    for path, run in zip(dirs, runs):
        h = load_heldout(path)
        if h is not None:
            held.setdefault(run["arm"], {})[run["seed"]] = h
    tests = {}
    for b in HELDOUT_BASELINES:
        if b in held:
            tests[b] = {a: stats.compare(held[a], held[b], a, b) for a in order
                        if a != b and a in held and set(held[a]) & set(held[b])}  # fmt: skip
    return held, tests


def heldout_contrasts(held: dict) -> list[dict]:
    """[{arm, baseline, question, **stats.compare}] for each pair of CONTRASTS whose arms share seeds in `held`."""
    return [
        {"arm": a, "baseline": b, "question": q, **stats.compare(held[a], held[b], a, b)}
        for a, b, q in CONTRASTS
        if a in held and b in held and set(held[a]) & set(held[b])
    ]


def heldout_multiplicity(tests: dict, contrasts: list[dict]) -> list[dict]:
    """[{arm, baseline, p, p_holm}], smallest p first: every distinct pair of arms whose held-out accuracy after
    training was tested (the baselines' tables, then the contrasts; a pair tested both ways, as `grpo_nokl` against
    `grpo` and `grpo` against `grpo_nokl`, counts once, in the direction met first), with its paired-t p and that p
    Holm-adjusted over the family. Pairs with one seed (no test) are left out."""
    pairs = [(a, b, r) for b, table in tests.items() for a, r in table.items()]
    pairs += [(r["arm"], r["baseline"], r) for r in contrasts]
    family, seen = [], set()
    for a, b, r in pairs:
        if frozenset((a, b)) not in seen and math.isfinite(r["after"]["p"]):
            seen.add(frozenset((a, b)))
            family.append({"arm": a, "baseline": b, "p": r["after"]["p"]})
    for f, adjusted in zip(family, stats.holm([f["p"] for f in family])):
        f["p_holm"] = adjusted
    return sorted(family, key=lambda f: f["p"])


def _csv_num(x: float) -> float | str:
    return "" if math.isnan(x) else x


def holm_by_pair(multiplicity: list[dict]) -> dict[frozenset, float]:
    """{frozenset((arm, baseline)): Holm-adjusted p} of a `heldout_multiplicity` family: a pair in either direction."""
    return {frozenset((f["arm"], f["baseline"])): f["p_holm"] for f in multiplicity}


def _multiplicity_markdown(multiplicity: list[dict]) -> list[str]:
    if len(multiplicity) < 2:
        return []
    m = len(multiplicity)
    survive = [f for f in multiplicity if f["p_holm"] < stats.ALPHA]
    lines = [
        "",
        "### Multiplicity: Holm's correction",
        "",
        f"The tables above test each pair on its own at alpha {stats.ALPHA}. This report tests {m} distinct pairs "
        "of arms on held-out accuracy, so some p below 0.05 are expected by chance alone; Holm's step-down "
        f'correction keeps the chance of any false "beyond noise" among them at {stats.ALPHA} (paired-t p, '
        "smallest first).",
        "",
        "| arm − baseline | p (t) | p (Holm) | beyond noise after the correction |",
        "|---|---|---|---|",
    ]
    lines += [f"| {f['arm']} − {f['baseline']} | {_p(f['p'])} | {_p(f['p_holm'])} | "
              f"{'yes' if f['p_holm'] < stats.ALPHA else 'no'} |" for f in multiplicity]  # fmt: skip
    lines += ["", f"{len(survive)} of {m} differences stay beyond noise after the correction."]
    return lines


def collapse_tests(runs: list[dict], order: list[str]) -> dict:
    """{baseline: {arm: {events, runs, base_events, base_runs, p}}}: the runs with any collapse event (run["collapse"])
    of each arm against each baseline of HELDOUT_BASELINES present, two-sided Fisher exact p. Runs, not seeds, are
    the units: a collapse is an event of one run."""
    counts = {}
    for r in runs:
        k, n = counts.get(r["arm"], (0, 0))
        counts[r["arm"]] = (k + bool(r["collapse"]), n + 1)
    out = {}
    for b in (b for b in HELDOUT_BASELINES if b in counts):
        kb, nb = counts[b]
        table = {a: {"events": counts[a][0], "runs": counts[a][1], "base_events": kb, "base_runs": nb,
                     "p": stats.fisher_exact(*counts[a], kb, nb)}
                 for a in order if a != b and a in counts}  # fmt: skip
        if table:  # a baseline with no other arm beside it has nothing to be tested against
            out[b] = table
    return out


def _collapse_markdown(collapse: dict) -> list[str]:
    if not collapse:
        return []
    bases = list(collapse)
    arms = list(dict.fromkeys(a for t in collapse.values() for a in t))
    counts = {a: (t[a]["events"], t[a]["runs"]) for t in collapse.values() for a in t}
    counts |= {b: (t[a]["base_events"], t[a]["base_runs"]) for b, t in collapse.items() for a in t}
    lines = [
        "",
        "### Collapse events: Fisher's exact test",
        "",
        'Runs with any collapse event (low entropy, blow-up or signal death; docs/study.md, "Collapse") out of the '
        "arm's runs, against each baseline's runs; two-sided Fisher exact p. With this few runs only a near-complete "
        "split can reach p < 0.05.",
        "",
        "| arm | collapsed runs | "
        + " | ".join(f"p against {b} ({'/'.join(map(str, counts[b]))})" for b in bases)
        + " |",
        "|" + "---|" * (2 + len(bases)),
    ]
    for a in list(dict.fromkeys([*bases, *arms])):
        cells = [_p(collapse[b][a]["p"]) if a in collapse[b] else "—" for b in bases]
        lines.append(f"| {a} | {counts[a][0]}/{counts[a][1]} | " + " | ".join(cells) + " |")
    return lines


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _p_is(p: float) -> str:
    return "p < 0.001" if math.isfinite(p) and p < 0.001 else f"p = {_p(p)}"


def _signed(x: float) -> str:
    """+0.123; a value that rounds to zero is +0.000, never -0.000."""
    return f"{round(x, 3) + 0.0:+.3f}" if math.isfinite(x) else "n/a"


def _ci(ci: list[float]) -> str:
    return "n/a" if not all(math.isfinite(v) for v in ci) else f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def _f(x: float, fmt: str = ".3f") -> str:
    return f"{x:{fmt}}" if math.isfinite(x) else "n/a"


def _tests_table(baseline: str, table: dict, key: str = "after") -> list[str]:
    what = "after" if key == "after" else "gain"
    lines = [
        f"| arm | seeds | problems | {what} − {baseline} | 95% CI (t) | p (t) | SD of differences | MDD (t) | "
        "McNemar b / c | p (exact) | p (χ², cc) | MDD per problem | bootstrap 95% CI | reading |",
        "|" + "---|" * 14,
    ]
    for arm, r in table.items():
        t, m = r[key], r["mcnemar"]
        lines.append(
            f"| {arm} | {t['n']} | {r['problems']} | {_signed(t['mean'])} | {_ci(t['ci'])} | {_p(t['p'])} | "
            f"{_f(t['sd'])} | {_f(t['mdd'])} | {m['b']} / {m['c']} | {_p(m['p_exact'])} | {_p(m['p_chi2_cc'])} | "
            f"{_f(r['mdd_pooled'])} | {_ci(r['bootstrap_ci'])} | {stats.reading(t, baseline)} |"
        )
    return lines


def _in_words(arm: str, baseline: str, r: dict) -> str:
    t, m = r["after"], r["mcnemar"]
    if t["n"] < 2:
        return (
            f"- `{arm}` − `{baseline}`: {_signed(t['mean'])} on the one shared seed: no test across seeds; per problem "
            f"{m['b']} right only for {arm}, {m['c']} only for {baseline} (McNemar exact, {_p_is(m['p_exact'])})."
        )
    verdict = stats.reading(t, baseline)
    return (
        f"- `{arm}` − `{baseline}`: {_signed(t['mean'])} over {t['n']} seeds (95% CI {_signed(t['ci'][0])} to "
        f"{_signed(t['ci'][1])}, {_p_is(t['p'])}): **{verdict}**. At the observed SD of the per-seed differences "
        f"({t['sd']:.3f}) this design detects a true difference of about {t['mdd']:.3f} with 80% power. Per problem, "
        f"pooled over seeds: {m['b']} right only for {arm}, {m['c']} only for {baseline} (McNemar exact, "
        f"{_p_is(m['p_exact'])}); bootstrap 95% CI {_ci(r['bootstrap_ci'])}."
    )


def heldout_markdown(tests: dict, held: dict, n_runs: int, contrasts: list[dict] = (), collapse: dict | None = None,
                     multiplicity: list[dict] = ()) -> str:  # fmt: skip
    """study.md's section of per-problem held-out tests (from heldout.jsonl), with the collapse counts' tests, the
    contrasts between methods and Holm's correction over all of them."""
    n_held = sum(len(v) for v in held.values())
    lines = [
        "",
        "## Held-out accuracy: paired tests (per problem, from heldout.jsonl)",
        "",
        "Per seed, the difference in held-out accuracy after training (arm − baseline; the same seed draws the same "
        "held-out problems, paired by id). **Primary test**: paired t over seeds (df = seeds − 1; the unit of "
        'replication is the training run); "within noise" when its 95% CI covers 0. MDD (t): the smallest true '
        "difference this design detects with 80% power at two-sided alpha 0.05, (t_0.975 + t_0.80) x SD / sqrt(n), "
        "at the *observed* SD of the differences. McNemar: b = problems right only for the arm, c = right only for "
        "the baseline, summed over seeds; exact two-sided binomial p (χ² with continuity correction for reference); "
        'it treats problems as independent and ignores seed-to-seed spread, so it answers "do these trained models '
        'differ on these problems", not "does the method differ" (MDD per problem: its normal-approximation '
        f"analogue, optimistic for the same reason). Bootstrap: seeds, then problems within seeds, resampled "
        f"({stats.RESAMPLES} times, RNG seed {stats.BOOT_SEED}), percentile interval.",
    ]
    if n_held < n_runs:
        lines += ["", f"{n_runs - n_held} of {n_runs} runs have no heldout.jsonl (made before it was written): left "
                  "out of these tests."]  # fmt: skip
    if not tests:
        lines += ["", f"No baseline arm ({', '.join(HELDOUT_BASELINES)}) has heldout.jsonl: no test."]
    for baseline, table in tests.items():
        if not table:
            continue
        lines += ["", f"### Against `{baseline}`", "", *_tests_table(baseline, table), ""]
        lines += [_in_words(arm, baseline, r) for arm, r in table.items()]
        differs = [a for a, r in table.items() if r["before_differs"]]
        if differs:
            lines += [
                "",
                f"Held-out accuracy before training differs from `{baseline}`'s for {', '.join(differs)}: "
                "the change (after − before) tested the same way:",
                "",
                *_tests_table(baseline, table, "gain"),
            ]
        else:
            lines += [
                "",
                f"Every run's per-problem outcome before training equals `{baseline}`'s (same seed, same "
                "initial model): the difference in change (after − before) is the difference after.",
            ]
    lines += _collapse_markdown(collapse)
    if contrasts:
        lines += [
            "",
            "### Contrasts between methods",
            "",
            "Each row answers one question (what the arm adds to its baseline); tested as above, per seed and per "
            "problem.",
            "",
            "| arm − baseline | what it measures | seeds | difference after | 95% CI (t) | p (t) | MDD (t) | "
            "McNemar b / c | p (exact) | bootstrap 95% CI | reading |",
            "|" + "---|" * 11,
        ]
        for r in contrasts:
            t, m = r["after"], r["mcnemar"]
            lines.append(
                f"| {r['arm']} − {r['baseline']} | {r['question']} | {t['n']} | {_signed(t['mean'])} | "
                f"{_ci(t['ci'])} | {_p(t['p'])} | {_f(t['mdd'])} | {m['b']} / {m['c']} | {_p(m['p_exact'])} | "
                f"{_ci(r['bootstrap_ci'])} | {r['reading']} |"
            )
    lines += _multiplicity_markdown(list(multiplicity))
    return "\n".join(lines) + "\n"


HELDOUT_CSV = ("baseline", "arm", "seeds", "problems", "diff_mean", "ci_lo", "ci_hi", "p_t", "sd_diff", "mdd_t",
               "gain_diff_mean", "gain_p_t", "mcnemar_b", "mcnemar_c", "p_mcnemar_exact", "p_mcnemar_chi2_cc",
               "mdd_per_problem", "boot_lo", "boot_hi", "reading", "p_t_holm")  # fmt: skip


def write_heldout_csv(path: Path, tests: dict, contrasts: list[dict] = (), multiplicity: list[dict] = ()) -> None:
    """One row per (baseline, arm) tested: the baselines' tables, then the contrasts not already among them; p_t_holm
    is the pair's Holm-adjusted p over `multiplicity`'s family (empty where the pair is not in it)."""
    rows = [(b, a, r) for b, table in tests.items() for a, r in table.items()]
    rows += [(r["baseline"], r["arm"], r) for r in contrasts if r["arm"] not in tests.get(r["baseline"], {})]
    holm = holm_by_pair(multiplicity)
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(HELDOUT_CSV)
    for baseline, arm, r in rows:
        t, g, m = r["after"], r["gain"], r["mcnemar"]
        w.writerow([baseline, arm, t["n"], r["problems"], t["mean"], *t["ci"], t["p"], t["sd"], t["mdd"],
                    g["mean"], g["p"], m["b"], m["c"], m["p_exact"], m["p_chi2_cc"], r["mdd_pooled"],
                    *r["bootstrap_ci"], stats.reading(t, baseline),
                    _csv_num(holm.get(frozenset((arm, baseline)), math.nan))])  # fmt: skip
    write_file(path, fh.getvalue())  # whole or as it was (a full disk)
