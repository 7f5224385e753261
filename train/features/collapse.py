"""The live collapse flag: each step record's `collapse` says whether the low-entropy collapse rule of
train/stability.py holds at that step (mean entropy below `--collapse-entropy` with every group's rewards equal and
the batch not solved, for `--collapse-window` steps). The study recomputes every rule from the records."""

from __future__ import annotations

from ..features.base import Feature
from ..stability import CollapseRules, low_entropy_collapse

HISTORY_KEYS = ("entropy_mean", "zero_var_frac", "accuracy")  # per step, kept in the checkpoint


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
