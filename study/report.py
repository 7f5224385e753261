"""A study's report from its committed run files alone: per-run metrics (train/stability.py), per-arm mean +- standard
error over seeds, the paired difference of each arm against a baseline arm (same seeds), written as study.csv,
study.json and study.md next to the runs (and the figure, train/study/figure.py)."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from .curves import plot_curves
from .decide import evaluate, facts, in_plan, interim_banner, plan_markdown
from .figure import plot_forest, plot_study
from .grid import RESEARCH_ARMS
from .heldout import (
    collapse_tests,
    heldout_contrasts,
    heldout_markdown,
    heldout_multiplicity,
    heldout_tests,
    write_heldout_csv,
)
from .plancheck import check_plan_runs
from .prereg import PLANS
from .results import finished_runs, load_run, read_manifest, write_file, write_json
from .stability import RULES

BASELINE = "grpo"
# A study of research arms (variants of S-GRPO, study.grid.RESEARCH_ARMS) is also paired against this arm:
# what a method adds to S-GRPO is its difference from s_grpo, not from grpo
RESEARCH_BASELINE = "s_grpo"

# The table's metrics: (key, column title, format). "higher" / "lower" is not claimed: a stability metric reads
# differently per metric (docs/study.md).
OUTCOME = (
    ("heldout_before", "held-out before", ".3f"),
    ("heldout_after", "held-out after", ".3f"),
    ("heldout_gain", "gain", "+.3f"),
    ("pass@4_after", "pass@4 after", ".2f"),
    ("maj@4_after", "maj@4 after", ".2f"),
    ("step_s_mean", "step s", ".2f"),
    ("tokens_per_s_mean", "tokens/s", ".0f"),
    ("train_peak_mem_mb", "peak MiB (training)", ".0f"),
)
STABILITY = (
    ("grad_norm_mean", "grad norm mean", ".2f"),
    ("grad_norm_max", "grad norm max", ".2f"),
    ("clipped_frac", "clipped", ".2f"),
    ("entropy_start", "H start", ".2f"),
    ("entropy_end", "H end", ".2f"),
    ("entropy_min", "H min", ".2f"),
    ("collapse", "collapse rate", ".2f"),
    ("success_std_2nd_half", "success std (2nd half)", ".3f"),
    ("kl_from_init_end", "KL from init", ".3f"),
)
# --log-mechanism runs only (train/stability.py, MECHANISM_FIELDS): a table when some run has them
MECHANISM = (
    ("update_norm_mean", "update norm", ".3f"),
    ("ld_correct_shared_mean", "LD correct sharing tokens", "+.4f"),
    ("ld_displaced_frac_mean", "displaced frac", ".2f"),
    ("ld_correct_mean", "LD correct", "+.4f"),
    ("ld_wrong_mean", "LD wrong", "+.4f"),
    ("masked_frac_mean", "masked tokens", ".3f"),
    ("filtered_frac_mean", "filtered completions", ".3f"),
)
PAIRED = ("heldout_after", "heldout_gain", "collapse", "grad_norm_mean", "entropy_end", "success_std_2nd_half",
          "kl_from_init_end", "step_s_mean", "train_peak_mem_mb")  # fmt: skip


def _num(x) -> float:
    """A metric as a float: None (strict JSON's NaN) and a missing metric are nan; booleans 0/1."""
    return math.nan if x is None else float(x)


def mean_se(values: list[float]) -> dict:
    """Mean and standard error (sample standard deviation / sqrt(n)) of the finite values; se is nan for n < 2."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "n": 0}
    return {"mean": sum(v) / n, "se": statistics.stdev(v) / math.sqrt(n) if n > 1 else math.nan, "n": n}


def arm_order(runs: list[dict], order: list[str] | None = None) -> list[str]:
    present = {r["arm"] for r in runs}
    first = [a for a in (order or []) if a in present]
    return first + sorted(present - set(first))


def aggregate(runs: list[dict], order: list[str] | None = None) -> dict[str, dict]:
    """{arm: {metric: {mean, se, n}} plus "seeds" and "heldout_after_std_across_seeds"} over the arm's runs."""
    out = {}
    metrics = [k for k, _, _ in OUTCOME + STABILITY + _mechanism(runs)]
    for arm in arm_order(runs, order):
        rows = [r for r in runs if r["arm"] == arm]
        agg = {k: mean_se([_num(r.get(k)) for r in rows]) for k in metrics}
        agg["collapse_runs"] = {name: sum(bool(r[f"collapse_{name}"]) for r in rows) for name in RULES}
        agg["collapse_runs"]["runs"] = len(rows)
        after = [r["heldout_after"] for r in rows if math.isfinite(r["heldout_after"])]
        agg["heldout_after_std_across_seeds"] = statistics.stdev(after) if len(after) > 1 else math.nan
        agg["seeds"] = sorted(r["seed"] for r in rows)
        out[arm] = agg
    return out


def _mechanism(runs: list[dict]) -> tuple:
    """MECHANISM's columns when some run logged the mechanism fields (--log-mechanism), else none."""
    return MECHANISM if any(MECHANISM[0][0] in r for r in runs) else ()


def paired(runs: list[dict], baseline: str = BASELINE, order: list[str] | None = None) -> dict[str, dict]:
    """{arm: {metric: {diff, se, n, significant}}}: the mean over shared seeds of (arm - baseline), its standard error,
    and whether |diff| >= 2 SE (n < 2 or a zero SE with a zero difference: not significant)."""
    base = {r["seed"]: r for r in runs if r["arm"] == baseline}
    out = {}
    for arm in arm_order(runs, order):
        if arm == baseline or not base:
            continue
        rows = {r["seed"]: r for r in runs if r["arm"] == arm}
        seeds = sorted(set(rows) & set(base))
        out[arm] = {}
        for k in PAIRED:
            d = [_num(rows[s].get(k)) - _num(base[s].get(k)) for s in seeds]
            m = mean_se(d)
            sig = m["n"] >= 2 and math.isfinite(m["se"]) and abs(m["mean"]) >= 2 * m["se"] and m["mean"] != 0
            out[arm][k] = {"diff": m["mean"], "se": m["se"], "n": m["n"], "significant": bool(sig)}
    return out


def _num_text(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "n/a (1 seed)"


def _fmt(cell: dict, fmt: str) -> str:
    if cell["n"] == 0 or not math.isfinite(cell["mean"]):
        return "n/a"
    se = f" +- {cell['se']:{fmt.lstrip('+')}}" if math.isfinite(cell["se"]) else ""
    return f"{cell['mean']:{fmt}}{se}"


def _table(aggs: dict, columns) -> list[str]:
    head = "| arm | seeds | " + " | ".join(t for _, t, _ in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for arm, agg in aggs.items():
        cells = [_fmt(agg[k], f) for k, _, f in columns]
        lines.append(f"| {arm} | {len(agg['seeds'])} | " + " | ".join(cells) + " |")
    return lines


def baselines(runs: list[dict]) -> list[str]:
    """The arms the others are paired against: grpo, and s_grpo too when the study has research arms and s_grpo."""
    arms = {r["arm"] for r in runs}
    return [BASELINE] + ([RESEARCH_BASELINE] if RESEARCH_BASELINE in arms and arms & set(RESEARCH_ARMS) else [])


def _paired_table(baseline: str, diffs: dict) -> list[str]:
    titles = {k: t for k, t, _ in OUTCOME + STABILITY}
    fmts = {k: f for k, _, f in OUTCOME + STABILITY}
    lines = [
        "",
        f"## Paired difference against `{baseline}` (same seeds; mean +- SE of arm - {baseline})",
        "",
        "Marked `n.s.` when |difference| < 2 SE (not distinguishable from noise at this number of seeds).",
        "",
        "| arm | " + " | ".join(titles[k] for k in PAIRED) + " |",
        "|" + "---|" * (len(PAIRED) + 1),
    ]
    for arm, row in diffs.items():
        cells = []
        for k in PAIRED:
            c = row[k]
            if c["n"] == 0 or not math.isfinite(c["diff"]):
                cells.append("n/a")
                continue
            f = fmts[k].lstrip("+")
            se = f" +- {c['se']:{f}}" if math.isfinite(c["se"]) else ""
            cells.append(f"{c['diff']:+{f}}{se}" + ("" if c["significant"] else " n.s."))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def markdown(regime: str, manifest: dict, aggs: dict, diffs: dict, runs: list[dict]) -> str:
    """`diffs`: {baseline: paired(runs, baseline)}, one table each (in order)."""
    lines = [
        f"# Study, regime `{regime}`",
        "",
        f"Trainer overrides on every arm: `{json.dumps(manifest.get('overrides', {}))}`. Mean +- standard error over "
        "seeds (sample SD / sqrt(n)). Metric definitions: docs/study.md. Regenerate: "
        f"`python -m train.study --report <this directory>`.",
        "",
        "## Outcome and cost",
        "",
        *_table(aggs, OUTCOME),
        "",
        "## Stability",
        "",
        *_table(aggs, STABILITY),
        "",
        "Collapse events per arm (runs with the event / runs): "
        + "; ".join(
            f"{a}: " + ", ".join(f"{name.replace('_', ' ')} {c[name]}/{c['runs']}" for name in RULES)
            for a, c in ((a, g["collapse_runs"]) for a, g in aggs.items())
        )
        + ".",
        "",
        "Std across seeds of the final held-out accuracy: "
        + ", ".join(f"{a} {_num_text(g['heldout_after_std_across_seeds'])}" for a, g in aggs.items())
        + ".",
    ]
    if _mechanism(runs):
        lines += [
            "",
            "## Mechanisms (`--log-mechanism`; mean over a run's steps, then mean +- SE over seeds)",
            "",
            *_table(aggs, MECHANISM),
            "",
            "Update norm: ||theta - theta_old|| of a step. LD: likelihood displacement, the mean per-token log-prob "
            "change over a step of its correct completions that share a token with a wrong one of their group, of all "
            "correct and of all wrong completions; displaced frac: the fraction of those sharing correct completions "
            "whose log-prob fell. Masked tokens: completion tokens with loss weight 0 (conflict masks, entropy "
            "filters); filtered completions: completions the completion-entropy filter removed. Definitions: "
            "docs/trainer.md.",
        ]
    for baseline, table in diffs.items():
        if table:
            lines += _paired_table(baseline, table)
    total = sum(r.get("wall_s", 0.0) for r in manifest.get("runs", {}).values())
    lines += ["", f"{len(runs)} runs; total run wall time {total / 60:.0f} min (manifest.json has each run's)."]
    return "\n".join(lines) + "\n"


def write_report(study_dir: Path, order: list[str] | None = None, figure: bool = True) -> dict:
    """Aggregates the finished runs under `study_dir` into study.csv, study.json, study.md (and study.png). When runs
    have heldout.jsonl, also the per-problem tests of heldout.py (baselines, contrasts, collapse counts) (a
    section of study.md, keys of study.json, study_heldout.csv, study_forest.png and study_curves.png); a study
    without them is reported as before, byte for byte. A pre-registered study (its name in train/study/prereg.py's
    PLANS) gets its plan's tests and decisions instead of those per-problem tests (train/study/decide.py)."""
    dirs = finished_runs(study_dir)
    runs = [load_run(p) for p in dirs]
    if not runs:
        raise ValueError(f"{study_dir}: no finished runs under {study_dir / 'runs'}")
    manifest = read_manifest(study_dir) or {}
    regime = manifest.get("regime", study_dir.name)
    order = order or list(manifest.get("arms", {}))
    plan = PLANS.get(regime)  # a pre-registered study (train/study/prereg.py): its own tests replace the ones below
    data, decided = {}, None
    if plan is not None:  # what the plan reads: each run of the regime, whole, its outcomes, paired problems
        check_plan_runs(manifest, dirs, runs)
        data = facts(dirs, runs)
        decided = evaluate(plan, data)
        outside = set(in_plan(plan, decided, data)[1])  # seeds the plan lacks: in no table (study.md names them)
        kept = [f"{r['arm']}/seed{r['seed']}" not in outside for r in runs]
        dirs, runs = [d for d, k in zip(dirs, kept) if k], [r for r, k in zip(runs, kept) if k]
    aggs = aggregate(runs, order)
    diffs = {b: paired(runs, b, order) for b in baselines(runs)}
    held, tests = heldout_tests(dirs, runs, list(aggs)) if plan is None else ({}, {})
    contrasts = heldout_contrasts(held)
    multiplicity = heldout_multiplicity(tests, contrasts)
    collapse = collapse_tests(runs, list(aggs)) if held else {}
    keys = list(dict.fromkeys(k for r in runs for k in r))
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=keys)
    w.writeheader()
    for r in sorted(runs, key=lambda r: (arm_order(runs, order).index(r["arm"]), r["seed"])):
        w.writerow(r)
    write_file(study_dir / "study.csv", table.getvalue())  # each file whole or as it was (a full disk)
    write_json(
        study_dir / "study.json",
        {
            "regime": regime,
            "overrides": manifest.get("overrides"),
            "arms": aggs,
            **{f"paired_vs_{b}": d for b, d in diffs.items()},
            **({"heldout_tests": {f"vs_{b}": t for b, t in tests.items()}} if held else {}),
            **({"heldout_contrasts": contrasts} if contrasts else {}),
            **({"collapse_tests": {f"vs_{b}": t for b, t in collapse.items()}} if collapse else {}),
            **({"heldout_multiplicity": multiplicity} if len(multiplicity) > 1 else {}),
            **({"preregistered": decided} if decided is not None else {}),
            "runs": runs,
        },  # fmt: skip
    )
    text = markdown(regime, manifest, aggs, diffs, runs)
    if held:
        text += heldout_markdown(tests, held, len(runs), contrasts, collapse, multiplicity)
        write_heldout_csv(study_dir / "study_heldout.csv", tests, contrasts, multiplicity)
    if decided is not None:
        title, _, rest = text.partition("\n\n")
        text = f"{title}\n\n{interim_banner(decided)}{rest}" + plan_markdown(plan, decided, data, manifest)
    write_file(study_dir / "study.md", text)
    if figure:
        plot_study(study_dir, list(aggs), regime, study_dir / "study.png")
        if held or plan is not None:
            if any(tests.values()):
                plot_forest(tests, regime, study_dir / "study_forest.png", contrasts, multiplicity)
            plot_curves(study_dir, list(aggs), regime, study_dir / "study_curves.png")
    return {"arms": aggs, "paired": diffs[BASELINE], "paired_by_baseline": diffs, "runs": runs, "heldout_tests": tests,
            "heldout_contrasts": contrasts, "collapse_tests": collapse,
            "heldout_multiplicity": multiplicity}  # fmt: skip
