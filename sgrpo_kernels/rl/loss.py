"""The token-level policy loss of the GRPO family, built from named terms (see :class:`LossConfig` for every option):

    _sanitize            the batch on valid positions only (padding can never leak NaN into a gradient)
    _shape_advantages    entropy filter (which completions train), entropy advantage shift, positive_only
    _token_weights       mask x conflict weights x kept completions x top-entropy tokens -> w, active
    _importance_ratio    token ratio or GSPO sequence ratio (inputs restricted to active tokens first)
    _clipped_surrogate   PPO clip / clip-higher / dual clip
    _k3                  the k3 KL estimate against ref_logp
    _aggregate           the five loss aggregation modes
    _entropy_bonus, _entropy_band_penalty
    _compensation        probability compensation C = min(2 - p / p_max, C_max) of the per-token advantage
    _metrics             every metric as a 0-d tensor (no device-to-host sync in the loss)
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from sgrpo_kernels.backends.contract import stats_dtype
from sgrpo_kernels.rl.checks import check_loss_inputs
from sgrpo_kernels.rl.config import IMPORTANCE_LEVELS, LOSS_AGGS, LossConfig
from sgrpo_kernels.rl.entropy import completion_entropy, entropy_threshold, top_entropy_mask
from sgrpo_kernels.rl.field_losses import field_term
from sgrpo_kernels.rl.sampler_is import off_policy_sequence_mask
from sgrpo_kernels.validation import check_float_tensor, check_mask, check_rank, check_same_device

__all__ = ["IMPORTANCE_LEVELS", "LOSS_AGGS", "LossConfig", "metrics_to_floats", "policy_loss"]


def metrics_to_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    """A dict of 0-d tensors (the metrics of :func:`policy_loss`, the stats of ``group_advantages``) as Python floats,
    in one device-to-host copy: call it once per optimizer step, not once per loss."""
    if not metrics:
        return {}
    for key, v in metrics.items():  # (a bare float or a [T] tensor failed inside torch.stack, naming no key)
        if not isinstance(v, Tensor) or v.numel() != 1:
            got = f"shape {tuple(v.shape)}" if isinstance(v, Tensor) else f"{type(v).__name__} {v!r}"
            raise TypeError(f"metrics_to_floats: metrics[{key!r}] is a {got}; expected a 0-d tensor (add Python "
                            "numbers to the dict it returns instead)")
    values = torch.stack([v.detach().to(torch.float64).reshape(()) for v in metrics.values()]).tolist()
    out = dict(zip(metrics, values))
    frac = metrics.get("filtered_frac")
    if frac is not None and frac.device.type != "cpu":  # (on the CPU the loss itself warned: it costs no sync there)
        warn_if_all_filtered(out["filtered_frac"], None, stacklevel=3)
    return out


def warn_if_all_filtered(filtered_frac: float, entropy_filter: object, stacklevel: int) -> None:
    """A UserWarning when the entropy filter removed every (non-empty) completion: the loss is then 0, with no policy
    gradient, which looks like a quiet batch rather than a filter set too low."""
    if filtered_frac >= 1.0:
        which = f" ({entropy_filter!r})" if entropy_filter is not None else ""
        warnings.warn(
            f"the entropy filter{which} removed every completion of the batch (filtered_frac 1.0): the policy loss "
            "is 0 and has no gradient. A completion is kept when its mean token entropy is at most the threshold; ln 2 "
            "removes nearly every completion of a fresh model (and of random hidden states). Use a threshold from "
            "the batch, entropy_filter='quantile:0.75', or entropy_filter=None",
            UserWarning,
            stacklevel=stacklevel,
        )


# ------------------------------------------------------------------------------------------------------- the terms


@dataclass(frozen=True)
class _Batch:
    """logp / entropy on valid positions (0 elsewhere, through `where`: exactly zero gradient there)."""

    m: Tensor  # [B, T] mask in the compute dtype (values weight tokens)
    valid: Tensor  # [B, T] bool
    n_tok: Tensor  # [B] valid tokens per completion
    seq_valid: Tensor  # [B] bool: completion has a valid token
    lp: Tensor  # [B, T]
    h: Tensor | None  # [B, T]
    zero: Tensor  # 0-d, compute dtype


def _sanitize(logp: Tensor, entropy: Tensor | None, mask: Tensor) -> _Batch:
    dt = stats_dtype(logp.dtype)
    zero = torch.zeros((), dtype=dt, device=logp.device)
    m = mask.to(dt)
    valid = m != 0
    n_tok = m.sum(dim=1)
    lp = torch.where(valid, logp.to(dt), zero)
    h = torch.where(valid, entropy.to(dt), zero) if entropy is not None else None
    return _Batch(m=m, valid=valid, n_tok=n_tok, seq_valid=n_tok > 0, lp=lp, h=h, zero=zero)


def _safe(den: Tensor) -> Tensor:
    return torch.where(den > 0, den, torch.ones_like(den))


def _shape_advantages(config: LossConfig, x: _Batch, adv: Tensor, rewards, group_size, vocab_size):
    """-> (advantages [B], keep [B] bool: completions the entropy filter keeps, threshold 0-d (NaN without filter;
    a per-group threshold is reported as its mean over non-empty completions))."""
    keep = torch.ones(adv.shape[0], dtype=torch.bool, device=adv.device)
    thr = torch.tensor(math.nan, dtype=adv.dtype, device=adv.device)
    h_seq = completion_entropy(x.h, x.m) if x.h is not None else None
    if config.entropy_filter is not None:
        thr = entropy_threshold(
            config.entropy_filter, h_seq, x.seq_valid, rewards=rewards, group_size=group_size, vocab_size=vocab_size
        ).to(adv.dtype)
        keep = h_seq <= thr
        if thr.dim() == 1:  # per completion ("coverage")
            n_seq = x.seq_valid.sum().to(adv.dtype)
            mean_thr = torch.where(x.seq_valid, thr, 0.0).sum() / n_seq.clamp(min=1)
            thr = torch.where(n_seq > 0, mean_thr, torch.full_like(mean_thr, math.nan))
    if config.entropy_advantage_shift is not None:
        adv = adv - config.entropy_advantage_shift * h_seq
    if config.positive_only:  # last, so no later shift brings a negative advantage back
        adv = adv.clamp(min=0.0)
    return adv, keep, thr


def _token_weights(config: LossConfig, x: _Batch, token_weights: Tensor | None, keep: Tensor,
                   policy_weights: Tensor | None = None, policy_term: bool = True):
    """-> (w [B, T]: mask x conflict weight x kept completion (x policy weight), 0 on inactive tokens; active [B, T]
    bool). `policy_term`: with the top-entropy mask (TRL's, as its sampler weights: on the policy term alone)."""
    w = x.m
    if token_weights is not None:
        w = w * torch.where(x.valid, token_weights.detach().to(w.dtype), x.zero)
    w = w * keep.to(w.dtype).unsqueeze(1)
    if policy_weights is not None:
        w = w * torch.where(x.valid, policy_weights.detach().to(w.dtype), x.zero)
    active = w != 0
    if policy_term and config.top_entropy_quantile is not None:
        active = top_entropy_mask(x.h, active, config.top_entropy_quantile)
        w = torch.where(active, w, x.zero)
    return w, active


def _importance_ratio(config: LossConfig, lp: Tensor, old: Tensor, seq_lr: Tensor) -> Tensor:
    r"""Token :math:`e^{\log\pi - \log\pi^{old}}` or the GSPO sequence ratio in token form
    :math:`sg(s_i)\,\pi/sg(\pi)` with :math:`\log s_i` = ``seq_lr``; log-ratios clamped to ``log_ratio_clip``."""
    c = config.log_ratio_clip
    if config.importance_level == "token":
        return torch.exp((lp - old).clamp(-c, c))
    return torch.exp(seq_lr.clamp(-c, c)).unsqueeze(1) * torch.exp(lp - lp.detach())


def _old_logp(x: _Batch, old_logp: Tensor | None) -> Tensor:
    """Behaviour-policy log-probs on valid positions; on-policy (None): sg(log pi)."""
    return torch.where(x.valid, old_logp.detach().to(x.lp.dtype), x.zero) if old_logp is not None else x.lp.detach()


def _seq_log_ratio(x: _Batch, old: Tensor) -> Tensor:
    """GSPO: the mean log-ratio of each completion over its valid tokens (detached)."""
    return ((x.lp.detach() - old) * x.m).sum(dim=1) / _safe(x.n_tok)


def _compensation(config: LossConfig, x: _Batch, max_logprob: Tensor, adv: Tensor) -> Tensor:
    """C [B, T] = min(2 - p_t / p_max, C_max) on the compensated tokens (valid; and A_i > 0 for "positive"), 1
    elsewhere; p_t / p_max = exp(log p_t - log p_max) from detached inputs (<= 1 up to rounding, so C >= 1)."""
    mx = torch.where(x.valid, max_logprob.detach().to(x.lp.dtype), x.zero)
    ratio = torch.exp((x.lp.detach() - mx).clamp(max=0.0))  # p_t <= p_max; clamp the rounding of equal ones
    c = (2.0 - ratio).clamp(max=config.compensation_cap)
    on = x.valid if config.prob_compensation == "all" else x.valid & (adv > 0).unsqueeze(1)
    return torch.where(on, c, torch.ones_like(c))


def _clipped_surrogate(config: LossConfig, a: Tensor, ratio: Tensor) -> tuple[Tensor, Tensor]:
    """-> (per-token PPO term [B, T], dual-clipped [B, T] bool). `a` is the advantage as [B, 1]."""
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - config.epsilon_low, 1.0 + config.epsilon_high))
    dual = torch.zeros_like(pg, dtype=torch.bool)
    if config.dual_clip is not None:
        capped = -a * config.dual_clip
        dual = (a < 0) & (pg > capped)
        pg = torch.where(a < 0, torch.minimum(pg, capped), pg)
    return pg, dual


