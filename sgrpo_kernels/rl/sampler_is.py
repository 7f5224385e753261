r"""Sampler-mismatch correction at TRL's level: importance weights of the rollouts against the sampler that drew them
(vLLM's log-probs differ from the trainer's for the same weights), token-, sequence- or geometric-mean-level, each
truncated or masked, and DeepSeek-V3.2's off-policy sequence mask.

With :math:`\delta_{it} = \log\pi_\theta(y_{it}) - \log\mu(y_{it})` on valid tokens (0 elsewhere, and where the
sampler gave NaN, as TRL):

- ``token_*``: :math:`w_{it} = e^{\delta_{it}}`;
- ``sequence_*``: :math:`w_i = e^{\sum_t \delta_{it}}` (TRL: the product of the token ratios);
- ``geometric_*``: :math:`w_i = e^{\frac{1}{|o_i|}\sum_t \delta_{it}}` (the per-token geometric mean; verl's
  ``geometric`` rollout-IS level);
- ``*_truncate``: :math:`\mathrm{clamp}(w, C_{min}, C_{max})`; ``*_mask``: :math:`w` inside
  :math:`[C_{min}, C_{max}]`, 0 outside (a missing bound is no bound).

TRL 1.16's names and defaults: ``vllm_importance_sampling_mode="sequence_mask"``, ``clip_max=3.0``,
``clip_min=None``. The weights are detached and multiply the per-token loss (``token_weights`` of
:func:`~sgrpo_kernels.rl.policy_loss`). ``token_truncate`` with ``clip_min=None`` is
:func:`~sgrpo_kernels.rl.truncated_importance_weights` (the bundled trainer's TIS), bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sgrpo_kernels.validation import check_choice, check_float_tensor, check_number

from .mismatch import _inputs  # the same checks as the token-level TIS

__all__ = ["SAMPLER_IS_MODES", "off_policy_sequence_mask", "sampler_importance_weights"]

SAMPLER_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_truncate",
                    "geometric_mask")  # fmt: skip


def check_is_bounds(mode: str, clip_max: float | None, clip_min: float | None, where: str = "") -> None:
    """TRL's rules, with the field named: bounds are numbers > 0 (``clip_min`` may be 0), ``clip_min < clip_max``,
    and a truncate mode needs at least one of them."""
    check_choice(f"{where}mode", mode, SAMPLER_IS_MODES)
    if clip_max is not None:
        check_number(f"{where}clip_max", clip_max, low=0.0, low_open=True)
    if clip_min is not None:
        check_number(f"{where}clip_min", clip_min, low=0.0)
    if clip_max is not None and clip_min is not None and clip_min >= clip_max:
        raise ValueError(f"{where}clip_min ({clip_min!r}) must be < {where}clip_max ({clip_max!r})")
    if mode.endswith("_truncate") and clip_max is None and clip_min is None:
        raise ValueError(f"{where}mode={mode!r} needs clip_max or clip_min (a truncation with no bound is no "
                         "correction); set clip_max (TRL's default 3.0)")


def sampler_importance_weights(
    trainer_logp: Tensor,
    sampler_logp: Tensor,
    mask: Tensor,
    mode: str = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> Tensor:
    """Importance weights of sampled completions against their sampler (module docstring for the formulas).

    Args:
        trainer_logp: ``[B, T]`` the trainer's log-probs of the sampled tokens at the start of the update (TRL's
            ``old_per_token_logps``).
        sampler_logp: ``[B, T]`` the sampler's (TRL's ``sampling_per_token_logps``); NaN = not scored (weight 1).
        mask: ``[B, T]`` valid tokens (bool, 0/1 or float: non-zero = valid).
        mode: one of :data:`SAMPLER_IS_MODES` (TRL's ``vllm_importance_sampling_mode`` plus ``geometric_*``).
        clip_max / clip_min: :math:`C_{max}` / :math:`C_{min}` (TRL's ``vllm_importance_sampling_clip_max`` /
            ``_clip_min``); None = no bound on that side.

    Returns:
        ``[B, T]`` detached weights in ``trainer_logp``'s dtype; sequence and geometric modes repeat each
        completion's weight on its every position.
    """
    check_is_bounds(mode, clip_max, clip_min)
    lp, mu, valid = _inputs(trainer_logp, sampler_logp, mask)
    diff = torch.where(valid, lp - mu, torch.zeros_like(lp))
    diff = torch.nan_to_num(diff, nan=0.0)  # TRL: a token the sampler could not score is not corrected
    level = mode.split("_")[0]
    if level == "sequence":
        diff = diff.sum(dim=1, keepdim=True).expand_as(lp)
    elif level == "geometric":
        n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(lp.dtype)
        diff = (diff.sum(dim=1, keepdim=True) / n).expand_as(lp)
    w = torch.exp(diff)
    if mode.endswith("_truncate"):
        return w.clamp(min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return w.masked_fill((w < lo) | (w > hi), 0.0)


def off_policy_sequence_mask(
    advantages: Tensor, logp: Tensor, sampler_logp: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    r"""DeepSeek-V3.2's off-policy sequence mask (TRL ``off_policy_mask_threshold``): completion i is kept when
    :math:`A_i \ge 0` or :math:`\frac{1}{\max(1, |o_i|)}\sum_t (\log\mu_{it} - \mathrm{sg}(\log\pi_{it})) \le
    \delta`, i.e. only negative-advantage completions that drifted far from the sampler are dropped.

    Args:
        advantages: ``[B]``; logp: ``[B, T]`` the current policy's log-probs (detached here); sampler_logp: ``[B, T]``
            (NaN = not scored: counts 0); mask: ``[B, T]`` (float values weight the mean, as TRL); threshold:
            :math:`\delta \ge 0`.

    Returns:
        ``[B]`` bool, True = keep.
    """
    threshold = check_number("threshold", threshold, low=0.0)
    lp, mu, valid = _inputs(logp, sampler_logp, mask)
    advantages = check_float_tensor("advantages", advantages, (lp.shape[0],), " ([B], B from logp)")
    m = mask.to(lp.dtype) if mask.dtype != torch.bool else valid.to(lp.dtype)
    kl = torch.nan_to_num(torch.where(valid, mu - lp, torch.zeros_like(lp)), nan=0.0)
    avg = (kl * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
    return (advantages.detach() >= 0) | (avg <= threshold)
