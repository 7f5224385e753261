"""Trust region on parameters (`--trust-region DELTA`): after each optimizer step, the step d = theta - theta_old of
all trained weights taken together as one vector is projected onto the Euclidean ball of radius delta,
theta <- theta_old + d * min(1, delta / ||d||): the closest point of the ball, which keeps the direction AdamW chose.
Adam's moments stay as the step made them."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..features.base import Feature, snapshot, step_norm


@torch.no_grad()
def project_step(params: list[Tensor], old: list[Tensor], delta: float) -> tuple[float, float]:
    """Project the step of `params` from `old` (their values before the optimizer step) onto ||d|| <= delta,
    computed in the weights' dtype (the result is inside the ball up to their rounding, half an ulp per weight). A
    step inside the ball is left untouched; so is a non-finite one (the step guard deals with it).
    -> (||d|| before, ||d|| after), accumulated in float64."""
    before = step_norm(params, old)
    if not math.isfinite(before) or before <= delta:
        return before, before
    f = delta / before
    for p, o in zip(params, old):
        p.copy_(o.lerp(p, f))  # o + f * (p - o)
    return before, step_norm(params, old)


class TrustRegion(Feature):
    name = "trust_region"

    def __init__(self, params: list[torch.nn.Parameter], delta: float):
        self.params, self.delta = params, delta
        self.old: list[Tensor] | None = None
        self.fields: dict = {}

    def before_update(self) -> None:
        self.fields = {"tr_step_norm": math.nan, "tr_step_norm_after": math.nan, "tr_projected": 0}

    def before_optimizer_step(self) -> None:
        self.old = snapshot(self.params)  # theta_old

    def after_optimizer_step(self, which: str) -> None:
        norm, norm_after = project_step(self.params, self.old, self.delta)
        self.old = None
        self.fields |= {"tr_step_norm": norm, "tr_step_norm_after": norm_after}
        self.fields["tr_projected"] += int(norm > self.delta)
        return None

    def undo_step(self, first: bool) -> bool:
        self.old = None
        return False

    def record(self, record: dict) -> dict:
        return dict(self.fields)


def from_run(cfg, run) -> TrustRegion | None:
    return TrustRegion(run.params, cfg.trust_region) if cfg.trust_region else None
