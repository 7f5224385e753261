"""The study's held-out statistics (train/study/stats.py, scipy.stats underneath) against tabulated values,
the report's per-problem tests on synthetic run folders (a known difference detected, no difference within noise, a
heldout.jsonl that disagrees with its summary.json refused), the run files' publication, and the memory-on-paper
arithmetic (benchmarks/memory_on_paper.py)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from study import stats

# ----------------------------------------------------------------------------------------------- distributions


@pytest.mark.parametrize(
    "q, df, want",  # Student's t table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), 3 decimals
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.975, 30, 2.042),
     (0.80, 2, 1.061), (0.80, 4, 0.941), (0.95, 9, 1.833), (0.025, 4, -2.776)],
)  # fmt: skip
def test_t_quantiles_match_the_table(q, df, want):
    assert stats.t_ppf(q, df) == pytest.approx(want, abs=5e-4)
    # the quantile and the two-sided tail are each other's inverse
    assert stats.t_two_sided_p(stats.t_ppf(q, df), df) == pytest.approx(2 * min(q, 1 - q), abs=1e-10)


def test_t_p_values_and_binomial_hand_values():
    assert stats.t_two_sided_p(2.776445105, 4) == pytest.approx(0.05, abs=1e-8)
    assert stats.t_two_sided_p(0.0, 3) == pytest.approx(1.0)
    assert stats.t_two_sided_p(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| >= 1) = 1/2
    assert stats.t_two_sided_p(math.inf, 3) == 0.0 and math.isnan(stats.t_two_sided_p(math.nan, 3))
    assert stats.binom_two_sided_p(0, 6) == pytest.approx(2 / 64)
    assert stats.binom_two_sided_p(1, 10) == pytest.approx(2 * 11 / 1024)
    assert stats.binom_two_sided_p(5, 10) == 1.0 and stats.binom_two_sided_p(0, 0) == 1.0
    m = stats.mcnemar(2, 12)  # chi2 cc = (10 - 1)^2 / 14
    assert m["chi2_cc"] == pytest.approx(81 / 14) and m["p_exact"] == pytest.approx(2 * (1 + 14 + 91) / 2**14)
    assert stats.chi2_1_sf(3.841458820694124) == pytest.approx(0.05, abs=1e-9)
    with pytest.raises(ValueError, match="0 < q < 1"):
        stats.t_ppf(1.0, 3)


def test_paired_t_is_scipys_one_sample_t_of_the_differences():
    sp = pytest.importorskip("scipy.stats")
    diffs = [0.12, -0.03, 0.2, 0.05, 0.31, -0.1, 0.0]
    got, want = stats.paired_t(diffs), sp.ttest_1samp(diffs, 0.0)
    assert got["t"] == want.statistic and got["p"] == want.pvalue
    assert got["ci"] == list(want.confidence_interval(0.95))
    a, b = [0.5, 0.4, 0.7, 0.2], [0.3, 0.45, 0.5, 0.1]  # the same as scipy's paired (related-samples) test
    assert stats.paired_t([x - y for x, y in zip(a, b)])["p"] == pytest.approx(sp.ttest_rel(a, b).pvalue, rel=1e-12)


def test_paired_t_and_mdd_hand_computed():
    r = stats.paired_t([0.1, 0.2, 0.0])  # mean 0.1, sd 0.1, se 0.0577, t 1.732, df 2
    assert r["mean"] == pytest.approx(0.1) and r["sd"] == pytest.approx(0.1) and r["df"] == 2
    assert r["t"] == pytest.approx(math.sqrt(3)) and r["p"] == pytest.approx(0.2254033307585, rel=1e-9)
    assert r["ci"] == pytest.approx([0.1 - 4.302652729 * 0.1 / math.sqrt(3), 0.1 + 4.302652729 * 0.1 / math.sqrt(3)])
    assert r["mdd"] == pytest.approx((4.302652729 + 1.060660172) * 0.1 / math.sqrt(3))
    assert stats.mdd_paired(0.1, 5) == pytest.approx((2.776445105 + 0.940964577) * 0.1 / math.sqrt(5))
    one = stats.paired_t([0.3])
    assert one["mean"] == 0.3 and math.isnan(one["p"]) and math.isnan(one["mdd"])
    same = stats.paired_t([0.0, 0.0, 0.0])
    assert same["p"] == 1.0 and same["ci"] == [0.0, 0.0]
    assert stats.reading(stats.paired_t([0.1, 0.11, 0.12]), "grpo") == "higher than grpo beyond noise"
    assert stats.reading(r, "grpo") == "within noise" and stats.reading(one, "grpo") == "one seed: no test"


def test_bootstrap_is_fixed_and_covers_the_mean():
    rng = random.Random(3)
    per_seed = [[rng.choice([-1, 0, 0, 1, 1]) for _ in range(50)] for _ in range(4)]
    ci = stats.bootstrap_ci(per_seed)
    assert ci == stats.bootstrap_ci(per_seed)  # fixed RNG seed: the report recomputes to the same bytes
    mean = sum(sum(d) / len(d) for d in per_seed) / len(per_seed)
    assert ci[0] < mean < ci[1]
    assert stats.bootstrap_ci([[0] * 10] * 3) == [0.0, 0.0]


# ----------------------------------------------------------------------------------------------- synthetic runs


def write_run(study: Path, arm: str, seed: int, before: list[bool], after: list[bool], mechanism: bool = False,
              summary_after: float | None = None) -> Path:  # fmt: skip
    """A finished run's files as the trainer writes them (6 steps), with heldout.jsonl."""
    d = study / "runs" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"seed": seed, "collapse_window": 3, "collapse_entropy": 0.05, "max_grad_norm": 1.0}
    (d / "config.json").write_text(json.dumps({"train": cfg}))
    acc_b, acc_a = sum(before) / len(before), sum(after) / len(after)
    recs = [{"step": 0, "event": "eval", "eval_acc": acc_b}]
    for s in range(1, 7):
        r = {"step": s, "entropy_mean": 1.0 - 0.1 * s + 0.01 * seed, "accuracy": 0.3, "reward_mean": 0.3 + 0.01 * s,
             "zero_var_frac": 0.5, "format_frac": 0.8, "grad_norm": 0.5 + 0.1 * seed, "step_s": 1.0,
             "tokens_per_s": 10.0, "peak_mem_mb": 100.0,
             "kl_from_init": 0.1 * s if s in (2, 4, 6) else None}  # fmt: skip
        if mechanism:
            r |= {"update_norm": 0.01 * s, "ld_correct_shared": -0.02 * s, "ld_correct": 0.1, "ld_wrong": -0.1,
                  "ld_displaced_frac": None}  # fmt: skip
        recs.append(r)
    recs.append({"step": 6, "event": "eval", "eval_acc": acc_a})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = [{"id": i, "q": f"{i} + 1", "answer": str(i + 1), "before": b, "after": a}
             for i, (b, a) in enumerate(zip(before, after))]  # fmt: skip
    (d / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    after_acc = acc_a if summary_after is None else summary_after
    summary = {"before": {"eval_acc": acc_b, "eval_n": len(before)}, "after": {"eval_acc": after_acc,
               "eval_n": len(after)}, "steps": 6}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def make_study(root: Path, gain: int, noise: list[int], n: int = 100, seeds: int = 5) -> Path:
    """grpo, grpo_nokl and s_grpo over `seeds` seeds: s_grpo gets `gain + noise[seed]` more problems right than grpo
    (grpo_nokl: as grpo, one problem moved)."""
    rng = random.Random(0)
    for seed in range(seeds):
        before = [rng.random() < 0.3 for _ in range(n)]
        base = [rng.random() < 0.5 for _ in range(n)]
        arm = list(base)
        k = gain + noise[seed]
        flip = [i for i in range(n) if arm[i] != (k > 0)]  # k > 0: wrong ones made right; k < 0: the reverse
        for i in flip[: abs(k)]:
            arm[i] = k > 0
        nokl = list(base)
        nokl[seed], nokl[seed + 50] = base[seed + 50], base[seed]
        write_run(root, "grpo", seed, before, base, mechanism=True)
        write_run(root, "grpo_nokl", seed, before, nokl, mechanism=True)
        write_run(root, "s_grpo", seed, before, arm, mechanism=True)
    return root


def test_report_detects_a_known_difference(tmp_path):
    from study.report import write_report

    study = make_study(tmp_path / "study", gain=12, noise=[0, 2, -2, 1, -1])  # +0.12 a seed, SD 0.016
    out = write_report(study, order=["grpo", "grpo_nokl", "s_grpo"], figure=False)
    r = out["heldout_tests"]["grpo"]["s_grpo"]
    assert r["after"]["n"] == 5 and r["after"]["mean"] == pytest.approx(0.12)
    assert r["after"]["ci"][0] > 0 and r["after"]["p"] < 0.001
    assert r["mcnemar"]["b"] == 60 and r["mcnemar"]["c"] == 0 and r["mcnemar"]["p_exact"] < 1e-10
    assert r["bootstrap_ci"][0] > 0 and r["reading"] == "higher than grpo beyond noise"
    assert r["after"]["mdd"] == pytest.approx(stats.mdd_paired(r["after"]["sd"], 5))
    assert r["before_differs"] is False and r["gain"]["mean"] == pytest.approx(0.12)
    assert set(out["heldout_tests"]) == {"grpo", "grpo_nokl"}
    md = (study / "study.md").read_text()
    assert "## Held-out accuracy: paired tests" in md and "### Against `grpo_nokl`" in md
    assert "| s_grpo | 5 | 500 | +0.120 |" in md and "higher than grpo beyond noise" in md
    # 3 distinct pairs; s_grpo's two (p < 0.001, x 3 and x 2) survive Holm, grpo_nokl - grpo does not
    holm = {(m["arm"], m["baseline"]): m["p_holm"] for m in out["heldout_multiplicity"]}
    assert set(holm) == {("grpo_nokl", "grpo"), ("s_grpo", "grpo"), ("s_grpo", "grpo_nokl")}
    assert holm["s_grpo", "grpo"] == pytest.approx(3 * r["after"]["p"]) and holm["grpo_nokl", "grpo"] > 0.05
    assert "| s_grpo − grpo | <0.001 | <0.001 | yes |" in md and "2 of 3 differences stay beyond noise" in md
    saved = json.loads((study / "study.json").read_text())["heldout_tests"]["vs_grpo"]["s_grpo"]
    assert saved["mcnemar"]["b"] == 60
    rows = (study / "study_heldout.csv").read_text().splitlines()
    assert rows[0].startswith("baseline,arm,seeds") and len(rows) == 1 + 2 + 2  # 2 arms x 2 baselines
    # the report recomputes to the same bytes (the bootstrap's RNG is fixed)
    write_report(study, order=["grpo", "grpo_nokl", "s_grpo"], figure=False)
    assert (study / "study.md").read_text() == md


def test_fisher_exact_and_the_collapse_table():
    # hand-computed: margins 5/5 with 4 events, P(0 in the first) = C(5,4) / C(10,4) = 5/210, two-sided doubles it
    assert stats.fisher_exact(0, 5, 4, 5) == pytest.approx(10 / 210)
    assert stats.fisher_exact(0, 5, 3, 5) == pytest.approx(20 / 120) == stats.fisher_exact(3, 5, 0, 5)
    assert stats.fisher_exact(2, 5, 2, 5) == 1.0 and stats.fisher_exact(0, 3, 0, 3) == 1.0
    with pytest.raises(ValueError, match="0 <= k <= n, got 6/5"):
        stats.fisher_exact(6, 5, 0, 5)
    sp = pytest.importorskip("scipy.stats")
    for k1, n1, k2, n2 in ((1, 5, 5, 5), (3, 7, 0, 4), (2, 10, 7, 9), (0, 1, 1, 1)):
        want = sp.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
        assert stats.fisher_exact(k1, n1, k2, n2) == pytest.approx(want, rel=1e-12)

    from study.heldout import _collapse_markdown, collapse_tests

    runs = [{"arm": a, "seed": s, "collapse": c} for a, flags in (("grpo", [0, 0, 0, 0, 1]), ("grpo_nokl", [0] * 5),
            ("gtpo", [1] * 5)) for s, c in enumerate(flags)]  # fmt: skip
    got = collapse_tests(runs, ["grpo", "grpo_nokl", "gtpo"])
    assert got["grpo"]["gtpo"] == {"events": 5, "runs": 5, "base_events": 1, "base_runs": 5,
                                   "p": pytest.approx(10 / 210)}  # fmt: skip
    assert got["grpo_nokl"]["gtpo"]["p"] == pytest.approx(2 / 252) and set(got) == {"grpo", "grpo_nokl"}
    md = "\n".join(_collapse_markdown(got))
    assert "| arm | collapsed runs | p against grpo (1/5) | p against grpo_nokl (0/5) |" in md
    assert "| gtpo | 5/5 | 0.048 | 0.008 |" in md and "| grpo | 1/5 | — | 1.000 |" in md


def test_holm_adjusted_p_values():
    # hand-computed: sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0] and stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    assert stats.holm([0.01, 0.01, 0.5]) == pytest.approx([0.03, 0.03, 0.5])
    with pytest.raises(ValueError, match=r"p-values in \[0, 1\], got \[0.1, nan\]"):
        stats.holm([0.1, math.nan])


def test_report_of_a_baseline_alone(tmp_path):
    """A study whose only arm is a baseline (the first run of an extension, say) reports without a test: it used to
    fail with a KeyError in the collapse table."""
    from study.report import write_report

    study = tmp_path / "study"
    write_run(study, "grpo_nokl", 5, [False] * 4, [True, False, False, False])
    out = write_report(study, figure=False)
    md = (study / "study.md").read_text()
    assert out["collapse_tests"] == {} and "Fisher" not in md and "Holm" not in md
    assert "collapse_tests" not in json.loads((study / "study.json").read_text())


def test_forest_rows_starred_only_when_holm_keeps_them():
    from study.figure import forest_labels

    rows = [("gtpo", {"after": {"n": 5}}, ("gtpo", "grpo")), ("s_grpo", {"after": {"n": 4}}, ("s_grpo", "grpo")),
            ("grpo - gtpo", {"after": {"n": 5}}, ("grpo", "gtpo"))]  # fmt: skip
    holm = {frozenset(("gtpo", "grpo")): 0.01, frozenset(("s_grpo", "grpo")): 0.05}
    assert forest_labels(rows, holm) == ["gtpo (5) *", "s_grpo (4)", "grpo - gtpo (5) *"]
    assert forest_labels(rows, {}) == ["gtpo (5)", "s_grpo (4)", "grpo - gtpo (5)"]


def test_contrasts_between_methods(tmp_path):
    """The CONTRASTS pairs present are tested like the baselines' tables: s_grpo_tr gets 5, 6, 7 of 50 problems more
    right than grpo_nokl_tr on seeds 0, 1, 2 (0.12 +- 0.02 a seed); grpo_nokl_tr equals grpo_nokl; no s_grpo, so the
    contrasts against it are absent."""
    from study.report import write_report

    study, rng = tmp_path / "study", random.Random(1)
    for seed in range(3):
        before = [rng.random() < 0.3 for _ in range(50)]
        base = [rng.random() < 0.5 for _ in range(50)]
        tr = list(base)
        for i in [i for i in range(50) if not base[i]][: 5 + seed]:
            tr[i] = True
        for arm, after in (("grpo", base), ("grpo_nokl", base), ("grpo_nokl_tr", base), ("s_grpo_tr", tr)):
            write_run(study, arm, seed, before, after)
    out = write_report(study, order=["grpo", "grpo_nokl", "grpo_nokl_tr", "s_grpo_tr"], figure=False)
    got = {(r["arm"], r["baseline"]): r for r in out["heldout_contrasts"]}
    assert list(got) == [("grpo_nokl_tr", "grpo_nokl"), ("s_grpo_tr", "grpo_nokl_tr")]
    r = got["s_grpo_tr", "grpo_nokl_tr"]
    assert r["after"]["mean"] == pytest.approx(0.12) and r["after"]["sd"] == pytest.approx(0.02)
    assert r["mcnemar"]["b"] == 18 and r["mcnemar"]["c"] == 0
    assert r["reading"] == "higher than grpo_nokl_tr beyond noise"
    assert got["grpo_nokl_tr", "grpo_nokl"]["after"]["mean"] == 0
    md = (study / "study.md").read_text()
    assert "### Contrasts between methods" in md
    assert "| s_grpo_tr − grpo_nokl_tr | S-GRPO's masks and filters, under the trust region | 3 | +0.120 |" in md
    saved = json.loads((study / "study.json").read_text())["heldout_contrasts"]
    assert [(c["arm"], c["baseline"]) for c in saved] == list(got)
    rows = (study / "study_heldout.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 + 3 + 1  # 3 arms x 2 baselines, + the one contrast not among them
    assert rows[-1].startswith("grpo_nokl_tr,s_grpo_tr,3,150,0.12")

    # Holm over the distinct pairs: grpo_nokl - grpo is also grpo - grpo_nokl, grpo_nokl_tr - grpo_nokl is in both the
    # grpo_nokl table and the contrasts: 6 pairs, not 8; the three equal arms have p 1, the three s_grpo_tr pairs the
    # same p (0.12 +- 0.02 a seed, t = 10.39 at df 2: 0.009), times 6, 5 and 4, then the running maximum: 6 p = 0.055
    # for all three, so none stays below 0.05
    mult = out["heldout_multiplicity"]
    assert len(mult) == 6 and [m["p"] for m in mult] == sorted(m["p"] for m in mult)
    small = [m for m in mult if "s_grpo_tr" in (m["arm"], m["baseline"])]
    p = r["after"]["p"]
    assert len(small) == 3 and all(m["p"] == pytest.approx(p) and m["p_holm"] == pytest.approx(6 * p) for m in small)
    assert [m["p_holm"] for m in mult[3:]] == [1.0, 1.0, 1.0]
    assert "### Multiplicity: Holm's correction" in md and "This report tests 6 distinct pairs" in md
    assert f"| s_grpo_tr − grpo | {p:.3f} | {6 * p:.3f} | no |" in md and round(6 * p, 3) == 0.055
    assert "0 of 6 differences stay beyond noise after the correction." in md
    assert json.loads((study / "study.json").read_text())["heldout_multiplicity"][0]["p_holm"] == pytest.approx(6 * p)
    assert rows[0].endswith(",reading,p_t_holm") and float(rows[-1].split(",")[-1]) == pytest.approx(6 * p)

    calib = tmp_path / "calib"  # grpo and grpo_nokl only (the calibration studies): no contrast anywhere
    for seed in range(2):
        write_run(calib, "grpo", seed, [False] * 4, [True, False, False, False])
        write_run(calib, "grpo_nokl", seed, [False] * 4, [True, True, False, False])
    out = write_report(calib, figure=False)
    assert out["heldout_contrasts"] == [] and "Contrasts" not in (calib / "study.md").read_text()
    assert "heldout_contrasts" not in json.loads((calib / "study.json").read_text())
    # one pair (tested both ways): a family of one, no Holm section or key; its csv rows carry its own p
    assert len(out["heldout_multiplicity"]) == 1 and "Holm" not in (calib / "study.md").read_text()
    assert "heldout_multiplicity" not in json.loads((calib / "study.json").read_text())


def test_report_finds_no_difference_within_noise(tmp_path):
    from study.report import write_report

    study = make_study(tmp_path / "study", gain=0, noise=[3, -2, 1, -3, 1])  # mean 0, SD 0.025
    out = write_report(study, order=["grpo", "grpo_nokl", "s_grpo"], figure=False)
    r = out["heldout_tests"]["grpo"]["s_grpo"]
    assert r["after"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert r["after"]["ci"][0] < 0 < r["after"]["ci"][1] and r["after"]["p"] > 0.5
    assert r["mcnemar"]["p_exact"] > 0.5 and r["bootstrap_ci"][0] < 0 < r["bootstrap_ci"][1]
    assert r["reading"] == "within noise"
    nokl = out["heldout_tests"]["grpo"]["grpo_nokl"]
    assert nokl["after"]["mean"] == 0 and nokl["mcnemar"]["b"] == nokl["mcnemar"]["c"]
    assert "**within noise**" in (study / "study.md").read_text()


def test_report_refuses_heldout_that_disagrees_with_summary(tmp_path, capsys):
    from study.__main__ import main
    from study.report import write_report

    study = tmp_path / "study"
    for seed in range(2):
        write_run(study, "grpo", seed, [False] * 4, [True, False, False, False])
    write_run(study, "s_grpo", 0, [False] * 4, [True, True, False, False])
    write_run(study, "s_grpo", 1, [False] * 4, [True, True, False, False], summary_after=0.75)  # file says 0.5
    with pytest.raises(ValueError, match="disagree"):
        write_report(study, figure=False)
    assert main(["--report", str(study), "--no-figure"]) == 2
    err = capsys.readouterr().err
    assert "s_grpo/seed1" in err and "0.5" in err and "0.75" in err


def test_a_study_whose_report_is_refused_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """At the end of a study (not --report) a report the run files refuse is one line naming the run and the runs
    are kept, exit 2; a results folder the report cannot be written into is refused the same way by --report. Before:
    a traceback (ValueError from the end of the study, PermissionError from --report)."""
    import study.__main__ as study_main

    study = tmp_path / "study"
    for seed in range(2):
        write_run(study, "grpo", seed, [False] * 4, [True, False, False, False])
        write_run(
            study, "grpo_nokl", seed, [False] * 4, [True, True, False, False], summary_after=0.75 if seed else None
        )
    monkeypatch.setattr(study_main, "run_grid", lambda specs, *a, **k: ([s.key for s in specs], []))
    argv = ["--arms", "grpo,grpo_nokl", "--seeds", "0,1", "--out", str(study), "--work", str(tmp_path / "w")]
    assert study_main.main([*argv, "--no-figure", "--progress", "false"]) == 2
    err = capsys.readouterr().err
    assert "no report was written" in err and "grpo_nokl/seed1" in err and "Traceback" not in err
    assert len(list(study.glob("runs/*/seed*/summary.json"))) == 4  # nothing lost

    (study / "runs" / "grpo_nokl" / "seed1" / "summary.json").unlink()  # now the report itself is fine ...
    import study.results as results

    def read_only(path, mode="w"):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(results, "atomic_writer", read_only)  # ... but the folder cannot be written
    assert study_main.main(["--report", str(study), "--no-figure"]) == 2
    err = capsys.readouterr().err
    assert f"--report {study}: cannot write the report there (PermissionError: Permission denied)" in err


def test_heldout_problems_must_pair(tmp_path):
    study = tmp_path / "study"
    write_run(study, "grpo", 0, [False] * 3, [True] * 3)
    d = write_run(study, "s_grpo", 0, [False] * 3, [True] * 3)
    lines = (d / "heldout.jsonl").read_text().replace('"1 + 1"', '"7 * 7"')
    (d / "heldout.jsonl").write_text(lines)
    from study.report import write_report

    with pytest.raises(ValueError, match="cannot be paired"):
        write_report(study, figure=False)
    (d / "heldout.jsonl").write_text('{"id": 0, "q": "x", "before": 1, "after": true}\n')
    with pytest.raises(ValueError, match="line 1: field.s. before"):
        write_report(study, figure=False)


def test_a_study_without_heldout_files_gets_no_new_section(tmp_path):
    from study.report import write_report

    study = make_study(tmp_path / "study", gain=5, noise=[0, 0, 0], seeds=3)
    for p in study.glob("runs/*/seed*/heldout.jsonl"):
        p.unlink()
    out = write_report(study, figure=False)
    assert out["heldout_tests"] == {} and "paired tests" not in (study / "study.md").read_text()
    assert "heldout_tests" not in json.loads((study / "study.json").read_text())
    assert not (study / "study_heldout.csv").exists()


def test_mechanism_table_only_for_runs_that_logged_it(tmp_path):
    from study.report import write_report
    from study.stability import MECHANISM_FIELDS

    study = make_study(tmp_path / "study", gain=4, noise=[0, 1, -1], seeds=3)
    for p in study.glob("runs/s_grpo/seed*/metrics.jsonl"):  # s_grpo's filter touched 20% of tokens, 5% of completions
        recs = [json.loads(line) for line in p.read_text().splitlines()]
        recs = [r if "event" in r else r | {"masked_frac": 0.2, "filtered_frac": 0.05} for r in recs]
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = write_report(study, order=["grpo", "grpo_nokl", "s_grpo"], figure=False)
    g, s = out["arms"]["grpo"], out["arms"]["s_grpo"]
    assert g["update_norm_mean"]["mean"] == pytest.approx(0.035) and g["update_norm_mean"]["se"] == 0  # 0.01 x 1..6
    assert g["ld_correct_shared_mean"]["mean"] == pytest.approx(-0.07)
    assert g["ld_wrong_mean"]["mean"] == pytest.approx(-0.1)
    assert g["ld_displaced_frac_mean"]["n"] == 0 and g["masked_frac_mean"]["n"] == 0  # never logged: n/a, not 0
    assert s["masked_frac_mean"]["mean"] == pytest.approx(0.2)
    assert s["filtered_frac_mean"]["mean"] == pytest.approx(0.05)
    md = (study / "study.md").read_text()
    assert "## Mechanisms" in md
    shared = "| 3 | 0.035 +- 0.000 | -0.0700 +- 0.0000 | n/a | +0.1000 +- 0.0000 | -0.1000 +- 0.0000 |"
    assert f"| grpo {shared} n/a | n/a |" in md
    assert f"| s_grpo {shared} 0.200 +- 0.000 | 0.050 +- 0.000 |" in md

    plain = tmp_path / "plain"  # runs without --log-mechanism: no section, no keys (older reports stay byte for byte)
    for seed in range(2):
        for arm in ("grpo", "s_grpo"):
            write_run(plain, arm, seed, [False] * 10, [True] * 5 + [False] * 5)
    out = write_report(plain, figure=False)
    assert "## Mechanisms" not in (plain / "study.md").read_text()
    assert not {f"{k}_mean" for k in MECHANISM_FIELDS} & (set(out["arms"]["grpo"]) | set(out["runs"][0]))


def test_figures_and_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from study.curves import curve_data, step_series
    from study.report import write_report

    recs = [{"step": s, "kl_from_init": {2: 0.2, 5: 0.8}.get(s)} for s in range(1, 7)]
    assert step_series(recs, "kl_from_init") == {2: 0.2, 5: 0.8}
    assert step_series(recs, "kl_from_init", interpolate=True) == pytest.approx({2: 0.2, 3: 0.4, 4: 0.6, 5: 0.8})
    study = make_study(tmp_path / "study", gain=4, noise=[0, 1, -1], seeds=3)
    data = curve_data(study, ["grpo", "s_grpo"])
    assert {"entropy_mean", "kl_from_init", "grad_norm", "reward_mean", "update_norm", "ld_correct_shared"} <= set(data)
    b = data["grad_norm"]["grpo"]  # seeds 0, 1, 2: 0.5, 0.6, 0.7 -> mean 0.6, SE 0.1 / sqrt(3)
    assert b["n"] == 3 and b["mean"][0] == pytest.approx(0.6) and b["hi"][0] == pytest.approx(0.6 + 0.1 / math.sqrt(3))
    assert data["kl_from_init"]["grpo"]["steps"] == [2, 3, 4, 5, 6]
    write_report(study, order=["grpo", "grpo_nokl", "s_grpo"], figure=True)
    for name in ("study.png", "study_forest.png", "study_curves.png"):
        assert (study / name).stat().st_size > 10_000, name


def test_run_files_are_published_with_heldout_when_present(tmp_path):
    from study.results import copy_run_files, is_finished, read_heldout

    src = write_run(tmp_path / "work", "grpo", 0, [False, True], [True, True])
    copy_run_files(src, tmp_path / "out" / "a")
    assert read_heldout(tmp_path / "out" / "a")[1]["after"] is True and is_finished(tmp_path / "out" / "a")
    (src / "heldout.jsonl").unlink()  # a run made before heldout.jsonl existed
    copy_run_files(src, tmp_path / "out" / "b")
    assert read_heldout(tmp_path / "out" / "b") is None and is_finished(tmp_path / "out" / "b")
    assert sorted(p.name for p in (tmp_path / "out" / "b").iterdir()) == ["config.json", "metrics.jsonl",
                                                                           "summary.json"]  # fmt: skip


# ----------------------------------------------------------------------------------------------- memory on paper


def test_memory_on_paper_counts_and_shares(tmp_path):
    from benchmarks import memory_on_paper as mp

    counts = {m.name: m.params() for m in mp.MODELS}
    assert counts["SmolLM2-135M"] == mp.SMOLLM2_MEASURED == 134_515_008  # the loaded model's count
    assert counts["Qwen2.5-1.5B"] == 1_543_714_304 and counts["Qwen2.5-7B"] == 7_615_616_512  # "1.54B", "7.61B"
    assert mp.budget(False) == {"policy": 12, "with_ref": 14, "share": pytest.approx(1 / 7)}
    assert mp.budget(True)["share"] == pytest.approx(1 / 9)
    out = tmp_path / "m.md"
    assert mp.main(["--out", str(out)]) == 0
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "memory_on_paper.md"
    assert out.read_text() == committed.read_text()  # the committed table is what the script writes


def test_a_full_disk_during_the_report_leaves_each_file_whole(tmp_path):
    """Issue 39 (f): a write that fails part-way (here the file-size limit, as a full disk would) leaves each report
    file as it was, says so in one line, and leaves no temporary file. Before: study.csv and study.md were written in
    place, and the failure left them cut at the limit."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    from study.__main__ import main

    study = tmp_path / "study"
    for seed in range(2):
        write_run(study, "grpo", seed, [False] * 4, [True, False, False, False])
        write_run(study, "grpo_nokl", seed, [False] * 4, [True, True, False, False])
    assert main(["--report", str(study), "--no-figure"]) == 0
    names = ("study.csv", "study.md", "study.json", "study_heldout.csv")
    before = {n: (study / n).read_bytes() for n in names}
    limit = min(len(b) for b in before.values()) // 2

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as ENOSPC would
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "study", "--report", str(study), "--no-figure"], cwd=root, env=env,
                          preexec_fn=small_disk, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the report there" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert {n: (study / n).read_bytes() for n in names} == before
    assert not list(study.glob("*.tmp"))
