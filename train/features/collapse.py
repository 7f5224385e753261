"""The live collapse flag: each step record's `collapse` says whether the low-entropy collapse rule of
study/stability.py holds at that step (mean entropy below `--collapse-entropy` with every group's rewards equal and
the batch not solved, for `--collapse-window` steps). The study recomputes every rule from the records."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..features.base import Feature

HISTORY_KEYS = ("entropy_mean", "zero_var_frac", "accuracy")  # per step, kept in the checkpoint


@dataclass(frozen=True)
class CollapseRules:
    """Thresholds of the two collapse rules (docs/study.md, "Collapse").

    Low-entropy collapse (entropy collapse): over `window` consecutive steps, every step has mean token entropy below
    `low_entropy`, every group's rewards equal (no learning signal, zero_var_frac == 1), and the batch not solved
    (accuracy < 1). A policy that emits one near-deterministic wrong answer per prompt trips it; one that has solved
    the task does not.

    Entropy blow-up (the negative-gradient collapse GTPO describes): over `window` consecutive steps, the mean token
    entropy is at least `rise_factor` x its initial value (the mean of the first `window` steps) and at least
    `rise_min` nats above it, while both the batch reward (accuracy) and the format rate fall at least `drop` below
    their initial values.

    Signal death (found by the study's stress search, docs/study.md): over `window` consecutive steps, no completion
    of the batch is correct and every group's rewards are equal (zero_var_frac == 1), in a run whose first `window`
    steps had correct completions. GRPO then has no advantage left to learn from (without a KL term nothing pulls the
    policy back): the degenerate output is permanent. It catches what the other two miss, a policy that degenerates
    at moderate entropy (e.g. "A + + + + =" at 0.35 nats)."""

    window: int = 3
    low_entropy: float = 0.05
    rise_factor: float = 2.0
    rise_min: float = 0.5
    drop: float = 0.1


def low_entropy_collapse(steps: list[dict], rules: CollapseRules) -> bool:
    """Rule 1 at the last step of `steps`: the `window` steps ending there all qualify."""
    recent = steps[-rules.window :]
    if len(recent) < rules.window:
        return False
    return all(
        h["entropy_mean"] is not None
        and math.isfinite(h["entropy_mean"])
        and h["entropy_mean"] < rules.low_entropy
        and h["zero_var_frac"] >= 1.0
        and h["accuracy"] < 1.0
        for h in recent
    )


class CollapseFlag(Feature):
    name = "collapse"

    def __init__(self, rules: CollapseRules):
        self.rules = rules
        self.history: list[dict] = []

    def record(self, record: dict) -> dict:
        self.history.append({k: record[k] for k in HISTORY_KEYS})
        return {"collapse": low_entropy_collapse(self.history, self.rules)}

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        history = state.get("history")
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise ValueError("bad collapse history")
        self.history = [dict(h) for h in history]


def from_run(cfg, run) -> CollapseFlag:
    return CollapseFlag(CollapseRules(window=cfg.collapse_window, low_entropy=cfg.collapse_entropy))
