"""The stability metrics of one run, computed from its metrics.jsonl records: the two collapse rules, gradient norm,
entropy trajectory, success stability, KL from init, outcome and cost. Definitions with their thresholds:
docs/study.md. The training loop flags the low-entropy rule live (`low_entropy_collapse`, with `CollapseRules` in
train/features/collapse.py); the study recomputes every rule from the records, so a run's flags can be re-derived
from its files alone."""

from __future__ import annotations

import math
import statistics

from .trainer import CollapseRules, low_entropy_collapse  # noqa: F401  (the live rule, the trainer's)


def entropy_blowup(steps: list[dict], rules: CollapseRules) -> bool:
    """Rule 2 at the last step of `steps` (needs at least 2 x `window` steps: the first window is the baseline).
    Each step needs a `format_frac`; records written before it was logged never trip the rule."""
    w = rules.window
    if len(steps) < 2 * w or any("format_frac" not in h for h in steps[:w] + steps[-w:]):
        return False
    first, recent = steps[:w], steps[-w:]
    h0 = _mean(h["entropy_mean"] for h in first)
    a0 = _mean(h["accuracy"] for h in first)
    f0 = _mean(h["format_frac"] for h in first)
    if not _finite(h0):
        return False
    return all(
        _finite(h["entropy_mean"])
        and h["entropy_mean"] >= max(rules.rise_factor * h0, h0 + rules.rise_min)
        and h["accuracy"] <= a0 - rules.drop
        and h["format_frac"] <= f0 - rules.drop
        for h in recent
    )


def signal_death(steps: list[dict], rules: CollapseRules) -> bool:
    """Rule 3 at the last step of `steps` (needs at least 2 x `window` steps: the first window must have had
    correct completions)."""
    w = rules.window
    if len(steps) < 2 * w or _mean(h["accuracy"] for h in steps[:w]) <= 0:
        return False
    return all(h["accuracy"] <= 0 and h["zero_var_frac"] >= 1.0 for h in steps[-w:])


RULES = {"low_entropy": low_entropy_collapse, "blowup": entropy_blowup, "signal_death": signal_death}


def first_event(steps: list[dict], rule, rules: CollapseRules) -> int | None:
    """The step number at which `rule` first holds, or None."""
    for i in range(len(steps)):
        if rule(steps[: i + 1], rules):
            return steps[i]["step"]
    return None


# The step fields a --log-mechanism run summarizes (docs/trainer.md, "Mechanism metrics"): the update size, likelihood
# displacement of correct completions that share tokens with wrong ones (and of all correct / all wrong ones), and the
# fraction of tokens and completions the conflict masks and entropy filters touch. A run without them gets no such keys,
# so older studies' reports stay as they were.
MECHANISM_FIELDS = ("update_norm", "ld_correct_shared", "ld_displaced_frac", "ld_correct", "ld_wrong", "masked_frac",
                    "filtered_frac")  # fmt: skip


def run_metrics(records: list[dict], summary: dict, max_grad_norm: float, rules: CollapseRules) -> dict:
    """The per-run numbers of the study from a run's metrics.jsonl records and summary.json (floats; nan where a
    quantity does not exist, e.g. no KL probe). `max_grad_norm`: the run's clipping threshold (a step counts as
    clipped when its pre-clip norm exceeds it)."""
    steps = sorted((r for r in records if "event" not in r), key=lambda r: r["step"])
    if not steps:
        raise ValueError("no step records: the run trained no step")
    grad = [r["grad_norm"] for r in steps if _finite(r["grad_norm"])]
    ent = [r["entropy_mean"] for r in steps if _finite(r["entropy_mean"])]
    acc = [r["accuracy"] for r in steps]
    second_half = acc[len(acc) // 2 :]
    kl = [r["kl_from_init"] for r in steps if r.get("kl_from_init") is not None]
    w = min(rules.window, len(ent)) or 1
    events = {name: first_event(steps, rule, rules) for name, rule in RULES.items()}
    before, after = summary.get("before", {}), summary.get("after", {})
    k_keys = sorted(k for k in after if k.startswith("eval_pass@") or k.startswith("eval_maj@"))
    out = {
        "steps": len(steps),
        "grad_norm_mean": _mean(grad),
        "grad_norm_max": max(grad) if grad else math.nan,
        "clipped_frac": sum(g > max_grad_norm for g in grad) / len(grad) if grad else math.nan,
        "entropy_start": _mean(ent[:w]),
        "entropy_end": _mean(ent[-w:]),
        "entropy_min": min(ent) if ent else math.nan,
        **{f"collapse_{name}": step is not None for name, step in events.items()},
        **{f"collapse_{name}_step": step for name, step in events.items()},
        "collapse": any(step is not None for step in events.values()),
        "success_std_2nd_half": statistics.pstdev(second_half) if len(second_half) > 1 else math.nan,
        "kl_from_init_end": kl[-1] if kl else math.nan,
        "heldout_before": before.get("eval_acc", math.nan),
        "heldout_after": after.get("eval_acc", math.nan),
        "heldout_gain": after.get("eval_acc", math.nan) - before.get("eval_acc", math.nan),
        "step_s_mean": _mean(r["step_s"] for r in steps),
        "tokens_per_s_mean": _mean(r["tokens_per_s"] for r in steps),
        "peak_mem_mb": max(r["peak_mem_mb"] for r in steps),
        "train_peak_mem_mb": max((r["train_peak_mem_mb"] for r in steps if "train_peak_mem_mb" in r), default=math.nan),
        "wall_s": summary.get("wall_s", math.nan),
    }
    for k in k_keys:
        out[k.removeprefix("eval_") + "_after"] = after[k]
    # --log-mechanism: the mechanism fields' means over the run's steps
    if any(MECHANISM_FIELDS[0] in r for r in steps):
        out |= {f"{k}_mean": _mean(r.get(k) for r in steps) for k in MECHANISM_FIELDS}
    return out


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def _mean(values) -> float:
    values = [v for v in values if _finite(v)]
    return sum(values) / len(values) if values else math.nan