def _k3(config: LossConfig, lp: Tensor, ref: Tensor) -> Tensor:
    """k3 = e^d - d - 1 with d = ref - logp (clamped to log_ratio_clip): an unbiased, >= 0 estimate of KL."""
    d = (ref - lp).clamp(-config.log_ratio_clip, config.log_ratio_clip)
    return torch.exp(d) - d - 1.0


def _conflict_count_norm(x: _Batch, weighted: Tensor, token_weights, conflict_counts) -> Tensor:
    """The official GTPO code's per-completion division by max(1, n_conflict_i)."""
    if conflict_counts is None:
        tw = token_weights.detach().to(x.m.dtype) if token_weights is not None else torch.ones_like(x.m)
        counts = (x.valid & (tw != 1)).sum(dim=1).to(x.m.dtype)
    else:
        counts = conflict_counts.to(device=x.m.device, dtype=x.m.dtype)
    return weighted / counts.clamp(min=1).unsqueeze(1)


def _aggregate(v: Tensor, m: Tensor, agg: str, max_len: int | None) -> Tensor:
    """Aggregate a per-token quantity v[B, T] (already 0 on inactive tokens) with mask-based denominators."""
    n_tok = m.sum(dim=1)
    if agg == "token-mean":
        return v.sum() / _safe(m.sum())
    if agg == "token-sum":
        return v.sum()
    if agg == "seq-mean-token-sum-norm":
        b, t = v.shape
        return v.sum() / float(max(1, b) * (max_len if max_len is not None else max(1, t)))
    seq_valid = (n_tok > 0).to(v.dtype)
    if agg == "seq-mean-token-sum":
        return (v.sum(dim=1) * seq_valid).sum() / _safe(seq_valid.sum())
    per_seq = v.sum(dim=1) / _safe(n_tok)
    if agg == "seq-sum-token-mean":
        return per_seq.sum()
    return per_seq.sum() / _safe(seq_valid.sum())  # seq-mean-token-mean


