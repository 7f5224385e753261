"""The v2 study's pre-registered machinery: transient vs persistent collapse (study/collapse.py), a plan's rules
decided from run facts (study/decide.py, study/prereg.py: equivalence, Holm over contrasts and Fisher
tests together, screens that extend an arm's seeds, interim readings), the report's section, and adopting published
runs under another arm name after checking their configuration (study/adopt.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
from test_study_plancheck import plan_study
from test_train_study_stats import write_run

from study import stats
from study.collapse import classify
from study.decide import evaluate
from study.prereg import PHASE1, PHASE2, PHASE2B, PLANS, Contrast, Fisher, Hypothesis, Plan, Rule
from study.stability import CollapseRules

RULES = CollapseRules(window=3)


def steps(n: int, dead: range = range(0)) -> list[dict]:
    """n step records; in the steps of `dead` no completion is right and every group is constant (signal death)."""
    return [{"step": s, "accuracy": 0.0 if s in dead else 0.4, "zero_var_frac": 1.0 if s in dead else 0.3,
             "entropy_mean": 0.5, "format_frac": 0.9} for s in range(1, n + 1)]  # fmt: skip


def summary(before: float, after: float) -> dict:
    return {"before": {"eval_acc": before}, "after": {"eval_acc": after}}


# ------------------------------------------------------------------------------------------------------ collapse


def test_transient_and_persistent_collapse():
    early = classify(steps(60, range(5, 8)), summary(0.1, 0.4), RULES)  # one window early, the reward came back
    assert early["events"]["signal_death"] == [7] and early["transient"] and not early["persistent"]
    late = classify(steps(60, range(50, 53)), summary(0.1, 0.4), RULES)  # step 52 is among the last 10 (51-60)
    assert late["persistent"] and late["late_events"] and not late["transient"]
    edge = classify(steps(60, range(48, 51)), summary(0.1, 0.4), RULES)  # its event at step 50: just outside
    assert edge["events"]["signal_death"] == [50] and edge["transient"]
    flat = classify(steps(60), summary(0.2, 0.2), RULES)  # no event, but no better than it started
    assert flat["persistent"] and flat["no_gain"] and not flat["late_events"] and not flat["transient"]
    fine = classify(steps(60), summary(0.2, 0.3), RULES)
    assert not fine["persistent"] and not fine["transient"]
    with pytest.raises(ValueError, match="no step records"):
        classify([{"step": 0, "event": "eval"}], summary(0.1, 0.2), RULES)


# ------------------------------------------------------------------------------------------------------ decisions


def run(after: float, persistent: bool = False, clip: bool = False, term: bool = False) -> dict:
    return {"after": after, "persistent": persistent, "transient": False, "clip_active": clip, "term_active": term}


SMALL = Plan(
    name="t",
    arms={"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)},
    contrasts=(Contrast("C", (("a", 1.0), ("b", -1.0)), (0, 1, 2, 3), "a - b"),),
    fishers=(Fisher("F", "a", "b", "collapse"),),
    hypotheses=(
        Hypothesis(
            "H",
            "a vs b",
            (
                Rule("same", (("equivalent", "C"),)),
                Rule("a better", (("higher", "C"),)),
                Rule("b better", (("lower", "C"),)),
            ),
        ),
    ),  # fmt: skip
    adopted={},
)


def test_equivalence_fires_on_a_90_percent_interval_inside_the_margin():
    data = {
        "a": {s: run(0.5 + d) for s, d in enumerate([0.02, -0.01, 0.03, 0.0])},
        "b": {s: run(0.5) for s in range(4)},
    }
    r = evaluate(SMALL, data)
    c = r["contrasts"]["C"]
    assert c["ci90"] == pytest.approx(stats.paired_t([0.02, -0.01, 0.03, 0.0], alpha=0.10)["ci"])
    assert -0.10 < c["ci90"][0] and c["ci90"][1] < 0.10
    (h,) = r["hypotheses"]
    assert h["decision"] == "same" and not h["interim"] and h["rules"][0]["fires"]


def test_higher_uses_holm_over_contrasts_and_fisher_tests_together():
    diffs = [0.30, 0.25, 0.35, 0.28]
    data = {"a": {s: run(0.5 + d) for s, d in enumerate(diffs)},
            "b": {s: run(0.5, persistent=s < 3) for s in range(4)}}  # fmt: skip
    r = evaluate(SMALL, data)
    p_t, p_f = stats.paired_t(diffs)["p"], stats.fisher_exact(0, 4, 3, 4)
    assert r["family"] == ["C", "F"] and r["fishers"]["F"]["p"] == p_f
    assert r["holm"] == dict(zip(["C", "F"], stats.holm([p_t, p_f])))
    assert r["hypotheses"][0]["decision"] == "a better"
    assert r["arms"]["b"] == {"persistent": 3, "transient": 0, "runs": 4, "planned": 4, "interim": False}


def test_fewer_seeds_than_planned_is_interim_and_no_decision():
    data = {"a": {s: run(0.8) for s in range(3)}, "b": {s: run(0.5 + 0.01 * s) for s in range(4)}}
    r = evaluate(SMALL, data)
    h = r["hypotheses"][0]
    assert r["contrasts"]["C"]["interim"] and r["contrasts"]["C"]["seeds"] == [0, 1, 2]
    assert h["interim"] and h["decision"] == "a better"  # what would fire now, flagged interim


def test_nothing_fires_inconclusive():
    diffs = [0.2, -0.15, 0.1, -0.05]  # wide interval over 0: neither equivalent nor different
    data = {"a": {s: run(0.5 + d) for s, d in enumerate(diffs)}, "b": {s: run(0.5) for s in range(4)}}
    h = evaluate(SMALL, data)["hypotheses"][0]
    assert h["decision"] is None and not h["interim"] and not any(r["fires"] for r in h["rules"])


def test_a_screen_extends_an_arm_and_admits_its_confirmation_to_the_family():
    plan = PHASE2
    cap, m = "grpo_nokl_tr_lr2.5e-4", "dppo_tv_lr2.5e-4"
    rng = random.Random(1)
    data = {cap: {s: run(0.5 + 0.02 * rng.random()) for s in range(10)}, m: {s: run(0.49) for s in range(5)}}
    r = evaluate(plan, data)
    screen = {d["key"]: d for d in r["hypotheses"]}
    assert screen["S2"]["decision"] == f"{m} passes the screen" and not screen["S2"]["interim"]
    assert r["arms"][m]["planned"] == 10 and r["arms"][m]["interim"]  # seeds 5-9 now planned, not run
    assert screen["K2"]["interim"] and "K2" in r["family"] and "F2" in r["family"]
    # the methods without runs: their screens cannot decide, their confirmations wait (interim), out of the family
    assert screen["S3"]["decision"] is None and screen["S3"]["interim"]
    assert screen["K3"]["not_run"] and screen["K3"]["interim"] and "K3" not in r["family"]
    # a method clearly worse than the cap is screened out, for good: 5 planned seeds, no confirmation
    data[m] = {s: run(0.2) for s in range(5)}
    r = evaluate(plan, data)
    screen = {d["key"]: d for d in r["hypotheses"]}
    assert screen["S2"]["decision"] is None and not screen["S2"]["interim"] and r["arms"][m]["planned"] == 5
    assert screen["K2"]["not_run"] and not screen["K2"]["interim"] and "K2" not in r["family"]


CAP25, DPPO, CISPO = "grpo_nokl_tr_lr2.5e-4", "dppo_tv_lr2.5e-4", "cispo_lr2.5e-4"


def test_a_confirmation_stays_interim_while_a_screen_may_still_add_tests_to_its_family():
    # DPPO passed its screen and has all 10 seeds, clearly above the cap; CISPO's screen has 3 of its 5 runs and would
    # pass, adding K3 and F3 to the Holm family: K2's Holm p is not final until every screen has decided (it was
    # printed as a final "beats the cap" here, with a family of K2 and F2 only)
    rng = random.Random(3)
    data = {CAP25: {s: run(0.40 + 0.01 * rng.random()) for s in range(10)},
            DPPO: {s: run(0.60 + 0.01 * rng.random()) for s in range(10)},
            CISPO: {s: run(0.41) for s in range(3)}}  # fmt: skip
    r = evaluate(PHASE2, data)
    d = {h["key"]: h for h in r["hypotheses"]}
    assert d["S2"]["decision"] == f"{DPPO} passes the screen" and not d["S2"]["interim"] and d["S3"]["interim"]
    assert d["K2"]["decision"] == f"{DPPO} beats the cap" and d["K2"]["interim"] and r["family_interim"]
    # once every screen has decided, the family is complete and so is the decision
    data[CISPO] |= {3: run(0.1, persistent=True), 4: run(0.1, persistent=True)}  # 2 of 5 collapse: fails
    for arm in ("grpo_nokl_ppo2_lr2.5e-4", "clip_cov_lr2.5e-4", "kl_cov_lr2.5e-4"):
        data[arm] = {s: run(0.05, persistent=True) for s in range(5)}
    r = evaluate(PHASE2, data)
    d = {h["key"]: h for h in r["hypotheses"]}
    assert r["family"] == ["K2", "F2"] and not r["family_interim"]
    assert d["K2"]["decision"] == f"{DPPO} beats the cap" and not d["K2"]["interim"]
    assert r["contrasts"]["K3"]["not_run"] == "S3" and r["fishers"]["F3"]["not_run"] == "S3"
    assert r["contrasts"]["K2"]["not_run"] is None


def test_a_screen_mean_exactly_at_its_threshold_passes():
    # five k/500 differences whose exact mean is -0.10 (-250/2500), which floats compute as -0.10000000000000002: the
    # plan's ">= -0.10" holds (the screen failed on the float before)
    m, cap = [11, 173, 352, 151, 22], [122, 273, 293, 133, 138]
    assert sum(a - b for a, b in zip(m, cap)) == -250
    data = {CAP25: {s: run(k / 500) for s, k in enumerate(cap)}, DPPO: {s: run(k / 500) for s, k in enumerate(m)}}
    s2 = {h["key"]: h for h in evaluate(PHASE2, data)["hypotheses"]}["S2"]
    assert s2["decision"] == f"{DPPO} passes the screen" and not s2["interim"]
    data[DPPO][0] = run(10 / 500)  # one problem fewer: -0.1004, below
    s2 = {h["key"]: h for h in evaluate(PHASE2, data)["hypotheses"]}["S2"]
    assert s2["decision"] is None and not s2["interim"]


def test_an_equivalence_on_complete_data_is_final_though_a_later_rule_reads_an_interim_family():
    plan = dataclasses.replace(
        SMALL, contrasts=(*SMALL.contrasts, Contrast("D", (("a", 1.0), ("b", -1.0)), (0, 1, 2, 3, 4), "a - b, 5")),
        arms={"a": (0, 1, 2, 3, 4), "b": (0, 1, 2, 3, 4)})  # fmt: skip
    data = {"a": {s: run(0.5 + d) for s, d in enumerate([0.02, -0.01, 0.03, 0.0])},
            "b": {s: run(0.5) for s in range(4)}}  # fmt: skip
    r = evaluate(plan, data)  # seed 4 missing: D, and so the family, is interim; C (seeds 0-3) is complete
    assert r["family_interim"] and not r["contrasts"]["C"]["interim"]
    (h,) = r["hypotheses"]
    assert h["decision"] == "same" and not h["interim"]  # rules 2 and 3 (Holm) cannot change what rule 1 decided


def test_the_screen_report_names_what_did_not_pass_and_what_each_arm_cost():
    from study.decide import plan_markdown

    data = {CAP25: {s: run(0.5) | {"step_s": 20.0} for s in range(10)},
            DPPO: {s: run(0.2) | {"step_s": 22.0} for s in range(5)}}  # fmt: skip
    manifest = {"runs": {f"{DPPO}/seed{s}": {"wall_s": 1800.0} for s in range(5)}}
    md = plan_markdown(PHASE2, evaluate(PHASE2, data), data, manifest)
    assert f"**Decision: no rule fired: {DPPO} does not pass and stays at seeds 0-4.**" in md
    assert f"| K2 | confirmation: {DPPO} vs the cap, seeds 0-9 | not run: S2 did not pass |" in md
    assert f"| F2 | persistent collapse: {DPPO} vs the cap, seeds 0-9 | not run: S2 did not pass |" in md
    assert f"| {DPPO} | 5 | 22.00 | 30.0 |" in md and f"| {CAP25} | 10 | 20.00 | n/a |" in md
    assert "| cispo_lr2.5e-4 | 0 | n/a | n/a |" in md


def test_the_ppo_arm_must_have_clipped_to_pass():
    cap, m = "grpo_nokl_tr_lr2.5e-4", "grpo_nokl_ppo2_lr2.5e-4"
    data = {cap: {s: run(0.5) for s in range(10)}, m: {s: run(0.5, clip=s != 3) for s in range(5)}}
    s1 = evaluate(PHASE2, data)["hypotheses"][0]
    assert s1["key"] == "S1" and s1["decision"] is None
    assert "ratio clip fired in 4 of 5 runs" in s1["rules"][0]["conditions"][2]["text"]


def test_phase2b_screens_need_the_term_to_have_acted_not_the_ppo_clip():
    """Phase 2b's arms have "ppo2" in their names but a field preset's term: the screen reads policy_term_frac
    (term_active), never PPO's clip_frac (which for these presets is PPO's band, not what the term did)."""
    cap, m = "grpo_nokl_tr_lr2.5e-4", "cispo_ppo2_lr2.5e-4"
    data = {cap: {s: run(0.5) for s in range(10)}, m: {s: run(0.5, term=s != 2) for s in range(5)}}
    s2 = {h["key"]: h for h in evaluate(PHASE2B, data)["hypotheses"]}["S2"]
    texts = [c["text"] for c in s2["rules"][0]["conditions"]]
    assert s2["decision"] is None and "the policy term acted in 4 of 5 runs of cispo_ppo2_lr2.5e-4" in texts
    assert not any("ratio clip" in t for t in texts)
    data[m] = {s: run(0.5, term=True) for s in range(5)}
    s2 = {h["key"]: h for h in evaluate(PHASE2B, data)["hypotheses"]}["S2"]
    assert s2["decision"] == f"{m} passes the screen"
    # phase 2's PPO arm still reads the clip, its field arms no activity condition at all (unchanged)
    assert {c[0] for h in PHASE2.hypotheses for r in h.rules for c in r.when} >= {"clip_active"}
    assert "term_active" not in {c[0] for h in PHASE2.hypotheses for r in h.rules for c in r.when}


def test_run_facts_read_whether_the_policy_term_acted(tmp_path):
    from study.decide import run_facts

    for name, frac, want in (("on", {3: 0.02}, True), ("off", {}, False), ("ppo", None, False)):
        d = write_run(tmp_path, name, 0, [False, True], [True, True])
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        if frac is not None:  # a field preset's run: the key in every step record
            recs = [r if "event" in r else r | {"policy_term_frac": frac.get(r["step"], 0.0)} for r in recs]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        assert run_facts(d)["term_active"] is want, name


def test_phase1_plan_is_consistent():
    assert set(PLANS) == {"v2-phase1", "v2-phase2", "v2-phase2b"}
    from study.grid import RESEARCH_ARMS

    for plan in (PHASE1, PHASE2, PHASE2B):
        keys = {c.key for c in plan.contrasts} | {h.key for h in plan.hypotheses}
        for c in plan.contrasts:
            assert all(a in plan.arms for a, _ in c.weights)
            assert all(set(c.seeds) <= set(plan.planned(a, {h.key: r.decision for h in plan.hypotheses
                                                               for r in h.rules})) for a, _ in c.weights)  # fmt: skip
        for h in plan.hypotheses:
            for rule in h.rules:
                for cond in rule.when:
                    assert cond[1] in keys or cond[1] in plan.arms, cond
    assert all(a in RESEARCH_ARMS for a in PHASE1.arms)
    assert PHASE2.arms["grpo_nokl_ppo2_lr2.5e-4"] == tuple(range(5)) and "grpo_nokl_ppo2_lr2.5e-4" in RESEARCH_ARMS
    assert all(a in RESEARCH_ARMS for a in PHASE2B.arms)
    for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov"):  # --preset M --lr 2.5e-4 --ppo-epochs 2, nothing else
        arm = RESEARCH_ARMS[f"{m}_ppo2_lr2.5e-4"]
        assert (arm.preset, arm.loss, arm.train) == (m, "", {"lr": "2.5e-4", "ppo_epochs": "2"})


# ------------------------------------------------------------------------------------------------------ report


def test_a_planned_study_prints_which_rule_fired_and_says_interim(tmp_path):
    from study.report import write_report

    study = plan_study(tmp_path, {arm: list(PHASE1.arms[arm][:3]) for arm in PHASE1.arms})  # 3 planned seeds: interim
    write_report(study, figure=False)
    md = (study / "study.md").read_text()
    assert "## Pre-registered analysis (plan `v2-phase1`" in md
    assert md.split("\n\n")[1].startswith("**INTERIM: 27 of 85 planned runs finished** (plan `v2-phase1`)")
    assert f"**INTERIM: {3 * 8 + 3} of {10 * 8 + 5} planned runs finished.**" in md
    assert md.count("**INTERIM, not a decision**") == 5 and "Decision:" not in md
    assert "| C1 | the cap at 1.5e-4 vs the lr with the cap's path length, no cap | 3 / 10 (interim) |" in md
    assert "### Against" not in md  # the unplanned per-baseline tests are not printed for a planned study
    got = json.loads((study / "study.json").read_text())["preregistered"]
    assert got["plan"] == "v2-phase1" and [h["key"] for h in got["hypotheses"]] == ["H1", "H2", "H3", "H4", "H5"]


# ------------------------------------------------------------------------------------------------------ adopt


def _published(root: Path, arm: str, seed: int, config: dict) -> Path:
    d = write_run(root, arm, seed, [False] * 4, [True, False, True, True])
    (d / "config.json").write_text(json.dumps({"train": config}))
    return d


def test_adopt_checks_the_configuration_then_copies(tmp_path):
    from study.adopt import adopt, main
    from study.grid import REGIMES, RESEARCH_ARMS, RunSpec

    overrides = REGIMES["decisive"]
    spec = RunSpec(RESEARCH_ARMS["grpo_nokl_tr_lr1.5e-4"], 0, dict(overrides), Path("w"), Path("r"))
    good = json.loads(json.dumps(dataclasses.asdict(spec.config())))
    src = tmp_path / "decisive"
    _published(src, "grpo_nokl_tr", 0, good | {"output_dir": "/elsewhere", "threads": 1})
    _published(src, "grpo_nokl_tr", 1, good | {"seed": 1, "lr": 1e-4})  # another lr: not this arm
    dst = tmp_path / "v2-phase1"
    with pytest.raises(ValueError, match=r"seed1 is not what grpo_nokl_tr_lr1.5e-4 runs .*lr: 0.0001 != 0.00015"):
        adopt(src, "grpo_nokl_tr", dst, "grpo_nokl_tr_lr1.5e-4", [0, 1], overrides)
    assert not dst.exists()  # nothing copied when one run is refused
    assert main(["--from", str(src), "--arm", "grpo_nokl_tr", "--to", str(dst), "--as", "grpo_nokl_tr_lr1.5e-4",
                 "--seeds", "0"]) == 0  # fmt: skip
    copied = dst / "runs" / "grpo_nokl_tr_lr1.5e-4" / "seed0"
    for name in ("config.json", "metrics.jsonl", "summary.json", "heldout.jsonl"):
        assert (copied / name).read_bytes() == (src / "runs" / "grpo_nokl_tr" / "seed0" / name).read_bytes()
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["overrides"] == overrides and manifest["regime"] == "v2-phase1"
    assert manifest["runs"]["grpo_nokl_tr_lr1.5e-4/seed0"]["adopted_from"] == "decisive/grpo_nokl_tr/seed0"
    assert manifest["arms"]["grpo_nokl_tr_lr1.5e-4"]["train"] == {"trust_region": "0.1", "lr": "1.5e-4"}
    with pytest.raises(ValueError, match="its overrides are"):
        adopt(src, "grpo_nokl_tr", dst, "grpo_nokl_tr_lr1.5e-4", [0], {**overrides, "max_steps": "5"})
    assert math.isfinite(json.loads((copied / "summary.json").read_text())["after"]["eval_acc"])


def test_adopt_accepts_a_field_added_after_the_run_only_at_its_default(tmp_path):
    # Phase 1's runs (made at the prereg tag) lack the sampler fields added since (top_k, min_p, tis_*): adopting
    # them into phase 2 must not fail on a field the arm leaves at its default, and must say which ones were absent.
    from study.adopt import adopt
    from study.grid import REGIMES, RESEARCH_ARMS, RunSpec

    overrides = REGIMES["decisive"]
    spec = RunSpec(RESEARCH_ARMS["grpo_nokl_tr_lr2.5e-4"], 0, dict(overrides), Path("w"), Path("r"))
    old = json.loads(json.dumps(dataclasses.asdict(spec.config())))
    for name in ("top_k", "min_p"):
        del old[name]
    src = tmp_path / "v2-phase1"
    _published(src, "grpo_nokl_tr_lr2.5e-4", 0, old)
    dst = tmp_path / "v2-phase2"
    assert adopt(src, "grpo_nokl_tr_lr2.5e-4", dst, "grpo_nokl_tr_lr2.5e-4", [0], overrides) == [
        "grpo_nokl_tr_lr2.5e-4/seed0"
    ]
    entry = json.loads((dst / "manifest.json").read_text())["runs"]["grpo_nokl_tr_lr2.5e-4/seed0"]
    assert entry["absent_at_source"] == ["min_p", "top_k"]
    # an arm that sets such a field away from its default is not what the older run computed
    with pytest.raises(ValueError, match=r"top_k: '\(absent\)' != 5"):
        arm = "grpo_nokl_tr_lr2.5e-4"
        adopt(src, arm, tmp_path / "other", arm, [0], {**overrides, "top_k": "5"})
