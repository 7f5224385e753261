"""Entropy control: completion mean entropy, the entropy filter (fixed, ln 2, quantile, adaptive, coverage), top-entropy
tokens.

Everything here works on *detached* entropies (selection decisions carry no gradient); the differentiable entropy
bonus / floor / ceiling terms live in :func:`sgrpo_kernels.rl.policy_loss`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sgrpo_kernels.backends.contract import stats_dtype
from sgrpo_kernels.validation import check_float_tensor, check_group_size, check_number

__all__ = [
    "LN2",
    "adaptive_entropy_threshold",
    "completion_entropy",
    "coverage_entropy_threshold",
    "entropy_threshold",
    "parse_entropy_filter",
    "top_entropy_mask",
]

LN2 = math.log(2.0)


def _check_pair(where: str, entropy: object, name: str, mask: object) -> None:
    """entropy a float tensor and `name` a tensor of its shape (no value check: no host sync)."""
    check_float_tensor("entropy", entropy)
    if not isinstance(mask, Tensor) or mask.shape != entropy.shape:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{where}: {name} must be a tensor of entropy's shape {tuple(entropy.shape)}, got {got}")


def completion_entropy(entropy: Tensor, mask: Tensor) -> Tensor:
    r"""Mean token entropy of each completion, :math:`\langle H\rangle_i = \sum_t m_{it} H_{it} / \sum_t m_{it}`.

    entropy, mask: ``[B, T]`` (mask bool or float). Returns ``[B]`` (0 for a completion without valid tokens), detached.
    """
    _check_pair("completion_entropy", entropy, "mask", mask)
    m = mask.to(entropy.dtype)
    h = torch.where(m != 0, entropy.detach(), torch.zeros_like(entropy))
    n = m.sum(dim=1)
    return torch.where(n > 0, (h * m).sum(dim=1) / torch.where(n > 0, n, torch.ones_like(n)), torch.zeros_like(n))


_FILTER_FORMS = "None, a float >= 0, 'ln2', 'quantile:<q>', 'adaptive' or 'coverage'"


def parse_entropy_filter(spec: object) -> tuple[str, float]:
    """Validate an ``entropy_filter`` value; returns ``(kind, value)`` with kind in fixed / quantile / adaptive /
    coverage."""
    if isinstance(spec, bool):
        raise TypeError(f"entropy_filter must be {_FILTER_FORMS}, got a bool")
    if isinstance(spec, (int, float)):
        return "fixed", check_number("entropy_filter", spec, low=0.0)
    if isinstance(spec, str):
        if spec == "ln2":
            return "fixed", LN2
        if spec in ("adaptive", "coverage"):
            return spec, math.nan
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
    raise ValueError(f"entropy_filter must be {_FILTER_FORMS}, got {spec!r}")


def _check_vocab_size(vocab_size: object) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be a Python int >= 2, got {type(vocab_size).__name__} {vocab_size!r}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (ln |V| is the maximum entropy), got {vocab_size!r}")
    return vocab_size


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
    :math:`\ln |V|`. This is the project's heuristic for an open question of the S-GRPO design notes (how to set the
    threshold from the data), not a proven bound.

    Args:
        rewards: ``[B]`` rewards (NaN and +-inf ignored); group_size: G; vocab_size: |V| >= 2.
    """
    rewards = check_float_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    g = check_group_size(group_size, rewards.shape[0], "rewards")
    _check_vocab_size(vocab_size)
    r = rewards.detach().to(torch.float64).reshape(-1, g)
    valid = torch.isfinite(r)  # an unscorable (NaN / +-inf) reward is left out, as group_advantages leaves it out
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


def coverage_entropy_threshold(rewards: Tensor, group_size: int, vocab_size: int) -> Tensor:
    r"""Per-group completion-entropy threshold :math:`H_{thr} = f(\mathrm{Var}[r], G, |V|)`, derived from a coverage
    argument (docs/rl.md, "The coverage entropy threshold").

    .. math::
        n_{eff,g} = \frac{\bigl(\sum_{i \in g} |r_i - \bar r_g|\bigr)^2}{\sum_{i \in g} (r_i - \bar r_g)^2}
        \quad(0 \text{ when every reward equals } \bar r_g),\qquad
        H_{thr,g} = \min\bigl(\ln \max(n_{eff,g}, 1),\ \ln |V|\bigr)

    :math:`n_{eff,g}` is Kish's effective sample size of the group's advantage magnitudes (GRPO's :math:`|A_i|
    \propto |r_i - \bar r_g|`): the number of completions that effectively carry the group's gradient. For binary
    rewards it is :math:`4 G\,\mathrm{Var}_g[r]` (population variance), so the threshold is
    :math:`\min(\ln(4 G\,\mathrm{Var}[r]), \ln|V|)`. Reading: :math:`e^{\langle H\rangle_i}` is the effective
    number of tokens the policy hesitates between at each step; a group can attribute its reward differences among
    at most :math:`n_{eff}` alternatives, so a completion is trusted when :math:`e^{\langle H\rangle_i} \le n_{eff}`.
    A group of two with one success gives :math:`n_{eff} = 2`, i.e. GTPO's ln 2. The threshold grows with the
    reward variance and the group size and never exceeds the maximum entropy :math:`\ln|V|` (at the cap nothing is
    filtered). With :math:`n_{eff} \le 1` (G = 1, equal rewards) it is 0: only fully decided completions are kept;
    such groups have zero relative advantage anyway.

    Non-finite rewards are left out (as in ``group_advantages``). Sync-free: no value leaves the device.

    Args:
        rewards: ``[B]`` float rewards; group_size: G (B a multiple of G); vocab_size: |V| >= 2.

    Returns:
        ``[B]`` thresholds, each completion's group's, in float32 (float64 for float64 rewards).
    """
    rewards = check_float_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    g = check_group_size(group_size, rewards.shape[0], "rewards")
    ln_v = math.log(_check_vocab_size(vocab_size))
    dt = stats_dtype(rewards.dtype)
    r = rewards.detach().to(dt).reshape(-1, g)
    valid = torch.isfinite(r)
    r = torch.where(valid, r, torch.zeros_like(r))
    # scale each group by its largest |r| first: the ratio is scale-free, and huge rewards cannot overflow the squares
    top = r.abs().amax(dim=1, keepdim=True)
    r = r / torch.where(top > 0, top, torch.ones_like(top))
    n = valid.sum(dim=1, keepdim=True).to(dt)
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    d = torch.where(valid, r - mean, torch.zeros_like(r))
    d = d / d.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(dt).tiny)  # |d| <= 1: the squares stay normal
    sq = (d * d).sum(dim=1)
    n_eff = torch.where(sq > 0, d.abs().sum(dim=1) ** 2 / torch.where(sq > 0, sq, torch.ones_like(sq)), 0.0)
    thr = torch.log(n_eff.clamp(min=1.0)).clamp(max=ln_v)
    return thr.repeat_interleave(g)


