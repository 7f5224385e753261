"""Entropy control: completion mean entropy, the entropy filter (fixed, ln 2, quantile, adaptive), top-entropy tokens.

Everything here works on *detached* entropies (selection decisions carry no gradient); the differentiable entropy
bonus / floor / ceiling terms live in :func:`sgrpo_kernels.rl.policy_loss`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sgrpo_kernels.validation import check_float_tensor, check_group_size, check_number

__all__ = [
    "LN2",
    "adaptive_entropy_threshold",
    "completion_entropy",
    "entropy_threshold",
    "parse_entropy_filter",
    "top_entropy_mask",
]

LN2 = math.log(2.0)


def completion_entropy(entropy: Tensor, mask: Tensor) -> Tensor:
    r"""Mean token entropy of each completion, :math:`\langle H\rangle_i = \sum_t m_{it} H_{it} / \sum_t m_{it}`.

    entropy, mask: ``[B, T]`` (mask bool or float). Returns ``[B]`` (0 for a completion without valid tokens), detached.
    """
    m = mask.to(entropy.dtype)
    h = torch.where(m != 0, entropy.detach(), torch.zeros_like(entropy))
    n = m.sum(dim=1)
    return torch.where(n > 0, (h * m).sum(dim=1) / torch.where(n > 0, n, torch.ones_like(n)), torch.zeros_like(n))


def parse_entropy_filter(spec: object) -> tuple[str, float]:
    """Validate an ``entropy_filter`` value; returns ``(kind, value)`` with kind in fixed / quantile / adaptive."""
    if isinstance(spec, bool):
        raise TypeError("entropy_filter must be None, a float, 'ln2', 'quantile:<q>' or 'adaptive', got a bool")
    if isinstance(spec, (int, float)):
        return "fixed", check_number("entropy_filter", spec, low=0.0)
    if isinstance(spec, str):
        if spec == "ln2":
            return "fixed", LN2
        if spec == "adaptive":
            return "adaptive", math.nan
        if spec.startswith("quantile:"):
            try:
                q = float(spec.split(":", 1)[1])
            except ValueError:
                q = math.nan
            if not 0.0 < q <= 1.0:
                raise ValueError(
                    f"entropy_filter {spec!r}: the quantile must be a number in (0, 1], e.g. 'quantile:0.9'"
                )
            return "quantile", q
    raise ValueError(f"entropy_filter must be None, a float >= 0, 'ln2', 'quantile:<q>' or 'adaptive', got {spec!r}")


def adaptive_entropy_threshold(rewards: Tensor, group_size: int, vocab_size: int) -> float:
    r"""Data-driven completion-entropy threshold :math:`H_{thr} = f(\mathrm{Var}[r], G, |V|)` (a heuristic).

    .. math::
        \bar v = \frac{1}{n_g}\sum_g \frac{\mathrm{Var}_g[r]}{(r_{max} - r_{min})^2} \in [0, 1/4],\quad
        k_{eff} = 1 + (1 + 4\bar v)\,\Bigl(1 + \frac{\ln G}{\ln |V|}\Bigr),\quad
        H_{thr} = \min(\ln k_{eff}, \ln |V|)

    Reading: :math:`e^{H}` is the effective number of tokens the policy hesitates between. With no reward spread and a
    single sample the threshold is GTPO's ln 2 (a choice between two tokens). Reward variance (normalized by the
    batch's reward range, population variance per group over non-NaN rewards) means the group carries learning signal,
    so more exploration is tolerated (up to ln 3 at the maximum binary variance); a larger group averages noisy
    completions, so the threshold grows with :math:`\ln G` relative to the vocabulary's maximum entropy
    :math:`\ln |V|`. This is the project's heuristic for the seed's open question (s-grpo-reference-free.md, section
    1), not a proven bound.

    Args:
        rewards: ``[B]`` rewards (NaN ignored); group_size: G; vocab_size: |V| >= 2.
    """
    rewards = check_float_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    g = check_group_size(group_size, rewards.shape[0], "rewards")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    r = rewards.detach().to(torch.float64).reshape(-1, g)
    valid = ~torch.isnan(r)
    r0 = torch.where(valid, r, torch.zeros_like(r))
    n = valid.sum(dim=1).to(r.dtype)
    mean = r0.sum(dim=1) / n.clamp(min=1)
    var = torch.where(valid, (r0 - mean.unsqueeze(1)) ** 2, torch.zeros_like(r0)).sum(dim=1) / n.clamp(min=1)
    if valid.any():
        rng = float(r[valid].max() - r[valid].min())
        has = n > 0
        v_bar = float(var[has].mean()) / (rng * rng) if rng > 0 else 0.0
    else:
        v_bar = 0.0
    ln_v = math.log(vocab_size)
    k_eff = 1.0 + (1.0 + 4.0 * v_bar) * (1.0 + math.log(g) / ln_v)
    return min(math.log(k_eff), ln_v)


def entropy_threshold(
    spec: float | str,
    mean_entropy: Tensor,
    seq_valid: Tensor,
    *,
    rewards: Tensor | None = None,
    group_size: int | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """The completion-entropy threshold for ``spec`` as a 0-d tensor (fixed value, quantile of the batch's finite
    completion mean entropies over non-empty completions, or :func:`adaptive_entropy_threshold`)."""
    kind, value = parse_entropy_filter(spec)
    dev, dt = mean_entropy.device, mean_entropy.dtype
    if kind == "fixed":
        return torch.tensor(value, dtype=dt, device=dev)
    if kind == "quantile":
        # a NaN / inf completion entropy is filtered itself (h <= thr is False) but does not set the threshold
        vals = mean_entropy[seq_valid & torch.isfinite(mean_entropy)]
        if vals.numel() == 0:
            return torch.tensor(math.inf, dtype=dt, device=dev)
        return torch.quantile(vals, value)
    named = (("rewards", rewards), ("group_size", group_size), ("vocab_size", vocab_size))
    missing = [k for k, v in named if v is None]
    if missing:
        raise ValueError(f"entropy_filter='adaptive' needs the keyword argument(s) {missing} (reward variance, G, |V|)")
    return torch.tensor(adaptive_entropy_threshold(rewards, group_size, vocab_size), dtype=dt, device=dev)


def top_entropy_mask(entropy: Tensor, active: Tensor, rho: float) -> Tensor:
    r"""Keep the top :math:`\lceil \rho n \rceil` of the n active tokens by entropy (ties at the cut are kept).

    Source: "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL" (arXiv 2506.01939), rho = 0.2;
    verl/TRL ``top_entropy_quantile``. entropy, active: ``[B, T]``. Returns a bool ``[B, T]`` (False where inactive).
    """
    h = entropy.detach()
    vals = h[active]
    n = vals.numel()
    if n == 0:
        return active.clone()
    k = max(1, math.ceil(rho * n))
    cut = torch.topk(vals, k).values.min()
    return active & (h >= cut)
