"""Sampler/trainer mismatch: the rollouts come from an engine (vLLM) whose log-probs differ from the trainer's for the
same weights (other kernels, precision, a stale copy). The mean absolute log-prob gap measures it; truncated importance
sampling (TIS) corrects the policy gradient for it, token by token."""

from __future__ import annotations

import torch
from torch import Tensor

from sgrpo_kernels.validation import check_float_tensor, check_mask, check_number

__all__ = ["logp_mismatch", "truncated_importance_weights"]


def _inputs(trainer_logp: object, sampler_logp: object, mask: object) -> tuple[Tensor, Tensor, Tensor]:
    trainer_logp = check_float_tensor("trainer_logp", trainer_logp)
    if trainer_logp.dim() != 2:
        raise ValueError(f"trainer_logp must be 2-D [B, T], got shape {tuple(trainer_logp.shape)}")
    shape = tuple(trainer_logp.shape)
    sampler_logp = check_float_tensor("sampler_logp", sampler_logp, shape, " (the [B, T] of trainer_logp)")
    mask = check_mask("mask", mask, shape, " (the [B, T] of trainer_logp)")
    return trainer_logp.detach(), sampler_logp.detach().to(trainer_logp.dtype), mask != 0


def truncated_importance_weights(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    r"""Per-token truncated importance weights of off-sampler rollouts (TIS):

    .. math:: w_{it} = \min\!\big(e^{\log\pi_\theta(y_{it}) - \log\mu(y_{it})},\ C\big)

    with :math:`\pi_\theta` the trainer's policy at the start of the update (``trainer_logp``) and :math:`\mu` the
    sampler that drew the tokens (``sampler_logp``); 1 on masked positions. Multiplied into the per-token loss (the
    ``token_weights`` of :func:`~sgrpo_kernels.rl.policy_loss`), it makes the gradient that of samples from
    :math:`\pi_\theta`, with the variance bounded by the cap. Detached: a weight, never differentiated.

    Args:
        trainer_logp, sampler_logp: ``[B, T]`` float log-probs of the sampled tokens; NaN = not scored (weight 1).
        mask: ``[B, T]`` valid tokens (bool, 0/1 or float: non-zero = valid).
        cap: ``C >= 1``.

    Returns:
        ``[B, T]`` weights in ``(0, C]``, ``trainer_logp``'s dtype.
    """
    cap = check_number("cap", cap, low=1.0)
    lp, mu, valid = _inputs(trainer_logp, sampler_logp, mask)
    diff = torch.nan_to_num(torch.where(valid, lp - mu, torch.zeros_like(lp)), nan=0.0)  # as sampler_importance_
    return torch.exp(diff).clamp(max=cap)  # weights: a token the sampler could not score (NaN) is not corrected


def logp_mismatch(trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    r"""Mean absolute log-prob gap over valid tokens, :math:`\frac{1}{|m|}\sum_{m_{it}} |\log\pi_\theta - \log\mu|`
    (a 0-d tensor; NaN without a valid token)."""
    lp, mu, valid = _inputs(trainer_logp, sampler_logp, mask)
    diff = torch.where(valid, (lp - mu).abs(), torch.zeros_like(lp))
    n = valid.sum()
    return torch.where(n > 0, diff.sum() / n.clamp(min=1), torch.full_like(diff.sum(), float("nan")))
