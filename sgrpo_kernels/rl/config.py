"""LossConfig: every choice that defines a GRPO-family objective (advantages, conflicts, policy term, entropy control,
aggregation), validated on construction. Named presets: :mod:`sgrpo_kernels.rl.algorithm`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from sgrpo_kernels.rl.advantages import ADVANTAGE_METHODS, check_advantage_options, group_advantages
from sgrpo_kernels.rl.conflicts import COMBINE_MODES, CONFLICT_DETECTS, CONFLICT_STRATEGIES, conflict_weights
from sgrpo_kernels.rl.entropy import parse_entropy_filter
from sgrpo_kernels.rl.field_losses import POLICY_TERMS, TERM_FIELDS
from sgrpo_kernels.validation import F32_MAX, F32_TINY, check_choice, check_number

_LOG_F32_MAX = math.log(F32_MAX)

__all__ = ["IMPORTANCE_LEVELS", "LOSS_AGGS", "POLICY_TERMS", "LossConfig"]

IMPORTANCE_LEVELS = ("token", "sequence")
PROB_COMPENSATIONS = ("positive", "all")
LOSS_AGGS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-sum-token-mean",
             "token-sum")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    r"""Everything that defines a GRPO-family objective; presets are instances (:func:`sgrpo_kernels.rl.preset`).

    Override a field with ``dataclasses.replace(config, beta=0.0)``; values are validated on construction.

    Advantages and conflicts (computed per batch of groups by :func:`sgrpo_kernels.rl.prepare_groups`):
        advantage_method / advantage_options: arguments of :func:`~sgrpo_kernels.rl.group_advantages`.
        all_fail_c: c > 0 of ``advantage_method="all_fail_negative"``: groups whose rewards all fail get A = -c
        (proposed in the S-GRPO design notes); None = the method's default (1.0) or ``advantage_options["c"]``. Set
        it for that method only, and not together with ``advantage_options["c"]``.
        conflict_strategy: None (no conflict weighting) or a strategy of :func:`~sgrpo_kernels.rl.conflict_weights`
        (gtpo, skip, weight, majority, causal), with ``conflict_w_pos``, ``conflict_w_neg``, ``conflict_combine``.
        conflict_detect: which tokens are shared: ``"positional"`` (GTPO: same token at the same position, prefix and
        suffix runs) or ``"anywhere"`` (S-GRPO seed: same token id anywhere in a positive and a negative completion).
        conflict_count_norm: divide each completion's loss by ``max(1, n_conflict_i)`` (the official GTPO code; not
        in the paper).

    Policy term, per token: :math:`\ell_{it} = \max(-A_i \rho_{it}, -A_i\,\mathrm{clip}(\rho_{it}, 1-\epsilon_{low},
    1+\epsilon_{high}))`; with ``dual_clip = c``, :math:`\ell_{it} = \min(\ell_{it}, -c A_i)` where :math:`A_i < 0`;
    plus :math:`\beta\,k_3` with :math:`k_3 = e^{ref - \log\pi} - (ref - \log\pi) - 1`.
        beta: KL coefficient (k3 against ``ref_logp``); 0 = reference-free.
        epsilon_low / epsilon_high: PPO clip range (clip-higher when they differ, DAPO); epsilon_low < 1, except
        for policy_term="cispo", where 1 means no lower bound.
        dual_clip: None or c > 1 (dual-clip PPO, Ye et al. 2020; verl ``clip_ratio_c``).
        importance_level: ``"token"`` :math:`\rho_{it} = e^{\log\pi_{it} - \log\pi^{old}_{it}}` or ``"sequence"``
        (GSPO) :math:`s_i = \exp(\frac{1}{|o_i|}\sum_t \log\pi_{it} - \log\pi^{old}_{it})`, token form
        :math:`\rho_{it} = \mathrm{sg}(s_i)\,\pi_{it}/\mathrm{sg}(\pi_{it})`.
        log_ratio_clip: the log-ratio is clamped to ``[-c, c]`` before ``exp`` (verl uses 20), and so is
        ``ref - logp`` inside k3.
        loss_agg: ``"seq-mean-token-mean"`` (GRPO: mean over non-empty completions of the per-completion token mean),
        ``"token-mean"`` (DAPO: sum over tokens / number of valid tokens), ``"seq-mean-token-sum"``,
        ``"seq-mean-token-sum-norm"`` (Dr. GRPO / TRL: sum / (B * max_completion_length); T when None),
        ``"seq-sum-token-mean"`` (the official GTPO code: sum over completions of the token mean), ``"token-sum"``
        (verl: the sum over tokens). Denominators count valid (mask) tokens, including zero-weight and filtered ones.
        positive_only: negative advantages set to 0 (policy term only updates positive completions).

    The field's other policy terms (:mod:`sgrpo_kernels.rl.field_losses`, with their formulas and sources):
        policy_term: ``"ppo"`` (the clipped term above) or ``"dppo_tv"``, ``"dppo_kl"``, ``"cispo"``, ``"sapo"``,
        ``"gmpo"``, ``"clip_cov"``, ``"kl_cov"``; they read ``epsilon_low`` / ``epsilon_high`` in their own sense
        (DPPO's divergence thresholds, CISPO's weight clip, GMPO's log-ratio clip) and take neither
        ``importance_level="sequence"`` nor ``dual_clip``.
        dppo_ratio_cap: C of DPPO's truncated ratio (verl ``clip_ratio_c``, 3.0).
        sapo_tau_pos / sapo_tau_neg: SAPO's gate temperatures (1.0 / 1.05).
        cov_ratio: the fraction of active tokens Clip-Cov / KL-Cov select (2e-4).
        clip_cov_lb / clip_cov_ub: Clip-Cov's covariance window (1.0, 5.0); kl_cov_coef: KL-Cov's coefficient (0.1).
        off_policy_mask_threshold: None, or delta >= 0: completions with A < 0 whose mean
        :math:`\log\mu - \log\pi` over their tokens exceeds delta get zero weight (DeepSeek-V3.2's off-policy
        sequence mask, TRL ``off_policy_mask_threshold``; :math:`\mu` the ``sampler_logp`` of the loss, else
        ``old_logp``, else the current policy: no mask).

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
        ``"adaptive"`` (:func:`~sgrpo_kernels.rl.adaptive_entropy_threshold`) or ``"coverage"`` (per group,
        :func:`~sgrpo_kernels.rl.coverage_entropy_threshold`: ln of the group's effective number of informative
        completions, capped at ln |V|); the last two need ``rewards``, ``group_size``, ``vocab_size``.
        entropy_advantage_shift: gamma of the official GTPO code's :math:`A_i - \gamma \langle H\rangle_i` (detached).
        top_entropy_quantile: rho; only the top-rho fraction of active tokens by entropy is trained (80/20 paper).

    Probability compensation (proposed in the S-GRPO design notes), per token :math:`A_{it} = A_i\,C_{it}` with
    :math:`C_{it} = \min(2 - p_{it}/p^{max}_{it},\ C_{max})`, both probabilities detached (:math:`p^{max}` from the
    op's ``return_max_logprob``):
        prob_compensation: None (off), ``"positive"`` (tokens of completions with :math:`A_i > 0`: the proposal's
        "improbable correct tokens") or ``"all"`` (every token, the formula as the proposal writes it).
        prob_compensation_max: :math:`C_{max}` in [1, 2]; None = ``1 + epsilon_high``. The proposal's unclipped C
        diverged; capping the amplification at the PPO clip's own scale keeps a token's effective step within the
        trust region the ratio clip enforces (docs/rl.md, "Probability compensation").
    """

    name: str = "custom"
    advantage_method: str = "grpo"
    advantage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    all_fail_c: float | None = None
    conflict_strategy: str | None = None
    conflict_detect: str = "positional"
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
    prob_compensation: str | None = None
    prob_compensation_max: float | None = None
    policy_term: str = "ppo"
    dppo_ratio_cap: float = 3.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_coef: float = 0.1
    off_policy_mask_threshold: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"LossConfig.name must be a string, got {type(self.name).__name__}")
        check_choice("LossConfig.advantage_method", self.advantage_method, ADVANTAGE_METHODS)
        if not isinstance(self.advantage_options, Mapping):
            raise TypeError(f"LossConfig.advantage_options must be a mapping, got {type(self.advantage_options)}")
        try:  # refused when the config is built, not at the first training step
            check_advantage_options(self.advantage_method, dict(self.advantage_options))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"LossConfig.advantage_options: {exc}") from None
        self._check_all_fail()
        if self.conflict_strategy is not None:
            check_choice("LossConfig.conflict_strategy", self.conflict_strategy, CONFLICT_STRATEGIES)
        check_choice("LossConfig.conflict_detect", self.conflict_detect, CONFLICT_DETECTS)
        check_number("LossConfig.conflict_w_pos", self.conflict_w_pos, low=0.0)  # < 0 would flip the update
        check_number("LossConfig.conflict_w_neg", self.conflict_w_neg, low=0.0)
        check_choice("LossConfig.conflict_combine", self.conflict_combine, COMBINE_MODES)
        for flag in ("conflict_count_norm", "positive_only"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"LossConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        check_number("LossConfig.beta", self.beta, low=0.0)
        check_choice("LossConfig.policy_term", self.policy_term, POLICY_TERMS)
        # epsilon_low = 1 is CISPO's "no lower bound" (TRL, the MiniMax-M1 paper); a PPO ratio clip needs < 1
        check_number("LossConfig.epsilon_low", self.epsilon_low, low=0.0, high=1.0,
                     high_open=self.policy_term != "cispo")
        check_number("LossConfig.epsilon_high", self.epsilon_high, low=0.0)
        if self.dual_clip is not None:
            check_number("LossConfig.dual_clip", self.dual_clip, low=1.0, low_open=True)
        check_choice("LossConfig.importance_level", self.importance_level, IMPORTANCE_LEVELS)
        check_number("LossConfig.log_ratio_clip", self.log_ratio_clip, low=0.0, low_open=True)
        if self.log_ratio_clip > _LOG_F32_MAX:  # exp(88.8) is inf in float32: the clamp would not keep the ratio finite
            raise ValueError(f"LossConfig.log_ratio_clip must be <= {_LOG_F32_MAX:.4f} (log of float32's largest "
                             f"value: exp of the clamped log-ratio must stay finite), got {self.log_ratio_clip!r}")
        check_choice("LossConfig.loss_agg", self.loss_agg, LOSS_AGGS)
        self._check_policy_term()
        self._check_float32_range()
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
        if self.prob_compensation is not None:
            check_choice("LossConfig.prob_compensation", self.prob_compensation, PROB_COMPENSATIONS)
        if self.prob_compensation_max is not None:
            check_number("LossConfig.prob_compensation_max", self.prob_compensation_max, low=1.0, high=2.0)
            if self.prob_compensation is None:
                raise ValueError(
                    f"LossConfig.prob_compensation_max={self.prob_compensation_max!r} is set but prob_compensation is "
                    f"None; expected prob_compensation in {PROB_COMPENSATIONS}"
                )

    def _check_float32_range(self) -> None:
        """Every number field fits the float32 the loss computes in: a value beyond float32's largest (3.4e38) failed
        at the first loss call, deep inside torch, and a nonzero one below its smallest normal (1.2e-38) was 0 there
        (a SAPO temperature of 1e-300: an infinite loss)."""
        for field in dataclasses.fields(self):
            v = getattr(self, field.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if abs(v) > F32_MAX or 0 < abs(v) < F32_TINY:
                raise ValueError(f"LossConfig.{field.name}={v!r} does not fit float32, the loss's compute dtype: "
                                 f"expected 0 or a magnitude in [{F32_TINY:.3g}, {F32_MAX:.3g}]")

    def _check_policy_term(self) -> None:
        """The policy term's own fields: in range, and set only for the term that reads them."""
        check_number("LossConfig.dppo_ratio_cap", self.dppo_ratio_cap, low=1.0)
        check_number("LossConfig.sapo_tau_pos", self.sapo_tau_pos, low=0.0, low_open=True)
        check_number("LossConfig.sapo_tau_neg", self.sapo_tau_neg, low=0.0, low_open=True)
        check_number("LossConfig.cov_ratio", self.cov_ratio, low=0.0, low_open=True, high=1.0)
        check_number("LossConfig.clip_cov_lb", self.clip_cov_lb)
        check_number("LossConfig.clip_cov_ub", self.clip_cov_ub)
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"LossConfig.clip_cov_lb ({self.clip_cov_lb!r}) must be < LossConfig.clip_cov_ub "
                             f"({self.clip_cov_ub!r})")
        check_number("LossConfig.kl_cov_coef", self.kl_cov_coef, low=0.0)
        if self.off_policy_mask_threshold is not None:
            check_number("LossConfig.off_policy_mask_threshold", self.off_policy_mask_threshold, low=0.0)
        defaults = {f.name: f.default for f in dataclasses.fields(LossConfig)}
        for name, terms in TERM_FIELDS.items():
            if getattr(self, name) != defaults[name] and self.policy_term not in terms:
                raise ValueError(f"LossConfig.{name}={getattr(self, name)!r} applies to policy_term in {terms} only, "
                                 f"got policy_term={self.policy_term!r}")
        if self.policy_term != "ppo":
            for name, value, default in (("importance_level", self.importance_level, "token"),
                                         ("dual_clip", self.dual_clip, None)):  # fmt: skip
                if value != default:
                    raise ValueError(f"LossConfig.{name}={value!r} applies to policy_term='ppo' only (policy_term="
                                     f"{self.policy_term!r} defines its own ratio and clipping); expected {default!r}")

    def _check_all_fail(self) -> None:
        """all_fail_c: a number > 0, for all_fail_negative only, set once; and no positive_only, which would clamp
        the all-fail advantage -c back to 0."""
        c = self.all_fail_c
        if c is not None:
            if isinstance(c, bool) or not isinstance(c, (int, float)):
                raise TypeError(f"LossConfig.all_fail_c must be None or a Python number > 0, got {type(c).__name__}")
            if not math.isfinite(c) or c <= 0:
                raise ValueError(
                    f"LossConfig.all_fail_c must be a finite number > 0 (all-fail groups get A = -c), got {c!r}"
                )
            if self.advantage_method != "all_fail_negative":
                raise ValueError(
                    f"LossConfig.all_fail_c={c!r} applies to advantage_method='all_fail_negative' only, got "
                    f"advantage_method={self.advantage_method!r}; set all_fail_c=None or change the method"
                )
            if "c" in self.advantage_options:
                raise ValueError(
                    f"LossConfig.all_fail_c={c!r} and advantage_options['c']={self.advantage_options['c']!r} both set "
                    "the all-fail constant; set one of them"
                )
        if self.advantage_method == "all_fail_negative" and (
            self.positive_only or self.advantage_options.get("positive_only", False)
        ):
            raise ValueError(
                "LossConfig.positive_only=True with advantage_method='all_fail_negative': the all-fail advantage -c "
                "would be clamped to 0; use one or the other"
            )

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

    @property
    def needs_max_logprob(self) -> bool:
        """Whether :func:`policy_loss` needs ``max_logprob`` (probability compensation)."""
        return self.prob_compensation is not None

    @property
    def compensation_cap(self) -> float:
        """C_max of probability compensation: ``prob_compensation_max``, else ``1 + epsilon_high`` (at most 2)."""
        cap = self.prob_compensation_max
        return cap if cap is not None else min(2.0, 1.0 + self.epsilon_high)

    def advantages(
        self, rewards: Tensor, group_size: int, *, return_stats: bool = False
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """:func:`~sgrpo_kernels.rl.group_advantages` with this config's method and options."""
        options = dict(self.advantage_options)
        if self.all_fail_c is not None:
            options["c"] = float(self.all_fail_c)
        return group_advantages(rewards, group_size, self.advantage_method, return_stats=return_stats, **options)

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
            detect=self.conflict_detect,
        )
