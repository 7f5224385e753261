"""A pre-registered plan (study/prereg.py) evaluated on a study's run files: each contrast's paired t over seeds
(95% and 90% intervals), the Fisher tests of persistent collapse, Holm's correction over the plan's family, and for
each hypothesis the rule that fired. Every reading from fewer seeds than planned is marked interim, and so is every
decision that rests on one (a Holm-adjusted p rests on the whole family). docs/study-v2-preregistration.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import stats
from .collapse import classify
from .prereg import ALPHA, MARGIN, Fisher, Plan
from .results import read_heldout, read_records, read_summary
from .stability import CollapseRules

# A screen's threshold on a mean of held-out accuracies (multiples of 1/n_problems) is met in exact arithmetic when the
# float mean lands within this of it: -0.10 from five k/500 differences can compute to -0.10000000000000002.
ROUNDING = 1e-9


def run_facts(run_dir: Path) -> dict:
    """What a plan's rules read of one run: held-out accuracy after, persistent / transient collapse
    (study/collapse.py, under the run's own collapse thresholds) and whether PPO's ratio clip ever fired."""
    cfg = json.loads((run_dir / "config.json").read_text())["train"]
    records, summary = read_records(run_dir), read_summary(run_dir)
    c = classify(records, summary, CollapseRules(window=cfg["collapse_window"], low_entropy=cfg["collapse_entropy"]))
    steps = [r for r in records if "event" not in r]
    clip, step_s = [r.get("clip_frac") for r in steps], [r["step_s"] for r in steps if "step_s" in r]
    term = [r.get("policy_term_frac") for r in steps]  # a field preset's term (train/record.py); absent elsewhere
    return {"after": summary["after"]["eval_acc"], "persistent": c["persistent"], "transient": c["transient"],
            "clip_active": any(x is not None and x > 0 for x in clip),
            "term_active": any(x is not None and x > 0 for x in term),
            "step_s": sum(step_s) / len(step_s) if step_s else math.nan, **_greedy_rates(run_dir)}  # fmt: skip


def _greedy_rates(run_dir: Path) -> dict:
    """From heldout.jsonl's greedy details (train/evaluate.py), before and after: the fraction of held-out
    completions that hit the token limit and the fraction with no extracted answer (None when the run has no
    details)."""
    lines = list((read_heldout(run_dir) or {}).values())
    out = {}
    for phase in ("before", "after"):
        hit = [x.get(f"{phase}_hit_limit") for x in lines]
        if not lines or any(h is None for h in hit):
            out |= {f"hit_limit_{phase}": None, f"no_answer_{phase}": None}
            continue
        out[f"hit_limit_{phase}"] = sum(hit) / len(lines)
        out[f"no_answer_{phase}"] = sum(x.get(f"{phase}_extracted") is None for x in lines) / len(lines)
    return out


def facts(dirs: list[Path], runs: list[dict]) -> dict[str, dict[int, dict]]:
    """{arm: {seed: run_facts}} of the study's finished runs."""
    out: dict[str, dict[int, dict]] = {}
    for path, run in zip(dirs, runs):
        out.setdefault(run["arm"], {})[run["seed"]] = run_facts(path)
    return out


def _contrast(c, data: dict) -> dict:
    arms = [a for a, w in c.weights if w]
    seeds = [s for s in c.seeds if all(s in data.get(a, {}) for a in arms)]
    values = [math.fsum(w * data[a][s]["after"] for a, w in c.weights if w) for s in seeds]
    t = stats.paired_t(values)
    ci90 = stats.paired_t(values, alpha=0.10)["ci"] if len(values) > 1 else [math.nan, math.nan]
    return {"key": c.key, "what": c.what, "seeds": seeds, "planned": len(c.seeds), "interim": len(seeds) < len(c.seeds),
            "mean": t["mean"], "sd": t["sd"], "p": t["p"], "ci95": t["ci"], "ci90": ci90, "mdd": t["mdd"],
            "per_seed": values}  # fmt: skip


def _planned_runs(plan: Plan, data: dict, arm: str, fired: dict, seeds: tuple | None = None) -> tuple[list, bool]:
    """(the facts of the arm's finished runs among its planned seeds (or `seeds`), whether one of them is missing)."""
    planned = plan.planned(arm, fired) if seeds is None else seeds
    runs = [data.get(arm, {})[s] for s in planned if s in data.get(arm, {})]
    return runs, len(runs) < len(planned)


def _persistent(plan: Plan, data: dict, arm: str, fired: dict) -> tuple[int, int, int, bool]:
    """(persistent, transient, runs, interim) of an arm over its planned seeds."""
    runs, interim = _planned_runs(plan, data, arm, fired)
    return sum(r["persistent"] for r in runs), sum(r["transient"] for r in runs), len(runs), interim


def _arm_counts(plan: Plan, data: dict, arm: str, fired: dict) -> dict:
    k, t, n, interim = _persistent(plan, data, arm, fired)
    return {"persistent": k, "transient": t, "runs": n, "planned": len(plan.planned(arm, fired)), "interim": interim}


def _fisher(plan: Plan, f, data: dict, fired: dict) -> dict:
    ka, _, na, ia = _persistent(plan, data, f.arm, fired)
    kb, _, nb, ib = _persistent(plan, data, f.baseline, fired)
    p = stats.fisher_exact(ka, na, kb, nb) if na and nb else math.nan
    return {"key": f.key, "what": f.what, "events": (ka, na), "base_events": (kb, nb), "p": p, "interim": ia or ib}


def _in_family(item, fired: dict) -> bool:
    return getattr(item, "family", True) and (item.requires is None or fired.get(item.requires[0]) == item.requires[1])


def _condition(cond: tuple, ctx: dict) -> tuple[bool | None, bool, str]:
    """(holds: True / False / None when it cannot be decided yet, rests on interim data, text)."""
    kind, target = cond[0], cond[1]
    if kind in ("persistent_at_most", "persistent_at_least", "clip_active", "term_active"):
        seeds = cond[3] if len(cond) > 3 else None  # (a screen's conditions: over the screen's seeds)
        runs, interim = _planned_runs(ctx["plan"], ctx["data"], target, ctx["fired"], seeds)
        k, n = sum(r["persistent"] for r in runs), len(runs)
        if n == 0:
            return None, True, f"{kind}({target}): no run"
        if kind == "clip_active":
            on = sum(r["clip_active"] for r in runs)
            return on == n, interim, f"ratio clip fired in {on} of {n} runs of {target}"
        if kind == "term_active":
            on = sum(r["term_active"] for r in runs)
            return on == n, interim, f"the policy term acted in {on} of {n} runs of {target}"
        holds = k <= cond[2] if kind == "persistent_at_most" else k >= cond[2]
        sign = "<=" if kind == "persistent_at_most" else ">="
        return holds, interim, f"persistent collapses of {target}: {k} of {n} ({sign} {cond[2]})"
    c = ctx["contrasts"][target]
    if len(c["seeds"]) < 2:
        return None, True, f"{target}: {len(c['seeds'])} seed(s), no test"
    if kind == "equivalent":
        lo, hi = c["ci90"]
        return (
            -MARGIN < lo and hi < MARGIN,
            c["interim"],
            f"{target} 90% CI [{lo:+.3f}, {hi:+.3f}] inside +-{MARGIN:.2f}",
        )
    if kind == "mean_at_least":
        return c["mean"] >= cond[2] - ROUNDING, c["interim"], f"{target} mean {c['mean']:+.3f} >= {cond[2]:+.2f}"
    p = ctx["holm"].get(target, math.nan)
    if not math.isfinite(p):
        return None, True, f"{target}: not in the family (yet)"
    up = kind == "higher"
    holds = (c["mean"] > 0 if up else c["mean"] < 0) and p < ALPHA
    text = f"{target} mean {c['mean']:+.3f} {'>' if up else '<'} 0 and Holm p {_p(p)} < {ALPHA}"
    return holds, ctx["family_interim"], text


def _decide(h, ctx: dict) -> dict:
    """The hypothesis's decision: the first rule whose conditions all hold (None: no rule fired), whether it rests
    on interim data, and each rule's conditions as read."""
    if h.requires is not None and ctx["fired"].get(h.requires[0]) != h.requires[1]:
        waiting = ctx["interim_of"].get(h.requires[0], True)  # the rule it needs may still fire
        return {"key": h.key, "decision": None, "not_run": True, "interim": waiting, "rules": []}
    rules, decision, interim = [], None, False
    for rule in h.rules:
        read = [_condition(c, ctx) for c in rule.when]
        fires = all(r[0] for r in read) and decision is None
        rules.append({"decision": rule.decision, "fires": fires,
                      "conditions": [{"holds": r[0], "interim": r[1], "text": r[2]} for r in read]})  # fmt: skip
        if decision is None:  # the rules after the one that fired cannot change the decision
            interim |= any(r[1] for r in read)
        if fires:
            decision = rule.decision
    return {"key": h.key, "decision": decision, "not_run": False, "interim": interim, "rules": rules}


def _decide_all(plan: Plan, ctx: dict) -> list[dict]:
    """Every hypothesis decided in the plan's order (a confirmation after the screen it requires), into ctx."""
    out = []
    for h in plan.hypotheses:
        d = _decide(h, ctx)
        ctx["fired"][h.key], ctx["interim_of"][h.key] = d["decision"], d["interim"]
        out.append(d)
    return out


def evaluate(plan: Plan, data: dict[str, dict[int, dict]]) -> dict:
    """The plan on the facts of a study's runs (`facts`): contrasts, Fisher tests, the Holm family and each
    hypothesis's decision. Two passes: the screens (no Holm condition) decide which tests enter the family."""
    contrasts = {c.key: _contrast(c, data) for c in plan.contrasts}
    ctx = {"plan": plan, "data": data, "contrasts": contrasts, "holm": {}, "family_interim": True, "fired": {},
           "interim_of": {}}  # fmt: skip
    _decide_all(plan, ctx)
    fishers = {f.key: _fisher(plan, f, data, ctx["fired"]) for f in plan.fishers}
    family = [(c.key, contrasts[c.key]["p"], contrasts[c.key]["interim"]) for c in plan.contrasts
              if _in_family(c, ctx["fired"])]  # fmt: skip
    family += [(f.key, fishers[f.key]["p"], fishers[f.key]["interim"]) for f in plan.fishers
               if _in_family(f, ctx["fired"])]  # fmt: skip
    tested = [(k, p, i) for k, p, i in family if math.isfinite(p)]
    ctx["holm"] = dict(zip([k for k, _, _ in tested], stats.holm([p for _, p, _ in tested])))
    # the family is complete only when every test in it is, and every screen that admits tests to it has decided
    gates = {x.requires[0] for x in (*plan.contrasts, *plan.fishers) if x.requires is not None}
    ctx["family_interim"] = (any(i for _, _, i in family) or len(tested) < len(family)
                             or any(ctx["interim_of"].get(g, True) for g in gates))  # fmt: skip
    for x in (*plan.contrasts, *plan.fishers):  # a test whose screen has decided against it is not run
        if x.requires is not None:
            out = fishers[x.key] if isinstance(x, Fisher) else contrasts[x.key]
            h, rule = x.requires
            out["not_run"] = None if ctx["interim_of"].get(h, True) or ctx["fired"].get(h) == rule else h
    decisions = _decide_all(plan, ctx)
    return {"plan": plan.name, "contrasts": contrasts, "fishers": fishers, "holm": ctx["holm"],
            "family": [k for k, _, _ in family], "family_interim": ctx["family_interim"],
            "arms": {a: _arm_counts(plan, data, a, ctx["fired"]) for a in plan.arms},
            "hypotheses": decisions}  # fmt: skip


# ------------------------------------------------------------------------------------------------ study.md section


def _f(x: float, fmt: str = "+.3f") -> str:
    return f"{x:{fmt}}" if isinstance(x, int | float) and math.isfinite(x) else "n/a"


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else "<0.0001" if p < 0.0001 else f"{p:.4f}"


def _ci(ci: list[float]) -> str:
    return f"[{_f(ci[0])}, {_f(ci[1])}]" if all(math.isfinite(v) for v in ci) else "n/a"


def _mean_se(values: list[float]) -> str:
    if not values:
        return "n/a"
    t = stats.paired_t(values)
    return f"{t['mean']:.3f}" + (f" +- {t['se']:.3f}" if math.isfinite(t["se"]) else "")


def _rate(runs: list[dict], key: str) -> str:
    """The mean of a greedy-detail rate over the runs ("n/a" when some run has no details)."""
    v = [r[key] for r in runs if r.get(key) is not None]
    return f"{sum(v) / len(v):.2f}" if v and len(v) == len(runs) else "n/a"


def _arm_table(plan: Plan, result: dict, data: dict) -> list[str]:
    lines = ["| arm | runs / planned | persistent collapse | transient collapse | held-out after (mean +- SE) | "
             "hit limit before -> after | no answer before -> after |", "|" + "---|" * 7]  # fmt: skip
    for arm, a in result["arms"].items():
        runs = list(data.get(arm, {}).values())
        mark = " (interim)" if a["interim"] else ""
        hit = f"{_rate(runs, 'hit_limit_before')} -> {_rate(runs, 'hit_limit_after')}"
        none = f"{_rate(runs, 'no_answer_before')} -> {_rate(runs, 'no_answer_after')}"
        lines.append(f"| {arm} | {a['runs']} / {a['planned']}{mark} | {a['persistent']} | {a['transient']} | "
                     f"{_mean_se([r['after'] for r in runs])} | {hit} | {none} |")  # fmt: skip
    return lines


def _tests_tables(result: dict) -> list[str]:
    holm = result["holm"]
    lines = ["### Contrasts (held-out accuracy after training, paired by seed)", "",
             "| key | contrast | seeds / planned | mean | 95% CI (t) | 90% CI (t) | p (t) | p (Holm) | MDD (t) |",
             "|" + "---|" * 9]  # fmt: skip
    for c in result["contrasts"].values():
        if c.get("not_run"):
            lines.append(f"| {c['key']} | {c['what']} | not run: {c['not_run']} did not pass |" + " |" * 6)
            continue
        seeds = f"{len(c['seeds'])} / {c['planned']}" + (" (interim)" if c["interim"] else "")
        p_holm = _p(holm.get(c["key"], math.nan))
        lines.append(f"| {c['key']} | {c['what']} | {seeds} | {_f(c['mean'])} | {_ci(c['ci95'])} | {_ci(c['ci90'])} "
                     f"| {_p(c['p'])} | {p_holm} | {_f(c['mdd'], '.3f')} |")  # fmt: skip
    lines += ["", "### Persistent collapse: Fisher's exact test", "",
              "| key | what | arm | baseline | p | p (Holm) |", "|" + "---|" * 6]  # fmt: skip
    for f in result["fishers"].values():
        if f.get("not_run"):
            lines.append(f"| {f['key']} | {f['what']} | not run: {f['not_run']} did not pass |" + " |" * 3)
            continue
        mark = " (interim)" if f["interim"] else ""
        lines.append(
            f"| {f['key']} | {f['what']} | {f['events'][0]}/{f['events'][1]} | {f['base_events'][0]}/"
            f"{f['base_events'][1]}{mark} | {_p(f['p'])} | {_p(holm.get(f['key'], math.nan))} |"
        )
    return lines


def _decision_lines(plan: Plan, result: dict) -> list[str]:
    statements = {h.key: h.statement for h in plan.hypotheses}
    lines = []
    for d in result["hypotheses"]:
        head = f"- **{d['key']}** {statements[d['key']]}"
        if d["not_run"]:
            lines.append(f"{head} Not decided: it needs its screen's rule to fire"
                         + (" (the screen is interim)." if d["interim"] else ", which did not."))  # fmt: skip
            continue
        screened = [a for a, ((key, _), _) in plan.extend.items() if key == d["key"]]  # arms this rule extends
        if d["interim"]:
            now = d["decision"] or "no rule"
            lines.append(f"{head} **INTERIM, not a decision**: on the runs so far, {now} would fire.")
        elif d["decision"] is None and screened:
            stays = "; ".join(f"{a} does not pass and stays at seeds {_seeds(plan.arms[a])}" for a in screened)
            lines.append(f"{head} **Decision: no rule fired: {stays}.**")
        else:
            verdict = f"rule fired: {d['decision']}" if d["decision"] else "inconclusive: no rule fired"
            lines.append(f"{head} **Decision: {verdict}.**")
        for i, r in enumerate(d["rules"], 1):
            conds = "; ".join(f"{c['text']}: {'yes' if c['holds'] else 'no' if c['holds'] is False else 'undecided'}"
                              + (" (interim)" if c["interim"] else "") for c in r["conditions"])  # fmt: skip
            lines.append(f"  - rule {i} ({r['decision']}): {conds}" + (" -> fires" if r["fires"] else ""))
    return lines


def _seeds(seeds: tuple[int, ...]) -> str:
    run = list(seeds) == list(range(seeds[0], seeds[-1] + 1))
    return f"{seeds[0]}-{seeds[-1]}" if run else ",".join(map(str, seeds))


def _compute_table(plan: Plan, data: dict, manifest: dict) -> list[str]:
    """A screen's arms side by side in cost: the mean step time over each arm's runs and their mean wall time (the
    manifest's, which sums a resumed run's processes); every arm of a plan runs the same steps and completions."""
    walls = {k: e.get("wall_s") for k, e in (manifest.get("runs") or {}).items()}
    lines = ["### Compute per arm (the same steps and completions in every arm)", "",
             "| arm | runs | step s (mean) | wall min per run (mean, manifest) |", "|" + "---|" * 4]  # fmt: skip
    for arm in plan.arms:
        runs = data.get(arm, {})
        step = [r["step_s"] for r in runs.values() if math.isfinite(r.get("step_s", math.nan))]
        wall = [walls[k] / 60 for s in runs if isinstance(walls.get(k := f"{arm}/seed{s}"), int | float)]
        lines.append(f"| {arm} | {len(runs)} | {_f(sum(step) / len(step), '.2f') if step else 'n/a'} | "
                     f"{_f(sum(wall) / len(wall), '.1f') if wall else 'n/a'} |")  # fmt: skip
    return lines


def interim_banner(result: dict) -> str:
    """The line study.md of a pre-registered study opens with while some planned run is missing ("" after)."""
    done = sum(a["runs"] for a in result["arms"].values())
    planned = sum(a["planned"] for a in result["arms"].values())
    if done >= planned:
        return ""
    return (f"**INTERIM: {done} of {planned} planned runs finished** (plan `{result['plan']}`): a reading marked "
            "interim below rests on fewer seeds than planned, and a decision marked so is not final.\n\n")  # fmt: skip


def in_plan(plan: Plan, result: dict, data: dict) -> tuple[dict, list[str]]:
    """(`data` restricted to each arm's planned seeds, given the rules that fired; "ARM/seedK" of the runs left out:
    the plan adds no seed, section 6)."""
    fired = {d["key"]: d["decision"] for d in result["hypotheses"]}
    kept = {a: {s: f for s, f in runs.items() if a in plan.arms and s in plan.planned(a, fired)}
            for a, runs in data.items()}  # fmt: skip
    return kept, [f"{a}/seed{s}" for a, runs in data.items() for s in sorted(runs) if s not in kept[a]]


def plan_markdown(plan: Plan, result: dict, data: dict, manifest: dict | None = None) -> str:
    """study.md's section of a pre-registered study: runs and collapse per arm, the contrasts and Fisher tests with
    their Holm-adjusted p, and for each hypothesis the rule that fired (or INTERIM / inconclusive)."""
    done = sum(a["runs"] for a in result["arms"].values())
    planned = sum(a["planned"] for a in result["arms"].values())
    data, outside = in_plan(plan, result, data)  # the tables read the planned seeds only, as the tests do
    lines = ["", f"## Pre-registered analysis (plan `{plan.name}`, study/prereg.py; "
             "docs/study-v2-preregistration.md)", ""]  # fmt: skip
    if done < planned:
        lines += [
            f"**INTERIM: {done} of {planned} planned runs finished.** A reading marked interim rests on fewer "
            "seeds than planned; no decision below is final until every run it needs has finished.",
            "",
        ]
    lines += [
        f"Primary endpoint: held-out accuracy after training. Paired t over seeds (two-sided, alpha {ALPHA}); "
        f"Holm's correction over the family ({', '.join(result['family'])}); equivalence: the 90% CI inside "
        f"+-{MARGIN:.2f}. Collapse is persistent when a collapse rule holds in the last 10 steps or held-out "
        "accuracy after is at most before (study/collapse.py); transient otherwise. Adopted runs: "
        + (", ".join(f"{a} from {src}" for a, src in plan.adopted.items()) or "none")
        + ".",
        "",
    ]
    if outside:
        lines += [f"Finished runs outside the plan, read by no test or table here: {', '.join(outside)}.", ""]
    lines += _arm_table(plan, result, data) + [""] + _tests_tables(result) + [""]
    if plan.extend:  # a screen: what each method cost beside the others (section 4.1 of the plan)
        lines += _compute_table(plan, data, manifest or {}) + [""]
    lines += ["### Decisions", ""]
    lines += _decision_lines(plan, result)
    return "\n".join(lines) + "\n"
