"""Trust region on parameters (`--trust-region DELTA`): after each optimizer step, the step d = theta - theta_old of
all trained weights taken together as one vector is projected onto the Euclidean ball of radius delta,
theta <- theta_old + d * min(1, delta / ||d||): the closest point of the ball, which keeps the direction AdamW chose.
Adam's moments stay as the step made them.

The arithmetic is `sgrpo_kernels.rl.TrustRegion`'s (the one a TRL, verl or plain PyTorch user turns on) with
`strict=False`: measured in the weights' dtype and projected once, as the committed study runs were made. This feature
only places its snapshot and projection among the trainer's other hooks and writes the step record's fields."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sgrpo_kernels import rl

from ..features.base import Feature


def project_step(params: list[Tensor], old: list[Tensor], delta: float) -> tuple[float, float]:
    """Project the step of `params` from `old` (their values before the optimizer step) onto ||d|| <= delta, in the
    weights' dtype (`rl.project_step(..., strict=False)`); a step inside the ball, or a non-finite one, is left
    untouched. -> (||d|| before, ||d|| after), accumulated in float64."""
    s = rl.project_step(params, old, delta, strict=False)
    return s.norm, s.norm_after


class TrustRegion(Feature):
    name = "trust_region"

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], delta: float):
        # attach=False: the trainer calls snapshot/project itself, in the order of its features' hooks
        self.region = rl.TrustRegion(optimizer, delta, params=params, strict=False, attach=False)
        self.fields: dict = {}

    def before_update(self) -> None:
        self.fields = {"tr_step_norm": math.nan, "tr_step_norm_after": math.nan, "tr_projected": 0}

    def before_optimizer_step(self) -> None:
        self.region.snapshot()  # theta_old

    def after_optimizer_step(self, which: str) -> None:
        s = self.region.project()
        self.fields |= {"tr_step_norm": s.norm, "tr_step_norm_after": s.norm_after}
        self.fields["tr_projected"] += int(s.projected)  # a non-finite step is not projected (the guard's job)
        return None

    def undo_step(self, first: bool) -> bool:
        self.region.discard()
        return False

    def record(self, record: dict) -> dict:
        return dict(self.fields)


def from_run(cfg, run) -> TrustRegion | None:
    return TrustRegion(run.optimizer, run.params, cfg.trust_region) if cfg.trust_region else None
