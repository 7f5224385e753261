r"""The policy terms the field runs besides PPO's clip (``LossConfig.policy_term``), per token, with the formulas of
verl 0.9.1's registered policy losses (``verl.trainer.ppo.core_algos``) and TRL 1.16's ``loss_type`` where TRL has the
method. Each function returns the per-token loss (aggregated afterwards by :func:`~sgrpo_kernels.rl.policy_loss`
with ``loss_agg``), the token ratio (for the metrics) and the tokens the term clipped, masked or selected.

Notation: :math:`\lambda_{t} = \mathrm{clamp}(\log\pi_t - \log\pi^{old}_t, \pm c)` (``log_ratio_clip``),
:math:`r_t = e^{\lambda_t}`, :math:`A` the advantage, :math:`\epsilon_l, \epsilon_h` = ``epsilon_low`` /
``epsilon_high``, sg = stop-gradient.

- ``dppo_tv`` / ``dppo_kl`` (DPPO, Qi et al., arXiv 2602.04879): :math:`\ell_t = -A\,\mathrm{sg}(\min(r_t, C))\,
  \log\pi_t\,\mathbb{1}[\text{in region}]` with :math:`C` = ``dppo_ratio_cap``; the region for :math:`A > 0` is
  :math:`\pi_t - \pi^{old}_t \le \epsilon_h` (TV) or :math:`D_t \le \epsilon_h \lor \pi_t \le \pi^{old}_t` (KL), for
  :math:`A \le 0` :math:`\pi_t - \pi^{old}_t \ge -\epsilon_l` (TV) or :math:`D_t \le \epsilon_l \lor \pi_t \ge
  \pi^{old}_t` (KL), with the binary KL :math:`D_t = p\log\frac{p}{q} + (1-p)\log\frac{1-p+10^{-8}}{1-q+10^{-8}}`,
  :math:`p = \pi^{old}_t, q = \pi_t`.
- ``cispo`` (MiniMax-M1, arXiv 2506.13585): :math:`\ell_t = -\mathrm{sg}(\mathrm{clamp}(r_t, 1-\epsilon_l,
  1+\epsilon_h))\,A\,\log\pi_t`; ``epsilon_low=1`` is no lower bound (TRL's form with ``epsilon_high = C - 1``).
- ``sapo`` (SAPO, arXiv 2511.20347): :math:`\ell_t = -\frac{4}{\tau}\sigma(\tau(r_t - 1))\,A`, :math:`\tau` =
  ``sapo_tau_pos`` where :math:`A > 0`, else ``sapo_tau_neg``.
- ``gmpo`` (GMPO, arXiv 2507.20673; verl ``geo_mean``): per completion :math:`\ell_i = -A\,\exp\big(\frac{1}{|o_i|}
  \sum_t \mathrm{sgn}(A)\min(\mathrm{sgn}(A)\lambda_t, \mathrm{sgn}(A)\,\mathrm{clamp}(\lambda_t, -\epsilon_l,
  \epsilon_h))\big)`, written per token as :math:`\ell_{it} = \ell_i` (a token mean gives :math:`\ell_i` back).
- ``clip_cov`` (Cui et al., arXiv 2505.22617): PPO's clipped term; among tokens PPO did not clip whose covariance
  :math:`(A_t - \bar A)(\log\pi_t - \overline{\log\pi})` lies in (``clip_cov_lb``, ``clip_cov_ub``),
  :math:`\max(1, \lfloor \rho N \rfloor)` drawn at random (``cov_ratio`` :math:`\rho`, N active tokens) get no
  gradient (their loss is 0). The draw is ``torch.randperm`` of the eligible tokens in row-major order with the
  given generator (the global one when None, as verl).
- ``kl_cov`` (same paper): :math:`\ell_t = -A\,r_t`, plus ``kl_cov_coef`` :math:`\cdot|\lambda_t|` on the
  :math:`\max(1, \lfloor \rho N \rfloor)` tokens of largest covariance.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["POLICY_TERMS", "TERM_FIELDS", "field_term"]

POLICY_TERMS = ("ppo", "dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")

# the LossConfig fields each term reads beyond epsilon_low / epsilon_high / log_ratio_clip (refused elsewhere)
TERM_FIELDS = {
    "dppo_ratio_cap": ("dppo_tv", "dppo_kl"),
    "sapo_tau_pos": ("sapo",),
    "sapo_tau_neg": ("sapo",),
    "cov_ratio": ("clip_cov", "kl_cov"),
    "clip_cov_lb": ("clip_cov",),
    "clip_cov_ub": ("clip_cov",),
    "kl_cov_coef": ("kl_cov",),
}


def _log_ratio(config, lp: Tensor, old: Tensor) -> Tensor:
    return (lp - old).clamp(-config.log_ratio_clip, config.log_ratio_clip)


def _dppo(config, lp: Tensor, old: Tensor, a: Tensor, active: Tensor, zero: Tensor) -> tuple[Tensor, Tensor]:
    ratio = torch.exp(_log_ratio(config, lp, old))
    w = ratio.clamp(max=config.dppo_ratio_cap).detach()
    q, p = torch.exp(lp.detach()), torch.exp(old)
    if config.policy_term == "dppo_tv":
        pos, neg = (q - p) <= config.epsilon_high, (q - p) >= -config.epsilon_low
    else:
        kl = p * (old - lp.detach()) + (1 - p) * torch.log((1.0 - p + 1e-8) / (1.0 - q + 1e-8))
        pos = (kl <= config.epsilon_high) | (q <= p)
        neg = (kl <= config.epsilon_low) | (q >= p)
    keep = torch.where(a > 0, pos, neg) & active
    return torch.where(keep, -a * w * lp, zero), active & ~keep


def _cispo(config, lp: Tensor, old: Tensor, a: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    ratio = torch.exp(_log_ratio(config, lp, old)).detach()
    w = ratio.clamp(1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    return -w * a * lp, active & (ratio != w)


def _sapo(config, ratio: Tensor, a: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    tau = torch.where(a > 0, config.sapo_tau_pos, config.sapo_tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * a, torch.zeros_like(active)


def _gmpo(config, lp: Tensor, old: Tensor, a: Tensor, m_act: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    lr = _log_ratio(config, lp, old)
    sgn = torch.sign(a)
    lr_c = lr.clamp(-config.epsilon_low, config.epsilon_high)
    lr_min = sgn * torch.minimum(sgn * lr, sgn * lr_c)
    n = m_act.sum(dim=1)
    seq = (lr_min * m_act).sum(dim=1) / torch.where(n > 0, n, torch.ones_like(n))
    return -a * torch.exp(seq).unsqueeze(1), active & (lr.detach() != lr_c.detach())


def _covariance(a: Tensor, lp: Tensor, weights: Tensor) -> Tensor:
    """(A_t - mean A)(logp_t - mean logp) with means weighted by `weights` over the active tokens (detached)."""
    den = weights.sum().clamp(min=torch.finfo(weights.dtype).tiny)
    a_t = a.detach().expand_as(lp)
    return (a_t - (a_t * weights).sum() / den) * (lp.detach() - (lp.detach() * weights).sum() / den)


def _clip_cov(config, lp, old, a, m_act, active, generator) -> tuple[Tensor, Tensor]:
    ratio = torch.exp(_log_ratio(config, lp, old))
    pg1 = -a * ratio
    pg2 = -a * ratio.clamp(1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    clipped = (pg2 > pg1) & active
    cov = _covariance(a, lp, m_act)
    eligible = active & ~clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    k = max(int(config.cov_ratio * float(m_act.sum())), 1)
    idx = torch.nonzero(eligible)  # row-major, as verl
    chosen = torch.zeros_like(active)
    if len(idx) > 0:
        perm = torch.randperm(len(idx), generator=generator)
        pick = idx[perm[: min(k, len(idx))].to(idx.device)]
        chosen[pick[:, 0], pick[:, 1]] = True
    return torch.where(chosen, torch.zeros_like(pg1), torch.maximum(pg1, pg2)), chosen


def _kl_cov(config, lp, old, a, active) -> tuple[Tensor, Tensor]:
    lr = _log_ratio(config, lp, old)
    pg = -a * torch.exp(lr)
    chosen = torch.zeros_like(active)
    flat = torch.nonzero(active.reshape(-1), as_tuple=True)[0]
    if len(flat) > 0:
        a_v = a.detach().expand_as(lp).reshape(-1)[flat]
        lp_v = lp.detach().reshape(-1)[flat]
        cov = (a_v - a_v.mean()) * (lp_v - lp_v.mean())
        k = max(1, int(len(flat) * config.cov_ratio))
        top = flat[torch.topk(cov, k, largest=True).indices]
        chosen.view(-1)[top] = True
    return torch.where(chosen, pg + config.kl_cov_coef * lr.abs(), pg), chosen


def field_term(config, lp: Tensor, old: Tensor, a: Tensor, m_act: Tensor, active: Tensor, zero: Tensor,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The per-token term of ``config.policy_term`` (module docstring).

    Args:
        lp: ``[B, T]`` current log-probs, 0 off the active tokens (differentiable); old: ``[B, T]`` behaviour
            log-probs, 0 off the active tokens (detached); a: the advantage, ``[B, 1]`` or ``[B, T]``, 0 off the
            active tokens; m_act: ``[B, T]`` the mask's values on the active tokens, 0 elsewhere; active: ``[B, T]``
            bool; zero: a 0-d zero of the compute dtype; generator: Clip-Cov's draw.

    Returns:
        ``(per_token_loss [B, T], ratio [B, T] (detached, for the metrics), flagged [B, T] bool)``.
    """
    term = config.policy_term
    ratio = torch.exp(_log_ratio(config, lp.detach(), old))
    if term in ("dppo_tv", "dppo_kl"):
        per_tok, flagged = _dppo(config, lp, old, a, active, zero)
    elif term == "cispo":
        per_tok, flagged = _cispo(config, lp, old, a, active)
    elif term == "sapo":
        per_tok, flagged = _sapo(config, torch.exp(_log_ratio(config, lp, old)), a, active)
    elif term == "gmpo":
        per_tok, flagged = _gmpo(config, lp, old, a, m_act, active)
    elif term == "clip_cov":
        per_tok, flagged = _clip_cov(config, lp, old, a, m_act, active, generator)
    elif term == "kl_cov":
        per_tok, flagged = _kl_cov(config, lp, old, a, active)
    else:
        raise ValueError(f"unknown policy_term {term!r}; expected one of {POLICY_TERMS[1:]} here")
    return per_tok, ratio, flagged
