"""A pre-registered study's runs are checked before its plan reads them (study/plancheck.py): each run is of the
study's regime and arm, trained every step, has held-out accuracies before and after that its heldout.jsonl confirms,
and the runs of one seed saw the same held-out problems; runs of seeds outside the plan are left out of the report's
tables and named (study/decide.py, in_plan). Each case was accepted silently before (a review of 2026-11-30)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
from test_train_study_stats import write_run

from study.grid import ARMS, RESEARCH_ARMS, RunSpec
from study.plancheck import check_plan_runs
from study.prereg import PHASE1
from study.results import finished_runs, load_run
from study.trainer import dumps

OVERRIDES = {"max_steps": "6", "eval_problems": "8", "difficulty": "2,3,5"}
ARM_A, ARM_B = "grpo_nokl_tr_lr1.5e-4", "grpo_nokl_lr7.5e-5"  # C1's two arms, seeds 0-9 planned


def plan_run(study: Path, arm: str, seed: int, rng: random.Random, overrides: dict = OVERRIDES) -> Path:
    """A finished run as the study's runner leaves it: write_run's files, the config.json its spec runs under
    `overrides`, and held-out questions that depend on the seed (as the trainer's draw does)."""
    before, after = [rng.random() < 0.2 for _ in range(8)], [rng.random() < 0.5 for _ in range(8)]
    d = write_run(study, arm, seed, before, after)
    spec = RunSpec({**ARMS, **RESEARCH_ARMS}[arm], seed, dict(overrides), Path("w"), d)
    (d / "config.json").write_text(json.dumps({"train": json.loads(dumps(dataclasses.asdict(spec.config())))}))
    lines = [json.loads(x) for x in (d / "heldout.jsonl").read_text().splitlines()]
    (d / "heldout.jsonl").write_text("".join(json.dumps(x | {"q": f"{x['id']} + {seed}"}) + "\n" for x in lines))
    return d


def plan_study(root: Path, arms: dict[str, list[int]], overrides: dict = OVERRIDES) -> Path:
    study = root / "v2-phase1"
    rng = random.Random(0)
    for arm, seeds in arms.items():
        for seed in seeds:
            plan_run(study, arm, seed, rng, overrides)
    (study / "manifest.json").write_text(json.dumps({"regime": "v2-phase1", "overrides": overrides}))
    return study


def check(study: Path) -> None:
    dirs = finished_runs(study)
    check_plan_runs(json.loads((study / "manifest.json").read_text()), dirs, [load_run(p) for p in dirs])


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def edit_steps(path: Path, fn) -> None:
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in fn(recs)))


@pytest.fixture
def study(tmp_path):
    return plan_study(tmp_path, {ARM_A: [0, 1], ARM_B: [0, 1]})


def test_a_study_as_its_runner_leaves_it_passes(study):
    check(study)


def test_a_run_copied_under_another_seed_is_refused(study):
    """It was paired with the other arm's seed 1 on another held-out set (C1 moved from +0.080 to +0.039)."""
    dst = study / "runs" / ARM_B / "seed1"
    for f in ("heldout.jsonl", "summary.json", "metrics.jsonl"):
        (dst / f).write_text((study / "runs" / ARM_B / "seed0" / f).read_text())
    with pytest.raises(ValueError, match=r"seed1 .*\(seed 1, paired by the plan\): the two runs' held-out problems"):
        check(study)


def test_a_summary_its_heldout_jsonl_does_not_give_is_refused(study):
    edit_json(study / "runs" / ARM_B / "seed0" / "summary.json", lambda s: s["after"].update(eval_acc=0.9))
    with pytest.raises(ValueError, match="heldout.jsonl gives held-out accuracy after .* summary.json says 0.9"):
        check(study)


def test_a_summary_without_the_accuracy_before_is_refused(study):
    """Its no-gain persistent collapse (after <= before) silently disappeared."""
    edit_json(study / "runs" / ARM_A / "seed1" / "summary.json", lambda s: s.pop("before"))
    with pytest.raises(ValueError, match="summary.json: no held-out accuracy before training"):
        check(study)


def test_a_run_of_another_regime_is_refused_naming_what_differs(study):
    edit_json(study / "runs" / ARM_B / "seed1" / "config.json", lambda c: c["train"].update(max_new_tokens=256))
    with pytest.raises(ValueError, match=r"seed1: not a run of this study's regime and arm .*max_new_tokens: 256 != "):
        check(study)