def entropy_threshold(
    spec: float | str,
    mean_entropy: Tensor,
    seq_valid: Tensor,
    *,
    rewards: Tensor | None = None,
    group_size: int | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """The completion-entropy threshold for ``spec``: a 0-d tensor (fixed value, quantile of the batch's finite
    completion mean entropies over non-empty completions, or :func:`adaptive_entropy_threshold`) or, for
    ``"coverage"``, a ``[B]`` tensor (each completion's group's :func:`coverage_entropy_threshold`)."""
    kind, value = parse_entropy_filter(spec)
    _check_pair("entropy_threshold", mean_entropy, "seq_valid", seq_valid)
    if seq_valid.dtype != torch.bool:
        raise TypeError(f"entropy_threshold: seq_valid must be a bool tensor ([B], True = a non-empty completion), "
                        f"got dtype {seq_valid.dtype}")  # fmt: skip
    dev, dt = mean_entropy.device, mean_entropy.dtype
    if kind == "fixed":
        return torch.tensor(value, dtype=dt, device=dev)
    if kind == "quantile":
        # a NaN / inf completion entropy is filtered itself (h <= thr is False) but does not set the threshold
        vals = mean_entropy[seq_valid & torch.isfinite(mean_entropy)]
        if vals.numel() == 0:
            return torch.tensor(math.inf, dtype=dt, device=dev)
        if vals.dtype in (torch.float32, torch.float64):
            return torch.quantile(vals, value)
        return torch.quantile(vals.float(), value).to(dt)  # (torch.quantile takes float32 / float64 only)
    named = (("rewards", rewards), ("group_size", group_size), ("vocab_size", vocab_size))
    missing = [k for k, v in named if v is None]
    if missing:
        raise ValueError(f"entropy_filter={kind!r} needs the keyword argument(s) {missing} (reward variance, G, |V|)")
    rewards = check_float_tensor("rewards", rewards)
    if tuple(rewards.shape) != tuple(mean_entropy.shape):  # (adaptive too: another batch's rewards set no threshold)
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}, expected {tuple(mean_entropy.shape)} ([B], one "
                         "reward per completion of the loss batch)")
    if rewards.device != dev:
        raise ValueError(f"rewards is on {rewards.device}, expected {dev} (the device of the loss inputs)")
    if kind == "adaptive":
        return torch.tensor(adaptive_entropy_threshold(rewards, group_size, vocab_size), dtype=dt, device=dev)
    return coverage_entropy_threshold(rewards, group_size, vocab_size).to(dt)


def top_entropy_mask(entropy: Tensor, active: Tensor, rho: float) -> Tensor:
    r"""Keep the top :math:`\lceil \rho n \rceil` of the n active tokens by entropy (ties at the cut are kept).

    Source: "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL" (arXiv 2506.01939), rho = 0.2;
    verl/TRL ``top_entropy_quantile``. entropy, active: ``[B, T]``. Returns a bool ``[B, T]`` (False where inactive,
    and where the entropy is not finite: such a token is neither ranked nor kept).
    """
    _check_pair("top_entropy_mask", entropy, "active", active)
    if active.dtype != torch.bool:
        raise TypeError(f"top_entropy_mask: active must be a bool tensor, got dtype {active.dtype}")
    rho = check_number("rho", rho, low=0.0, low_open=True, high=1.0)
    h = entropy.detach()
    ranked = active & torch.isfinite(h)  # a NaN / inf entropy (a diverged row) is dropped, not ranked: ranked first,
    vals = h[ranked]  # it made the cut NaN and dropped every token, the loss a silent 0
    n = vals.numel()
    if n == 0:
        return ranked
    k = max(1, math.ceil(rho * n))
    cut = torch.topk(vals, k).values.min()
    return ranked & (h >= cut)
