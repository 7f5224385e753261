"""LossConfig and the token-level policy loss of the GRPO family (PPO clip, clip-higher, dual clip, GSPO sequence ratio,
k3 KL, conflict weights, entropy filter / bonus / floor / ceiling / advantage shift, loss aggregation modes)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from sgrpo_kernels.rl._checks import (
    check_choice,
    check_float_tensor,
    check_mask,
    check_number,
    check_rank,
    check_same_device,
    check_tensor,
    compute_dtype,
)
from sgrpo_kernels.rl.advantages import ADVANTAGE_METHODS, group_advantages
from sgrpo_kernels.rl.conflicts import COMBINE_MODES, CONFLICT_STRATEGIES, conflict_weights
from sgrpo_kernels.rl.entropy import completion_entropy, entropy_threshold, parse_entropy_filter, top_entropy_mask

__all__ = ["IMPORTANCE_LEVELS", "LOSS_AGGS", "LossConfig", "policy_loss"]

IMPORTANCE_LEVELS = ("token", "sequence")
LOSS_AGGS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-sum-token-mean")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    r"""Everything that defines a GRPO-family objective; presets are instances (:func:`sgrpo_kernels.rl.preset`).

    Override a field with ``dataclasses.replace(config, beta=0.0)``; values are validated on construction.

    Advantages and conflicts (used by a trainer through :meth:`advantages` and :meth:`conflict_weights`):
        advantage_method / advantage_options: arguments of :func:`~sgrpo_kernels.rl.group_advantages`.
        conflict_strategy: None (no conflict weighting) or a strategy of :func:`~sgrpo_kernels.rl.conflict_weights`,
        with ``conflict_w_pos``, ``conflict_w_neg``, ``conflict_combine``.
        conflict_count_norm: divide each completion's loss by ``max(1, n_conflict_i)`` (the official GTPO code; not
        in the paper).

    Policy term, per token: :math:`\ell_{it} = \max(-A_i \rho_{it}, -A_i\,\mathrm{clip}(\rho_{it}, 1-\epsilon_{low},
    1+\epsilon_{high}))`; with ``dual_clip = c``, :math:`\ell_{it} = \min(\ell_{it}, -c A_i)` where :math:`A_i < 0`;
    plus :math:`\beta\,k_3` with :math:`k_3 = e^{ref - \log\pi} - (ref - \log\pi) - 1`.
        beta: KL coefficient (k3 against ``ref_logp``); 0 = reference-free.
        epsilon_low / epsilon_high: PPO clip range (clip-higher when they differ, DAPO).
        dual_clip: None or c > 1 (dual-clip PPO, Ye et al. 2020; verl ``clip_ratio_c``).
        importance_level: ``"token"`` :math:`\rho_{it} = e^{\log\pi_{it} - \log\pi^{old}_{it}}` or ``"sequence"``
        (GSPO) :math:`s_i = \exp(\frac{1}{|o_i|}\sum_t \log\pi_{it} - \log\pi^{old}_{it})`, token form
        :math:`\rho_{it} = \mathrm{sg}(s_i)\,\pi_{it}/\mathrm{sg}(\pi_{it})`.
        log_ratio_clip: the log-ratio is clamped to ``[-c, c]`` before ``exp`` (verl uses 20), and so is
        ``ref - logp`` inside k3.
        loss_agg: ``"seq-mean-token-mean"`` (GRPO: mean over non-empty completions of the per-completion token mean),
        ``"token-mean"`` (DAPO: sum over tokens / number of valid tokens), ``"seq-mean-token-sum"``,
        ``"seq-mean-token-sum-norm"`` (Dr. GRPO / TRL: sum / (B * max_completion_length); T when None),
        ``"seq-sum-token-mean"`` (the official GTPO code: sum over completions of the token mean). Denominators count
        valid (mask) tokens, including zero-weight and filtered ones.
        positive_only: negative advantages set to 0 (policy term only updates positive completions).

    Entropy (H from ``linear_logprobs``; differentiable terms use H, selections use detached H). The entropy terms
    sum over *active* tokens only (valid, non-zero weight, not filtered), so every inactive token gets exactly zero
    gradient:
        entropy_coef: bonus, ``loss -= entropy_coef * agg(H)`` with the same ``loss_agg`` and the same denominators as
        the policy term (verl), i.e. valid tokens: inactive tokens add 0 to the numerator but still count, so the
        bonus shrinks with the masked / filtered fraction exactly as the policy term does. Negative values penalize
        entropy (the GTPO paper's :math:`+\gamma\langle H\rangle`).
        entropy_floor / entropy_ceiling / entropy_penalty_coef: ``loss += coef * (max(0, H_min - Hbar) +
        max(0, Hbar - H_max))`` with Hbar the mean token entropy over active tokens (S-GRPO seed).
        entropy_filter: completions whose mean token entropy :math:`\langle H\rangle_i` exceeds the threshold get zero
        weight: a float, ``"ln2"``, ``"quantile:<q>"`` (q-quantile of the batch's completion entropies) or
        ``"adaptive"`` (:func:`~sgrpo_kernels.rl.adaptive_entropy_threshold`; needs ``rewards``, ``group_size``,
        ``vocab_size``).
        entropy_advantage_shift: gamma of the official GTPO code's :math:`A_i - \gamma \langle H\rangle_i` (detached).
        top_entropy_quantile: rho; only the top-rho fraction of active tokens by entropy is trained (80/20 paper).
    """

    name: str = "custom"
    advantage_method: str = "grpo"
    advantage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    conflict_strategy: str | None = None
    conflict_w_pos: float = 2.0
    conflict_w_neg: float = 0.0
    conflict_combine: str = "product"
    conflict_count_norm: bool = False
    beta: float = 0.0
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = None
    importance_level: str = "token"
    log_ratio_clip: float = 20.0
    loss_agg: str = "seq-mean-token-mean"
    max_completion_length: int | None = None
    positive_only: bool = False
    entropy_coef: float = 0.0
    entropy_floor: float | None = None
    entropy_ceiling: float | None = None
    entropy_penalty_coef: float = 0.0
    entropy_filter: float | str | None = None
    entropy_advantage_shift: float | None = None
    top_entropy_quantile: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"LossConfig.name must be a string, got {type(self.name).__name__}")
        check_choice("LossConfig.advantage_method", self.advantage_method, ADVANTAGE_METHODS)
        if not isinstance(self.advantage_options, Mapping):
            raise TypeError(f"LossConfig.advantage_options must be a mapping, got {type(self.advantage_options)}")
        if self.conflict_strategy is not None:
            check_choice("LossConfig.conflict_strategy", self.conflict_strategy, CONFLICT_STRATEGIES)
        check_number("LossConfig.conflict_w_pos", self.conflict_w_pos)
        check_number("LossConfig.conflict_w_neg", self.conflict_w_neg)
        check_choice("LossConfig.conflict_combine", self.conflict_combine, COMBINE_MODES)
        for flag in ("conflict_count_norm", "positive_only"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"LossConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        check_number("LossConfig.beta", self.beta, low=0.0)
        check_number("LossConfig.epsilon_low", self.epsilon_low, low=0.0, high=1.0, high_open=True)
        check_number("LossConfig.epsilon_high", self.epsilon_high, low=0.0)
        if self.dual_clip is not None:
            check_number("LossConfig.dual_clip", self.dual_clip, low=1.0, low_open=True)
        check_choice("LossConfig.importance_level", self.importance_level, IMPORTANCE_LEVELS)
        check_number("LossConfig.log_ratio_clip", self.log_ratio_clip, low=0.0, low_open=True)
        check_choice("LossConfig.loss_agg", self.loss_agg, LOSS_AGGS)
        mcl = self.max_completion_length
        if mcl is not None and (isinstance(mcl, bool) or not isinstance(mcl, int) or mcl < 1):
            raise ValueError(f"LossConfig.max_completion_length must be None or an int >= 1, got {mcl!r}")
        check_number("LossConfig.entropy_coef", self.entropy_coef)
        if self.entropy_floor is not None:
            check_number("LossConfig.entropy_floor", self.entropy_floor, low=0.0)
        if self.entropy_ceiling is not None:
            check_number("LossConfig.entropy_ceiling", self.entropy_ceiling, low=0.0)
        floor, ceiling = self.entropy_floor, self.entropy_ceiling
        if floor is not None and ceiling is not None and floor > ceiling:
            raise ValueError(
                f"LossConfig.entropy_floor ({self.entropy_floor}) must be <= "
                f"LossConfig.entropy_ceiling ({self.entropy_ceiling})"
            )
        check_number("LossConfig.entropy_penalty_coef", self.entropy_penalty_coef, low=0.0)
        if self.entropy_filter is not None:
            parse_entropy_filter(self.entropy_filter)
        if self.entropy_advantage_shift is not None:
            check_number("LossConfig.entropy_advantage_shift", self.entropy_advantage_shift)
        if self.top_entropy_quantile is not None:
            check_number("LossConfig.top_entropy_quantile", self.top_entropy_quantile, low=0.0, low_open=True, high=1.0)

    @property
    def needs_entropy(self) -> bool:
        """Whether :func:`policy_loss` needs the ``entropy`` argument for this config."""
        return (
            self.entropy_coef != 0.0
            or (self.entropy_penalty_coef != 0.0 and (self.entropy_floor, self.entropy_ceiling) != (None, None))
            or self.entropy_filter is not None
            or self.entropy_advantage_shift is not None
            or self.top_entropy_quantile is not None
        )

    @property
    def needs_ref(self) -> bool:
        """Whether :func:`policy_loss` needs ``ref_logp`` (beta > 0)."""
        return self.beta > 0.0

    def advantages(
        self, rewards: Tensor, group_size: int, *, return_stats: bool = False
    ) -> Tensor | tuple[Tensor, dict[str, float]]:
        """:func:`~sgrpo_kernels.rl.group_advantages` with this config's method and options."""
        return group_advantages(
            rewards, group_size, self.advantage_method, return_stats=return_stats, **dict(self.advantage_options)
        )

    def conflict_weights(
        self, completion_ids: Tensor, completion_mask: Tensor, advantages: Tensor, group_size: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """:func:`~sgrpo_kernels.rl.conflict_weights` with this config's strategy, or ``(None, None)`` without one."""
        if self.conflict_strategy is None:
            return None, None
        return conflict_weights(
            completion_ids,
            completion_mask,
            advantages,
            group_size,
            self.conflict_strategy,
            w_pos=self.conflict_w_pos,
            w_neg=self.conflict_w_neg,
            combine=self.conflict_combine,
        )


def _safe(den: Tensor) -> Tensor:
    return torch.where(den > 0, den, torch.ones_like(den))


def _aggregate(x: Tensor, m: Tensor, agg: str, max_len: int | None) -> Tensor:
    """Aggregate a per-token quantity x[B, T] (already 0 on inactive tokens) with mask-based denominators."""
    n_tok = m.sum(dim=1)
    if agg == "token-mean":
        return x.sum() / _safe(m.sum())
    if agg == "seq-mean-token-sum-norm":
        b, t = x.shape
        return x.sum() / float(max(1, b) * (max_len if max_len is not None else max(1, t)))
    seq_valid = (n_tok > 0).to(x.dtype)
    if agg == "seq-mean-token-sum":
        return (x.sum(dim=1) * seq_valid).sum() / _safe(seq_valid.sum())
    per_seq = x.sum(dim=1) / _safe(n_tok)
    if agg == "seq-sum-token-mean":
        return per_seq.sum()
    return per_seq.sum() / _safe(seq_valid.sum())  # seq-mean-token-mean


def _check_bt(name: str, x: object, shape: tuple[int, int], ref: Tensor) -> Tensor:
    x = check_float_tensor(name, x, shape, " (the shape of logp)")
    check_same_device(name, x, ref, "logp")
    return x


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
) -> tuple[Tensor, dict[str, float]]:
    r"""The GRPO-family policy loss of B completions of length T (see :class:`LossConfig` for every term).

    .. math::
        L = \mathrm{agg}_{loss\_agg}\bigl(w_{it}\,[\ell_{it} + \beta k_{3,it}]\bigr)
            - c_H\,\mathrm{agg}(H_{it}) + c_P\,[\max(0, H_{min} - \bar H) + \max(0, \bar H - H_{max})]

    with :math:`w_{it} = m_{it}\,\lambda_{it}\,\mathbb{1}[\langle H\rangle_i \le H_{thr}]\,\mathbb{1}[\text{top-}\rho]`
    and the advantage :math:`A_i` (``max(A_i, 0)`` when positive_only, minus :math:`\gamma\langle H\rangle_i` with
    the entropy advantage shift). Masked tokens, zero-weight tokens and filtered completions give exactly zero
    gradient to ``logp`` and ``entropy``.

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
        token_weights: ``[B, T]`` float multiplicative weights (conflict weights), detached inside.
        conflict_counts: ``[B]`` counts from :func:`conflict_weights`, used when ``config.conflict_count_norm``
            (default: the number of valid tokens whose weight is not 1).
        rewards, group_size, vocab_size: only for ``entropy_filter="adaptive"``.

    Returns:
        ``(loss, metrics)``: a 0-d tensor and a dict of floats: ``loss``, ``pg_loss``, ``kl_loss``, ``entropy_loss``,
        ``clip_frac_low`` / ``clip_frac_high`` / ``dual_clip_frac`` (fractions of active tokens),
        ``ratio_mean/min/max`` (valid tokens), ``entropy_mean`` (valid tokens, NaN without entropy), ``kl`` (mean k3
        over valid tokens, 0 without ref_logp), ``zero_weight_frac`` (valid tokens with zero weight), ``filtered_frac``
        (non-empty completions filtered), ``entropy_threshold`` (NaN without a filter), ``adv_mean``, ``adv_std``
        (non-empty completions).
    """
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig (see sgrpo_kernels.rl.preset), got {type(config).__name__}")
    logp = check_float_tensor("logp", logp)
    check_rank("logp", logp, 2, "[B, T]")
    b, t = logp.shape
    adv_in = check_float_tensor("advantages", advantages, (b,), " ([B], B from logp)")
    check_same_device("advantages", adv_in, logp, "logp")
    mask = check_mask("mask", mask, (b, t), " (the shape of logp)")
    check_same_device("mask", mask, logp, "logp")
    if entropy is not None:
        _check_bt("entropy", entropy, (b, t), logp)
    elif config.needs_entropy:
        raise ValueError(f"entropy [B, T] is required by this config ({config.name!r}: entropy terms or filters)")
    if old_logp is not None:
        _check_bt("old_logp", old_logp, (b, t), logp)
    if ref_logp is not None:
        _check_bt("ref_logp", ref_logp, (b, t), logp)
    elif config.needs_ref:
        raise ValueError(f"ref_logp [B, T] is required when config.beta > 0 (beta = {config.beta})")
    if token_weights is not None:
        _check_bt("token_weights", token_weights, (b, t), logp)
    if conflict_counts is not None:
        check_tensor("conflict_counts", conflict_counts)
        if tuple(conflict_counts.shape) != (b,):
            raise ValueError(f"conflict_counts has shape {tuple(conflict_counts.shape)}, expected ({b},)")

    dt = compute_dtype(logp)
    zero = torch.zeros((), dtype=dt, device=logp.device)
    m = mask.to(dt)
    valid = m != 0
    n_tok = m.sum(dim=1)
    seq_valid = n_tok > 0
    # Sanitize every input on invalid positions first: torch.where gives exactly zero gradient there, and no NaN or
    # inf from padding can leak into a product's backward.
    lp = torch.where(valid, logp.to(dt), zero)
    h = torch.where(valid, entropy.to(dt), zero) if entropy is not None else None

    adv = adv_in.detach().to(dt)

    keep = torch.ones(b, dtype=torch.bool, device=logp.device)
    thr = torch.tensor(math.nan, dtype=dt, device=logp.device)
    h_seq = completion_entropy(h, m) if h is not None else None
    if config.entropy_filter is not None:
        thr = entropy_threshold(
            config.entropy_filter, h_seq, seq_valid, rewards=rewards, group_size=group_size, vocab_size=vocab_size
        ).to(dt)
        keep = h_seq <= thr
    if config.entropy_advantage_shift is not None:
        adv = adv - config.entropy_advantage_shift * h_seq
    if config.positive_only:  # last, so no later shift brings a negative advantage back
        adv = adv.clamp(min=0.0)

    w = m
    if token_weights is not None:
        w = w * torch.where(valid, token_weights.detach().to(dt), zero)
    w = w * keep.to(dt).unsqueeze(1)
    active = w != 0
    if config.top_entropy_quantile is not None:
        active = top_entropy_mask(h, active, config.top_entropy_quantile)
        w = torch.where(active, w, zero)

    # importance ratio
    clip_c = config.log_ratio_clip
    old = torch.where(valid, old_logp.detach().to(dt), zero) if old_logp is not None else lp.detach()
    log_ratio = lp - old
    if config.importance_level == "token":
        ratio = torch.exp(log_ratio.clamp(-clip_c, clip_c))
    else:
        seq_lr = (log_ratio.detach() * m).sum(dim=1) / _safe(n_tok)
        seq_ratio = torch.exp(seq_lr.clamp(-clip_c, clip_c))
        ratio = seq_ratio.unsqueeze(1) * torch.exp(lp - lp.detach())
    a = adv.unsqueeze(1)
    lo, hi = 1.0 - config.epsilon_low, 1.0 + config.epsilon_high
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(lo, hi))
    dual = torch.zeros_like(active)
    if config.dual_clip is not None:
        capped = -a * config.dual_clip
        dual = (a < 0) & (pg > capped)
        pg = torch.where(a < 0, torch.minimum(pg, capped), pg)

    per_tok = pg
    k3 = None
    if ref_logp is not None:
        ref = torch.where(valid, ref_logp.detach().to(dt), zero)
        d = (ref - lp).clamp(-clip_c, clip_c)
        k3 = torch.exp(d) - d - 1.0
        if config.beta > 0:
            per_tok = per_tok + config.beta * k3

    weighted = torch.where(active, w * per_tok, zero)
    if config.conflict_count_norm:
        if conflict_counts is None:
            tw = token_weights.detach().to(dt) if token_weights is not None else torch.ones_like(m)
            counts = (valid & (tw != 1)).sum(dim=1).to(dt)
        else:
            counts = conflict_counts.to(device=logp.device, dtype=dt)
        weighted = weighted / counts.clamp(min=1).unsqueeze(1)
    pg_loss = _aggregate(weighted, m, config.loss_agg, config.max_completion_length)
    loss = pg_loss

    entropy_loss = zero
    if h is not None and config.entropy_coef != 0.0:
        h_act = torch.where(active, m * h, zero)
        entropy_loss = entropy_loss - config.entropy_coef * _aggregate(
            h_act, m, config.loss_agg, config.max_completion_length
        )
    has_floor = config.entropy_floor is not None or config.entropy_ceiling is not None
    if h is not None and has_floor and config.entropy_penalty_coef != 0.0:
        m_act = torch.where(active, m, zero)
        h_bar = torch.where(active, m * h, zero).sum() / _safe(m_act.sum())
        pen = zero
        if config.entropy_floor is not None:
            pen = pen + torch.relu(config.entropy_floor - h_bar)
        if config.entropy_ceiling is not None:
            pen = pen + torch.relu(h_bar - config.entropy_ceiling)
        # no active token: no penalty (h_bar is 0 there, not an entropy)
        pen = torch.where(m_act.sum() > 0, pen, zero)
        entropy_loss = entropy_loss + config.entropy_penalty_coef * pen
    loss = loss + entropy_loss

    metrics = _metrics(
        loss,
        pg_loss,
        entropy_loss,
        ratio.detach(),
        adv,
        a,
        valid,
        active,
        seq_valid,
        keep,
        dual,
        w,
        h,
        k3,
        thr,
        config,
    )
    return loss, metrics


def _metrics(
    loss: Tensor,
    pg_loss: Tensor,
    entropy_loss: Tensor,
    ratio: Tensor,
    adv: Tensor,
    a: Tensor,
    valid: Tensor,
    active: Tensor,
    seq_valid: Tensor,
    keep: Tensor,
    dual: Tensor,
    w: Tensor,
    h: Tensor | None,
    k3: Tensor | None,
    thr: Tensor,
    config: LossConfig,
) -> dict[str, float]:
    """All metrics in one device-to-host copy."""
    dt = ratio.dtype
    nan = torch.tensor(math.nan, dtype=dt, device=ratio.device)
    inf = torch.tensor(math.inf, dtype=dt, device=ratio.device)
    n_valid = valid.sum().to(dt)
    n_active = active.sum().to(dt)
    n_seq = seq_valid.sum().to(dt)

    def frac(x: Tensor, den: Tensor) -> Tensor:
        return x.sum().to(dt) / torch.where(den > 0, den, torch.ones_like(den))

    def vmean(x: Tensor) -> Tensor:
        return torch.where(n_valid > 0, torch.where(valid, x, 0.0).sum() / n_valid.clamp(min=1), nan)

    low = active & (ratio < 1.0 - config.epsilon_low) & (a < 0)
    high = active & (ratio > 1.0 + config.epsilon_high) & (a > 0)
    r_min = torch.where(n_valid > 0, torch.where(valid, ratio, inf).min(), nan)
    r_max = torch.where(n_valid > 0, torch.where(valid, ratio, -inf).max(), nan)
    a_seq = torch.where(seq_valid, adv, 0.0)
    a_mean = a_seq.sum() / n_seq.clamp(min=1)
    a_std = (torch.where(seq_valid, (adv - a_mean) ** 2, 0.0).sum() / n_seq.clamp(min=1)).sqrt()
    kl_mean = vmean(k3) if k3 is not None else torch.zeros((), dtype=dt, device=ratio.device)
    vals = torch.stack(
        [
            loss.detach().to(dt),
            pg_loss.detach().to(dt),
            (config.beta * kl_mean).to(dt),
            entropy_loss.detach().to(dt),
            frac(low, n_active),
            frac(high, n_active),
            frac(dual & active, n_active),
            vmean(ratio),
            r_min,
            r_max,
            vmean(h.detach()) if h is not None else nan,
            kl_mean,
            frac(valid & (w == 0), n_valid),
            frac(seq_valid & ~keep, n_seq),
            thr.to(dt),
            a_mean,
            a_std,
        ]
    ).tolist()
    keys = (
        "loss",
        "pg_loss",
        "kl_loss",
        "entropy_loss",
        "clip_frac_low",
        "clip_frac_high",
        "dual_clip_frac",
        "ratio_mean",
        "ratio_min",
        "ratio_max",
        "entropy_mean",
        "kl",
        "zero_weight_frac",
        "filtered_frac",
        "entropy_threshold",
        "adv_mean",
        "adv_std",
    )
    return dict(zip(keys, vals))
