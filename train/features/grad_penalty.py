"""Gradient penalty (`--grad-penalty LAMBDA`, `--grad-penalty-gamma GAMMA`, `--grad-penalty-radius R`): the update
follows the gradient of L + lambda/2 * max(0, ||g|| - gamma)^2 instead of L's, g = grad L. The op has no double
backward, so the Hessian-vector product in that gradient is a finite difference of two gradients (one more forward
and backward when the penalty is active; Zhao, Zhang and Hu 2022, "Penalizing Gradient Norm for Efficiently
Improving Generalization in Deep Learning"). Gradient clipping still applies afterwards."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..errors import Refused
from ..features.base import Feature, global_norm


def penalize_gradient(
    params: list[torch.nn.Parameter], backward_at: Callable[[], None], lam: float, gamma: float, radius: float
) -> dict[str, float]:
    """With g = grad L in the `.grad` of `params` (the whole batch's gradient, after DDP's average), replace it by the
    gradient of L + lam/2 * max(0, ||g|| - gamma)^2, that is g + lam * max(0, ||g|| - gamma) * H u with u = g / ||g||
    and H the Hessian of L, where H u ~ (grad L(theta + r u) - g) / r (exact for a quadratic L, O(r) off otherwise).
    `backward_at()` runs the loss's forward and backward at the current weights; it is called once, at theta + r u,
    only when ||g|| > gamma (the weights are then put back exactly).
    -> {"grad_norm": ||g||, "penalty": the penalty's value, "hvp_norm": ||H u|| (nan when inactive), "active": 0/1}."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    norm = global_norm(grads)
    excess = max(0.0, norm - gamma)
    out = {"grad_norm": norm, "penalty": 0.5 * lam * excess**2, "hvp_norm": math.nan, "active": 0}
    if not math.isfinite(norm) or excess == 0.0:
        return out
    with torch.no_grad():
        g0 = [g.detach().clone() for g in grads]
        theta = [p.detach().clone() for p in params]
        for p, g in zip(params, g0):
            p.add_(g, alpha=radius / norm)
            p.grad = None
    backward_at()
    with torch.no_grad():
        for p, t in zip(params, theta):
            p.copy_(t)
        diff = [(p.grad if p.grad is not None else torch.zeros_like(p)) - g for p, g in zip(params, g0)]
        for p, g, d in zip(params, g0, diff):
            p.grad = g.add_(d, alpha=lam * excess / radius)
    out.update(hvp_norm=global_norm(diff) / radius, active=1)
    return out


class GradPenalty(Feature):
    name = "grad_penalty"

    def __init__(self, params: list[torch.nn.Parameter], lam: float, gamma: float, radius: float):
        self.params, self.lam, self.gamma, self.radius = params, lam, gamma, radius
        self.fields: dict = {}

    def before_update(self) -> None:
        self.fields = {"gp_grad_norm": math.nan, "gp_penalty": math.nan, "gp_hvp_norm": math.nan, "gp_active": 0}

    def after_backward(self, backward_at: Callable[[], None]) -> None:
        gp = penalize_gradient(self.params, backward_at, self.lam, self.gamma, self.radius)
        self.fields |= {"gp_grad_norm": gp["grad_norm"], "gp_penalty": gp["penalty"], "gp_hvp_norm": gp["hvp_norm"]}
        self.fields["gp_active"] += gp["active"]

    def record(self, record: dict) -> dict:
        return dict(self.fields)


def from_run(cfg, run) -> GradPenalty | None:
    if not cfg.grad_penalty:
        return None
    if any(p.dtype not in (torch.float32, torch.float64) for p in run.params):
        raise Refused(
            f"--grad-penalty needs float32 weights (these are {run.params[0].dtype}): its finite-difference step of "
            f"{cfg.grad_penalty_radius} spread over the weights is below bfloat16's resolution; use --dtype float32"
        )
    if cfg.mixed_precision != "off":  # autocast casts the weights to bf16 in every forward: the same step is lost
        raise Refused(
            f"--grad-penalty with --mixed-precision {cfg.mixed_precision}: its finite-difference step of "
            f"{cfg.grad_penalty_radius} is below bfloat16's resolution in the autocast forward; use "
            "--mixed-precision off"
        )
    return GradPenalty(run.params, cfg.grad_penalty, cfg.grad_penalty_gamma, cfg.grad_penalty_radius)