def _entropy_bonus(config: LossConfig, x: _Batch, active: Tensor) -> Tensor:
    """-entropy_coef * agg(H) over active tokens, with the policy term's denominators."""
    h_act = torch.where(active, x.m * x.h, x.zero)
    return -config.entropy_coef * _aggregate(h_act, x.m, config.loss_agg, config.max_completion_length)


def _entropy_band_penalty(config: LossConfig, x: _Batch, active: Tensor) -> Tensor:
    """coef * (max(0, H_min - Hbar) + max(0, Hbar - H_max)), Hbar the mean entropy of active tokens (0 without any)."""
    m_act = torch.where(active, x.m, x.zero)
    h_bar = torch.where(active, x.m * x.h, x.zero).sum() / _safe(m_act.sum())
    pen = x.zero
    if config.entropy_floor is not None:
        pen = pen + torch.relu(config.entropy_floor - h_bar)
    if config.entropy_ceiling is not None:
        pen = pen + torch.relu(h_bar - config.entropy_ceiling)
    pen = torch.where(m_act.sum() > 0, pen, x.zero)  # no active token: h_bar is 0 there, not an entropy
    return config.entropy_penalty_coef * pen


# --------------------------------------------------------------------------------------------------- the loss


def policy_loss(
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    *,
    entropy: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    token_weights: Tensor | None = None,
    conflict_counts: Tensor | None = None,
    rewards: Tensor | None = None,
    group_size: int | None = None,
    vocab_size: int | None = None,
    max_logprob: Tensor | None = None,
    sampler_logp: Tensor | None = None,
    generator: torch.Generator | None = None,
    policy_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""The GRPO-family policy loss of B completions of length T (see :class:`LossConfig` for every term).

    .. math::
        L = \mathrm{agg}_{loss\_agg}\bigl(w_{it}\,[\ell_{it} + \beta k_{3,it}]\bigr)
            - c_H\,\mathrm{agg}(H_{it}) + c_P\,[\max(0, H_{min} - \bar H) + \max(0, \bar H - H_{max})]

    with :math:`w_{it} = m_{it}\,\lambda_{it}\,\mathbb{1}[\langle H\rangle_i \le H_{thr}]\,\mathbb{1}[\text{top-}\rho]`
    and the advantage :math:`A_i` (``max(A_i, 0)`` when positive_only, minus :math:`\gamma\langle H\rangle_i` with
    the entropy advantage shift); the top-rho mask, the off-policy mask and ``policy_weights`` weigh :math:`\ell` alone
    (TRL's order: the KL term is added after them). Masked tokens, zero-weight tokens and filtered completions give
    exactly zero gradient to ``logp`` and ``entropy``.

    Sources: PPO clip (Schulman et al. 2017), GRPO (DeepSeekMath, arXiv 2402.03300), DAPO clip-higher and token-mean
    (arXiv 2503.14476), Dr. GRPO (arXiv 2503.20783), GSPO (arXiv 2507.18071), dual clip (verl ``clip_ratio_c``), k3 KL
    (Schulman's estimator; TRL ``beta``), GTPO (arXiv 2508.03772 and its official code); implementations follow TRL
    ``GRPOTrainer`` and verl ``core_algos``.

    Args:
        logp: ``[B, T]`` float log-probs of the sampled tokens under the current policy (differentiable).
        advantages: ``[B]`` float (detached inside).
        mask: ``[B, T]`` bool or float (non-zero = completion token; float values weight tokens).
        config: a :class:`LossConfig`.
        entropy: ``[B, T]`` float token entropies (differentiable); required when ``config.needs_entropy``.
        old_logp: ``[B, T]`` behaviour-policy log-probs; None means on-policy, ratio :math:`e^{\log\pi - sg(\log\pi)}`.
        ref_logp: ``[B, T]`` reference log-probs; required when ``config.beta > 0``.
        token_weights: ``[B, T]`` float multiplicative weights (conflict weights), detached inside; finite and >= 0
            on valid tokens (a negative weight flips the update's direction). Not checked here (the loss makes no
            host sync); :func:`conflict_weights` and ``LossConfig`` refuse negative factors.
        conflict_counts: ``[B]`` counts from :func:`conflict_weights`, used when ``config.conflict_count_norm``
            (default: the number of valid tokens whose weight is not 1).
        rewards, group_size, vocab_size: only for ``entropy_filter="adaptive"`` or ``"coverage"`` (rewards ``[B]``).
        max_logprob: ``[B, T]`` log p_max per position (``linear_logprobs(..., return_max_logprob=True)``), detached
            inside; required when ``config.prob_compensation`` is set.
        sampler_logp: ``[B, T]`` the sampler's log-probs, for ``config.off_policy_mask_threshold`` (default:
            ``old_logp``).
        generator: the random draw of ``policy_term="clip_cov"`` (default: torch's global generator).
        policy_weights: ``[B, T]`` float weights >= 0 of the policy term alone, detached inside: a sampler
            correction's importance weights as TRL and verl apply them. Like ``off_policy_mask_threshold`` and
            ``top_entropy_quantile`` (TRL's order) they leave the KL term (``beta``) unweighted.

    Returns:
        ``(loss, metrics)``: a 0-d tensor and a dict of 0-d tensors (no device-to-host sync;
        :func:`metrics_to_floats` converts them in one copy): ``loss``, ``pg_loss``, ``kl_loss``, ``entropy_loss``,
        ``clip_frac_low`` / ``clip_frac_high`` / ``dual_clip_frac`` (fractions of active tokens),
        ``ratio_mean/min/max`` (valid tokens), ``entropy_mean`` (valid tokens, NaN without entropy), ``kl`` (mean k3
        over valid tokens, 0 without ref_logp), ``zero_weight_frac`` (valid tokens with zero weight), ``filtered_frac``
        (non-empty completions filtered), ``entropy_threshold`` (NaN without a filter; ``"coverage"``: the mean of
        the per-group thresholds over non-empty completions), ``adv_mean``, ``adv_std`` (non-empty completions);
        with a ``policy_term`` other than ``"ppo"``, ``policy_term_frac`` (active tokens the term masked, clipped or
        selected); with ``off_policy_mask_threshold``, ``off_policy_masked_frac`` (non-empty completions dropped).
    """
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig (see sgrpo_kernels.rl.preset), got {type(config).__name__}")
    logp = check_float_tensor("logp", logp)
    check_rank("logp", logp, 2, "[B, T]")
    mask = check_mask("mask", mask, tuple(logp.shape), " (the [B, T] of logp)")
    check_same_device("mask", mask, logp, "logp")
    adv = check_loss_inputs(config, advantages, logp, "logp", entropy=entropy, old_logp=old_logp, ref_logp=ref_logp,
                            token_weights=token_weights, conflict_counts=conflict_counts, max_logprob=max_logprob,
                            sampler_logp=sampler_logp, policy_weights=policy_weights)
    return checked_policy_loss(logp, adv, mask, config, entropy=entropy, old_logp=old_logp, ref_logp=ref_logp,
                               token_weights=token_weights, conflict_counts=conflict_counts, rewards=rewards,
                               group_size=group_size, vocab_size=vocab_size, max_logprob=max_logprob,
                               sampler_logp=sampler_logp, generator=generator, policy_weights=policy_weights)


def checked_policy_loss(logp, adv, mask, config, *, entropy, old_logp, ref_logp, token_weights, conflict_counts,
                        rewards, group_size, vocab_size, max_logprob, sampler_logp, generator, policy_weights=None):
    """`policy_loss` on inputs already checked (`check_loss_inputs` and the mask's check: one host sync at most)."""
    x = _sanitize(logp, entropy, mask)
    adv, keep, thr = _shape_advantages(config, x, adv.detach().to(x.m.dtype), rewards, group_size, vocab_size)
    opm = None
    if config.off_policy_mask_threshold is not None and (sampler_logp is not None or old_logp is not None):
        mu = sampler_logp if sampler_logp is not None else old_logp
        opm = off_policy_sequence_mask(adv, x.lp, mu, x.m, config.off_policy_mask_threshold)
    w, active = _token_weights(config, x, token_weights, keep if opm is None else keep & opm, policy_weights)
    old = _old_logp(x, old_logp)
    ref = torch.where(x.valid, ref_logp.detach().to(x.lp.dtype), x.zero) if ref_logp is not None else None
    seq_lr = _seq_log_ratio(x, old) if config.importance_level == "sequence" else None

    # The loss terms see only active tokens: every input is replaced by 0 elsewhere *before* any arithmetic, so an
    # inactive position receives exactly zero gradient whatever sits there (a NaN advantage on a filtered completion,
    # NaN reference log-probs under a zero weight): where() on the output alone would give 0 * NaN = NaN gradients.
    def on_active(v: Tensor) -> Tensor:
        return torch.where(active, v, x.zero)

    lp_a, a = on_active(x.lp), on_active(adv.unsqueeze(1))
    if config.prob_compensation is not None:
        a = a * _compensation(config, x, max_logprob, adv)
    if config.policy_term == "ppo":
        ratio = _importance_ratio(config, lp_a, on_active(old), seq_lr)
        per_tok, dual = _clipped_surrogate(config, a, ratio)
        flagged = None
    else:
        per_tok, ratio, flagged = field_term(config, lp_a, on_active(old), a, torch.where(active, x.m, x.zero), active,
                                             x.zero, generator)
        dual = torch.zeros_like(active)
    kl_term = None
    if ref is not None and config.beta > 0:
        if opm is None and policy_weights is None and config.top_entropy_quantile is None:
            per_tok = per_tok + config.beta * _k3(config, lp_a, on_active(ref))
        else:  # TRL's order: its masks and sampler weights act on the policy term, the KL is added after them
            w_kl, act_kl = _token_weights(config, x, token_weights, keep, policy_term=False)
            k3 = _k3(config, torch.where(act_kl, x.lp, x.zero), torch.where(act_kl, ref, x.zero))
            kl_term = torch.where(act_kl, w_kl * (config.beta * k3), x.zero)

    weighted = torch.where(active, w * per_tok, x.zero)
    if kl_term is not None:
        weighted = weighted + kl_term
    if config.conflict_count_norm:
        weighted = _conflict_count_norm(x, weighted, token_weights, conflict_counts)
    pg_loss = _aggregate(weighted, x.m, config.loss_agg, config.max_completion_length)

    entropy_loss = x.zero
    if x.h is not None and config.entropy_coef != 0.0:
        entropy_loss = entropy_loss + _entropy_bonus(config, x, active)
    has_band = config.entropy_floor is not None or config.entropy_ceiling is not None
    if x.h is not None and has_band and config.entropy_penalty_coef != 0.0:
        entropy_loss = entropy_loss + _entropy_band_penalty(config, x, active)
    loss = pg_loss + entropy_loss

    # metrics over valid tokens, from the detached valid-position inputs
    ratio_valid = _importance_ratio(config, x.lp.detach(), old, seq_lr).detach()
    k3_valid = _k3(config, x.lp.detach(), ref) if ref is not None else None
    metrics = _metrics(config, x, loss, pg_loss, entropy_loss, ratio_valid, ratio.detach(), a, adv, active, keep, dual,
                       w, k3_valid, thr)
    if flagged is not None:
        metrics["policy_term_frac"] = (flagged & active).sum().to(x.zero.dtype) / _safe(active.sum().to(x.zero.dtype))
    if opm is not None:
        n_seq = x.seq_valid.sum().to(x.zero.dtype)
        metrics["off_policy_masked_frac"] = (x.seq_valid & ~opm).sum().to(x.zero.dtype) / _safe(n_seq)
    if config.entropy_filter is not None and keep.device.type == "cpu":  # free on the CPU; elsewhere: metrics_to_floats
        warn_if_all_filtered(float(metrics["filtered_frac"]), config.entropy_filter, stacklevel=_caller_level())
    return loss, metrics


def _caller_level() -> int:
    """The stacklevel of the first frame outside the RL layer and the fused loss (the user's call: a warning shows
    once per call site)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("sgrpo_kernels.rl"):
        frame, level = frame.f_back, level + 1
    return level + 1


def _metrics(config: LossConfig, x: _Batch, loss: Tensor, pg_loss: Tensor, entropy_loss: Tensor, ratio_valid: Tensor,
             ratio: Tensor, a: Tensor, adv: Tensor, active: Tensor, keep: Tensor, dual: Tensor, w: Tensor,
             k3: Tensor | None, thr: Tensor) -> dict[str, Tensor]:
    """Every metric of :func:`policy_loss` as a 0-d tensor of the compute dtype. `ratio_valid` / `k3` hold every
    valid token; `ratio` and the per-token advantage `a` are the loss-side values (0 / 1 off the active tokens)."""
    dt, valid, seq_valid = ratio.dtype, x.valid, x.seq_valid
    nan = torch.tensor(math.nan, dtype=dt, device=ratio.device)
    n_valid, n_active, n_seq = valid.sum().to(dt), active.sum().to(dt), seq_valid.sum().to(dt)

    def frac(sel: Tensor, den: Tensor) -> Tensor:
        return sel.sum().to(dt) / _safe(den)

    def vmean(v: Tensor) -> Tensor:
        return torch.where(n_valid > 0, torch.where(valid, v, 0.0).sum() / n_valid.clamp(min=1), nan)

    def vextreme(v: Tensor, fill: float, reduce) -> Tensor:
        # the fill element keeps the reduction defined on B = 0 or T = 0
        fill_t = torch.full((1,), fill, dtype=dt, device=v.device)
        return torch.where(n_valid > 0, reduce(torch.cat([torch.where(valid, v, fill).reshape(-1), fill_t])), nan)

    a_seq = torch.where(seq_valid, adv, 0.0)
    a_mean = a_seq.sum() / n_seq.clamp(min=1)
    kl = vmean(k3) if k3 is not None else torch.zeros((), dtype=dt, device=ratio.device)
    return {
        "loss": loss.detach().to(dt),
        "pg_loss": pg_loss.detach().to(dt),
        "kl_loss": (config.beta * kl).to(dt),
        "entropy_loss": entropy_loss.detach().to(dt),
        "clip_frac_low": frac(active & (ratio < 1.0 - config.epsilon_low) & (a < 0), n_active),
        "clip_frac_high": frac(active & (ratio > 1.0 + config.epsilon_high) & (a > 0), n_active),
        "dual_clip_frac": frac(dual & active, n_active),
        "ratio_mean": vmean(ratio_valid),
        "ratio_min": vextreme(ratio_valid, math.inf, torch.min),
        "ratio_max": vextreme(ratio_valid, -math.inf, torch.max),
        "entropy_mean": vmean(x.h.detach()) if x.h is not None else nan,
        "kl": kl,
        "zero_weight_frac": frac(valid & (w == 0), n_valid),
        "filtered_frac": frac(seq_valid & ~keep, n_seq),
        "entropy_threshold": thr.to(dt),
        "adv_mean": a_mean,
        "adv_std": (torch.where(seq_valid, (adv - a_mean) ** 2, 0.0).sum() / n_seq.clamp(min=1)).sqrt(),
    }
