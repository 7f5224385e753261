"""Group-relative advantages (GRPO family), vectorized over contiguous groups of G completions.

All methods view rewards[B] as [B // G, G] (completions g*G .. g*G+G-1 belong to prompt g). NaN and +-inf rewards
(unscorable completions, TRL's ``None`` rewards) are left out of every statistic and get advantage 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from sgrpo_kernels.backends.contract import stats_dtype
from sgrpo_kernels.validation import check_choice, check_group_size, check_number, check_tensor

__all__ = ["ADVANTAGE_METHODS", "check_advantage_options", "group_advantages"]

ADVANTAGE_METHODS = ("grpo", "dr_grpo", "rloo", "lite_ppo", "ngrpo", "all_fail_negative")

# Options each method accepts (besides the common ones) and their defaults.
_METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "grpo": {"eps": 1e-4, "unbiased": True},
    "dr_grpo": {},
    "rloo": {},
    "lite_ppo": {"eps": 1e-4, "unbiased": True},
    "ngrpo": {"eps": 1e-6, "unbiased": True, "k": 1},
    "all_fail_negative": {"c": 1.0, "base": "grpo", "eps": 1e-4, "unbiased": True},
}
# Common to every method: the reward range (used by NGRPO's virtual sample, all-fail detection and the stats) and
# positive_only.
_COMMON_OPTIONS: dict[str, Any] = {"r_min": 0.0, "r_max": 1.0, "positive_only": False}


def check_advantage_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of `method` with their defaults; unknown names, bad values and r_min > r_max are refused (also
    when a :class:`~sgrpo_kernels.rl.LossConfig` is built, not only at the first step)."""
    allowed = {**_COMMON_OPTIONS, **_METHOD_OPTIONS[method]}
    if method == "all_fail_negative":
        # the base method's own options (and defaults, e.g. NGRPO's k and eps) apply too
        base = check_choice("base", options.get("base", allowed["base"]), ("grpo", "dr_grpo", "rloo", "lite_ppo",
                                                                           "ngrpo"))
        allowed = {**allowed, **_METHOD_OPTIONS[base], "base": base}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"group_advantages(method={method!r}) got unknown option(s) {unknown}; accepted: {sorted(allowed)}"
        )
    opts = {**allowed, **options}
    if "eps" in opts:
        opts["eps"] = check_number("eps", opts["eps"], low=0.0)
    if "c" in opts:
        opts["c"] = check_number("c", opts["c"], low=0.0, low_open=True)  # c = 0: no signal (as all_fail_c)
    if "k" in opts:
        k = opts["k"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k (NGRPO virtual samples) must be an int >= 0, got {k!r}")
    if "base" in opts:
        check_choice("base", opts["base"], ("grpo", "dr_grpo", "rloo", "lite_ppo", "ngrpo"))
    opts["r_min"] = check_number("r_min", opts["r_min"])
    opts["r_max"] = check_number("r_max", opts["r_max"])
    if opts["r_min"] > opts["r_max"]:
        raise ValueError(f"r_min ({opts['r_min']}) must be <= r_max ({opts['r_max']}): they bound the reward range")
    for flag in ("positive_only", "unbiased"):  # "no" would count as True
        if flag in opts and not isinstance(opts[flag], bool):
            raise TypeError(f"{flag} must be a bool, got {type(opts[flag]).__name__} {opts[flag]!r}")
    return opts


def _constant_value(r: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """[n, 1] (is the group constant over its >= 1 valid entries, that value)."""
    inf = torch.tensor(math.inf, dtype=r.dtype, device=r.device)
    gmax = torch.where(valid, r, -inf).amax(dim=1, keepdim=True)
    gmin = torch.where(valid, r, inf).amin(dim=1, keepdim=True)
    return valid.any(dim=1, keepdim=True) & (gmax == gmin), gmax


def _pow2_scale(r: Tensor, extra: float = 0.0) -> Tensor:
    """[n, 1] power of two c with max(|r|, |extra|) / c in [1, 2) per row (1 for an all-zero row). Sums and squares
    are taken of r / c, so rewards up to the dtype's max never overflow (c itself is at most half of it: the power of
    two above a reward past 2^127 would be inf in float32); dividing by a power of two is exact, so ordinary rewards
    give bitwise the same statistics as without scaling."""
    top = torch.maximum(r.abs().amax(dim=1, keepdim=True), torch.full_like(r[:, :1], abs(extra)))
    _, exp = torch.frexp(torch.where(top > 0, top, torch.ones_like(top)))
    return torch.ldexp(torch.ones_like(top), exp - 1)


def _group_mean_std(r: Tensor, valid: Tensor, unbiased: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group count, mean and std over valid entries. r: [n, G] with invalid entries already 0."""
    n = valid.sum(dim=1, keepdim=True).to(r.dtype)  # [n, 1]
    c = _pow2_scale(r)
    rs = r / c
    mean_s = rs.sum(dim=1, keepdim=True) / n.clamp(min=1)
    # A constant group's mean is its value exactly (sum / n rounds), so its advantages are exactly 0 and the
    # backends can skip its rows.
    const, value = _constant_value(r, valid)
    mean_s = torch.where(const, value / c, mean_s)
    sq = torch.where(valid, (rs - mean_s) ** 2, torch.zeros_like(rs)).sum(dim=1, keepdim=True)
    denom = (n - 1) if unbiased else n
    # A group with fewer than 2 (unbiased) or 1 valid rewards has no spread: std 0.
    std_s = torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq)).sqrt()
    return n, mean_s * c, std_s * c


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den, and 0 where den is 0 (eps = 0 with a zero-variance group): never NaN."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def _base_advantages(method: str, r: Tensor, valid: Tensor, opts: dict[str, Any]) -> Tensor:
    if method == "grpo":
        _, mean, std = _group_mean_std(r, valid, opts["unbiased"])
        return _safe_div(r - mean, std + opts["eps"])
    if method == "dr_grpo":
        _, mean, _ = _group_mean_std(r, valid, False)
        return r - mean
    if method == "rloo":
        n, _, _ = _group_mean_std(r, valid, False)
        c = _pow2_scale(r)
        others = ((r / c).sum(dim=1, keepdim=True) - r / c) / (n - 1).clamp(min=1) * c
        const, _ = _constant_value(r, valid)
        return torch.where((n > 1) & ~const, r - others, torch.zeros_like(r))
    if method == "lite_ppo":
        _, mean, _ = _group_mean_std(r, valid, False)
        flat_valid = valid.reshape(1, -1)
        _, _, batch_std = _group_mean_std(r.reshape(1, -1), flat_valid, opts["unbiased"])
        return _safe_div(r - mean, batch_std + opts["eps"])
    if method == "ngrpo":
        k, r_max = opts["k"], opts["r_max"]
        c = _pow2_scale(r, r_max)  # as in _group_mean_std: statistics of r / c, never overflowing
        rs, r_max_s = r / c, r_max / c
        n = valid.sum(dim=1, keepdim=True).to(r.dtype)
        n_aug = n + k
        mean_s = (rs.sum(dim=1, keepdim=True) + k * r_max_s) / n_aug.clamp(min=1)
        const, value = _constant_value(r, valid)
        mean_s = torch.where(const & ((value == r_max) | (k == 0)), value / c, mean_s)
        sq = torch.where(valid, (rs - mean_s) ** 2, torch.zeros_like(rs)).sum(dim=1, keepdim=True)
        sq = sq + k * (r_max_s - mean_s) ** 2
        denom = (n_aug - 1) if opts["unbiased"] else n_aug
        std_s = torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq)).sqrt()
        return _safe_div(rs - mean_s, std_s + opts["eps"] / c)
    raise AssertionError(method)  # unreachable: method validated by the caller


def group_advantages(
    rewards: Tensor, group_size: int, method: str = "grpo", *, return_stats: bool = False, **options: Any
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    r"""Group-relative advantages of B = n_groups * G completions.

    Args:
        rewards: ``[B]`` float (int/bool accepted). NaN or +-inf = unscorable: excluded from the statistics, advantage
            0. Statistics are taken of rewards scaled by a power of two per group, so values up to the dtype's max do
            not overflow the variance.
        group_size: G; B must be a multiple of G; groups are contiguous.
        method: one of

            - ``"grpo"``: :math:`A_i = (r_i - \mu_g) / (\sigma_g + \epsilon)`, Bessel-corrected :math:`\sigma_g`
              (options ``eps=1e-4`` as TRL, verl uses 1e-6; ``unbiased=True``). Source: DeepSeekMath (arXiv
              2402.03300), TRL ``GRPOTrainer``, verl ``compute_grpo_outcome_advantage``.
            - ``"dr_grpo"``: :math:`A_i = r_i - \mu_g`. Source: Dr. GRPO (arXiv 2503.20783), TRL
              ``scale_rewards=False``.
            - ``"rloo"``: :math:`A_i = r_i - \frac{1}{n-1}\sum_{j \ne i} r_j = (r_i - \mu_g)\,n/(n-1)` (0 when a
              group has fewer than 2 valid rewards). Source: Ahmadian et al. 2024 (arXiv 2402.14740), verl ``rloo``.
            - ``"lite_ppo"``: :math:`A_i = (r_i - \mu_g) / (\sigma_{batch} + \epsilon)`, batch std over every valid
              reward (``eps=1e-4``). Source: Lite PPO, "Tricks or Traps" (arXiv 2508.08221).
            - ``"ngrpo"``: k virtual samples with reward ``r_max`` join the group statistics:
              :math:`\mu' = (\sum r + k r_{max})/(n+k)`, :math:`\sigma'` Bessel over the n + k samples,
              :math:`A_i = (r_i - \mu')/(\sigma' + \epsilon)` (``k=1``, ``r_max=1``, ``eps=1e-6``). All-fail groups
              get negative advantages. Source: NGRPO (negative-enhanced GRPO, 2025; k=1, r_max=1, eps=1e-6 as there).
            - ``"all_fail_negative"``: the ``base`` method (default ``"grpo"``) except that groups whose valid
              rewards are all ``<= r_min`` (default 0) get :math:`A_i = -c` (``c=1.0``). Source: proposed in the S-GRPO
              design notes (NGRPO is the related published method).

        return_stats: also return a dict of 0-d tensors (no host sync; :func:`~sgrpo_kernels.rl.metrics_to_floats`
            converts them in one copy): ``zero_variance_frac`` (groups whose valid rewards are all equal
            or that have fewer than 2 valid rewards), ``all_pass_frac`` (all valid rewards ``>= r_max``),
            ``all_fail_frac`` (all ``<= r_min``), ``nan_frac`` (fraction of non-finite rewards), ``reward_mean``,
            ``reward_std``, ``adv_mean``, ``adv_std`` (over valid completions).
        **options: method options above, plus for every method ``r_min=0.0``, ``r_max=1.0`` (the reward range) and
            ``positive_only=False`` (negative advantages set to 0, applied last).

    Returns:
        ``advantages[B]`` in the compute dtype (fp32, or fp64 for fp64 rewards); with ``return_stats``,
        ``(advantages, stats)``.
    """
    rewards = check_tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if rewards.is_complex():
        raise TypeError(f"rewards must be a real tensor, got dtype {rewards.dtype}")
    g = check_group_size(group_size, rewards.shape[0], "rewards")
    check_choice("method", method, ADVANTAGE_METHODS)
    opts = check_advantage_options(method, options)

    dtype = stats_dtype(rewards.dtype)
    r = rewards.detach().to(dtype).reshape(-1, g)  # [n_groups, G]
    valid = torch.isfinite(r)  # NaN and +-inf rewards are unscorable: left out of every statistic, advantage 0
    r0 = torch.where(valid, r, torch.zeros_like(r))

    if method == "all_fail_negative":
        adv = _base_advantages(opts["base"], r0, valid, opts)
        all_fail = _all_below(r0, valid, opts["r_min"])
        adv = torch.where(all_fail, torch.full_like(adv, -opts["c"]), adv)
    else:
        adv = _base_advantages(method, r0, valid, opts)
    if opts["positive_only"]:
        adv = adv.clamp(min=0.0)
    adv = torch.where(valid, adv, torch.zeros_like(adv))
    out = adv.reshape(-1)
    if not return_stats:
        return out
    return out, _stats(r0, valid, out, opts)


def _all_below(r0: Tensor, valid: Tensor, r_min: float) -> Tensor:
    """[n, 1] bool: the group has >= 1 valid reward and every valid reward is <= r_min."""
    has_any = valid.any(dim=1, keepdim=True)
    return has_any & (torch.where(valid, r0 <= r_min, torch.ones_like(valid))).all(dim=1, keepdim=True)


_STAT_KEYS = ("zero_variance_frac", "all_pass_frac", "all_fail_frac", "nan_frac", "reward_mean", "reward_std",
              "adv_mean", "adv_std")  # fmt: skip


def _stats(r0: Tensor, valid: Tensor, adv: Tensor, opts: dict[str, Any]) -> dict[str, Tensor]:
    """The statistics of `return_stats`, as 0-d tensors (no device-to-host sync here); of no group (B = 0): NaN, and
    num_groups 0."""
    n_groups = r0.shape[0]
    if n_groups == 0:
        nan = torch.tensor(math.nan, dtype=r0.dtype, device=r0.device)
        return {k: nan for k in _STAT_KEYS} | {"num_groups": torch.zeros((), dtype=r0.dtype, device=r0.device)}
    inf = torch.tensor(math.inf, dtype=r0.dtype, device=r0.device)
    gmax = torch.where(valid, r0, -inf).amax(dim=1)
    gmin = torch.where(valid, r0, inf).amin(dim=1)
    n_valid = valid.sum(dim=1)
    zero_var = (n_valid < 2) | (gmax == gmin)
    has_any = n_valid > 0
    all_pass = has_any & torch.where(valid, r0 >= opts["r_max"], torch.ones_like(valid)).all(dim=1)
    all_fail = _all_below(r0, valid, opts["r_min"]).squeeze(1)
    flat_valid = valid.reshape(-1)
    n_total = flat_valid.sum().clamp(min=1).to(r0.dtype)
    _, r_mean, r_std = (x.reshape(()) for x in _group_mean_std(r0.reshape(1, -1), flat_valid.reshape(1, -1), False))
    a_mean = torch.where(flat_valid, adv, torch.zeros_like(adv)).sum() / n_total
    a_std = (torch.where(flat_valid, (adv - a_mean) ** 2, torch.zeros_like(adv)).sum() / n_total).sqrt()
    dt = r0.dtype
    return {
        "zero_variance_frac": zero_var.to(dt).mean(),
        "all_pass_frac": all_pass.to(dt).mean(),
        "all_fail_frac": all_fail.to(dt).mean(),
        "nan_frac": 1.0 - flat_valid.to(dt).mean(),
        "reward_mean": r_mean,
        "reward_std": r_std,
        "adv_mean": a_mean,
        "adv_std": a_std,
        "num_groups": torch.tensor(float(n_groups), dtype=dt, device=r0.device),
    }