def test_a_run_of_another_arm_setting_is_refused(study):
    edit_json(study / "runs" / ARM_A / "seed0" / "config.json", lambda c: c["train"].update(trust_region=0.2))
    with pytest.raises(ValueError, match=r"trust_region: 0.2 != 0.1"):
        check(study)


def test_a_cut_metrics_jsonl_is_refused(study):
    """The collapse endpoint's "last 10 steps" were measured from wherever the file stopped."""
    edit_steps(study / "runs" / ARM_A / "seed0" / "metrics.jsonl", lambda recs: [r for r in recs if r["step"] <= 4])
    with pytest.raises(ValueError, match=r"metrics.jsonl: 4 step records, steps 1 to 4; .* steps 1 to 6"):
        check(study)


def test_a_step_recorded_twice_is_refused(study):
    edit_steps(study / "runs" / ARM_A / "seed0" / "metrics.jsonl", lambda recs: recs[:3] + recs[2:])
    with pytest.raises(ValueError, match="7 step records"):
        check(study)


@pytest.mark.parametrize(("field", "value"), [("accuracy", math.nan), ("zero_var_frac", None), ("format_frac", "x"),
                                              ("entropy_mean", "0.5")])  # fmt: skip
def test_a_step_field_the_collapse_rules_read_must_be_a_number(study, field, value):
    def bad(recs):
        return [r | {field: value} if r["step"] == 5 and "event" not in r else r for r in recs]

    edit_steps(study / "runs" / ARM_A / "seed1" / "metrics.jsonl", bad)
    with pytest.raises(ValueError, match=f"metrics.jsonl: step 5: {field} is"):
        check(study)


def test_a_step_without_a_loss_may_have_no_entropy(study):
    """The trainer writes NaN (null in strict JSON) for the entropy and the loss of a step that computed no loss; an
    entropy removed from a step that has its loss (it took a run's only late low-entropy event away: persistent
    collapses 6 -> 5) is refused."""
    path = study / "runs" / ARM_A / "seed1" / "metrics.jsonl"
    edit_steps(path, lambda recs: [r | {"entropy_mean": None, "loss": None} if r["step"] == 5 else r for r in recs])
    check(study)
    edit_steps(path, lambda recs: [r | {"loss": 0.25} if r["step"] == 5 and "event" not in r else r for r in recs])
    with pytest.raises(ValueError, match="step 5: entropy_mean is None but its loss 0.25 was computed"):
        check(study)


def test_a_non_finite_accuracy_in_a_summary_is_refused(tmp_path):
    """A NaN eval_acc ended in a traceback deep in the statistics (AttributeError: 'float' object has no attribute
    'numerator')."""
    d = write_run(tmp_path, "grpo", 0, [True, False], [True, True])
    edit_json(d / "summary.json", lambda s: s["after"].update(eval_acc=math.nan))
    with pytest.raises(ValueError, match=r'"after"."eval_acc" is nan, not an accuracy in \[0, 1\]'):
        load_run(d)


def test_runs_outside_the_plan_are_left_out_of_the_tables_and_named(tmp_path):
    """A seed 7 in an arm planned for seeds 0-4 changed the arm's row ("5 / 5" with another mean), without a word."""
    from study.report import write_report

    arm = "grpo_nokl_lr2.5e-4"
    assert PHASE1.arms[arm] == (0, 1, 2, 3, 4)
    study = plan_study(tmp_path, {arm: [0, 1, 7]})
    write_report(study, figure=False)
    md = (study / "study.md").read_text()
    assert f"Finished runs outside the plan, read by no test or table here: {arm}/seed7." in md
    rows = [x for x in md.splitlines() if x.startswith(f"| {arm} | ")]  # the runs' tables, then the plan's
    after = [json.loads((study / "runs" / arm / f"seed{s}" / "summary.json").read_text())["after"]["eval_acc"]
             for s in (0, 1)]  # fmt: skip
    assert rows[0].startswith(f"| {arm} | 2 | ") and f"| {sum(after) / 2:.3f} +- " in rows[0], rows[0]
    plan_row = next(x for x in rows if " / 5" in x)
    assert plan_row.startswith(f"| {arm} | 2 / 5 (interim) |") and f"| {sum(after) / 2:.3f} +- " in plan_row, rows
    assert [r["seed"] for r in json.loads((study / "study.json").read_text())["runs"]] == [0, 1]
