"""Token-conflict weights: tokens that completions of opposite advantage sign in the same group share.

Detection (``detect``):

- ``"positional"`` (GTPO, Simoni et al., arXiv 2508.03772, paper section "conflict-aware gradient correction", and its
  official code github.com/winstonsmith1897/GTPO): the same token at the same position, on prefix runs and
  right-aligned suffix runs only.
- ``"anywhere"`` (the pseudo-code of the S-GRPO design notes: "Shared = tokens appearing in both r=1 and r=0
  completions"): the same token id anywhere in the two completions.

Strategies: GTPO's lambda = 2 / 0 (``"gtpo"``) and the resolution table of the S-GRPO design notes: skip, weight by
P(success | token), causal (counterfactual credit), aggregate (majority vote).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sgrpo_kernels.backends.contract import stats_dtype
from sgrpo_kernels.validation import (
    check_choice,
    check_float_tensor,
    check_group_size,
    check_mask,
    check_number,
    check_rank,
    check_same_device,
    check_tensor,
)

__all__ = ["COMBINE_MODES", "CONFLICT_DETECTS", "CONFLICT_STRATEGIES", "conflict_weights"]

CONFLICT_STRATEGIES = ("gtpo", "skip", "weight", "majority", "causal")
CONFLICT_DETECTS = ("positional", "anywhere")
COMBINE_MODES = ("product", "max")


def _inverse(columns: list[Tensor], spans: list[int]) -> Tensor:
    """Flat int64 ids of equal tuples (column k holds values in [0, spans[k])): the inverse of a unique over them.

    One packed key when the spans' product fits in int64, else a lexicographic unique over rows (huge id ranges)."""
    total = 1
    for s in spans:
        total *= max(1, s)
    if total < 2**62:
        key = columns[0].reshape(-1)
        for col, s in zip(columns[1:], spans[1:]):
            key = key * s + col.reshape(-1)
        _, inv = torch.unique(key, return_inverse=True)
    else:
        _, inv = torch.unique(torch.stack([c.reshape(-1) for c in columns], dim=1), dim=0, return_inverse=True)
    return inv


def _holder_stats(
    ids: Tensor, valid: Tensor, adv: Tensor, pos: Tensor, neg: Tensor, group_size: int, positional: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """For every (i, t): how many positive / negative completions of i's group *hold* ids[i, t], and the sum of their
    advantages. Positional: hold it at position t; anywhere: hold it at any valid position (once per completion).

    Vectorized with ``torch.unique`` over (group, [position,] token) keys, then over (completion, key) pairs so that a
    completion counts once per key; invalid entries contribute nothing. ids, valid: [B, T]; adv, pos, neg: [B].
    Returns int64 [B, T], int64 [B, T], float [B, T] (adv's dtype).
    """
    b, t = ids.shape
    row = torch.arange(b, device=ids.device).unsqueeze(1).expand(b, t)
    grp = row // group_size
    ids64 = ids.to(torch.int64)
    lo = int(ids64.min())
    span = int(ids64.max()) - lo + 1
    n_groups = b // group_size
    if positional:
        col = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t)
        inv = _inverse([grp, col, ids64 - lo], [n_groups, t, span])
    else:
        inv = _inverse([grp, ids64 - lo], [n_groups, span])
    n_keys = int(inv.max()) + 1
    flat_valid = valid.reshape(-1)
    holder, key = row.reshape(-1)[flat_valid], inv[flat_valid]
    if not positional:  # a completion that repeats a token id holds it once: one (completion, key) pair each
        pairs = torch.unique(holder * n_keys + key)
        holder, key = pairs // n_keys, pairs % n_keys
    signed_adv = torch.where(pos | neg, adv, torch.zeros_like(adv))
    n_pos = torch.zeros(n_keys, dtype=torch.int64, device=ids.device).index_add_(0, key, pos[holder].to(torch.int64))
    n_neg = torch.zeros(n_keys, dtype=torch.int64, device=ids.device).index_add_(0, key, neg[holder].to(torch.int64))
    s_adv = torch.zeros(n_keys, dtype=adv.dtype, device=ids.device).index_add_(0, key, signed_adv[holder])
    return n_pos[inv].reshape(b, t), n_neg[inv].reshape(b, t), s_adv[inv].reshape(b, t)


def _group_signed_stats(adv: Tensor, pos: Tensor, neg: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per completion [B, 1]: the sum, count and range (max - min) of the signed (A != 0) advantages of its group."""
    signed = (pos | neg).reshape(-1, group_size)
    a = torch.where(signed, adv.reshape(-1, group_size), torch.zeros_like(adv.reshape(-1, group_size)))
    total = a.sum(dim=1)
    count = signed.sum(dim=1)
    big = torch.finfo(adv.dtype).max
    span = torch.where(signed, a, -big).amax(dim=1) - torch.where(signed, a, big).amin(dim=1)
    span = torch.where(count > 0, span, torch.zeros_like(span))

    def per_row(v: Tensor) -> Tensor:
        return v.repeat_interleave(group_size).unsqueeze(1)

    return per_row(total), per_row(count), per_row(span)


def _conflicts_and_factor(
    ids: Tensor,
    valid: Tensor,
    adv: Tensor,
    pos: Tensor,
    neg: Tensor,
    group_size: int,
    strategy: str,
    positional: bool,
    group_stats: tuple[Tensor, Tensor, Tensor],
    w_pos: float,
    w_neg: float,
) -> tuple[Tensor, Tensor]:
    """Conflict tokens (bool [B, T]; positional: only the leading run from t = 0) and the factor a conflict token gets
    (float [B, T], adv's dtype), for left-aligned input."""
    n_pos, n_neg, s_adv = _holder_stats(ids, valid, adv, pos, neg, group_size, positional)
    signed = (pos | neg).unsqueeze(1)
    conflict = valid & signed & (n_pos > 0) & (n_neg > 0)
    if positional:
        conflict = torch.cumprod(conflict.to(torch.int32), dim=1).to(torch.bool)  # only the leading run counts
    is_pos = pos.unsqueeze(1)
    dtype = adv.dtype
    if strategy == "gtpo":
        factor = torch.where(is_pos, w_pos, w_neg).to(dtype).expand(ids.shape)
    elif strategy == "skip":
        factor = torch.zeros(ids.shape, dtype=dtype, device=ids.device)
    elif strategy == "weight":
        total = (n_pos + n_neg).clamp(min=1).to(dtype)
        p_success = n_pos.to(dtype) / total
        factor = torch.where(is_pos, p_success, 1.0 - p_success)
    elif strategy == "majority":  # the side with more holders keeps 1; a tie keeps 1 on both sides
        factor = torch.where(is_pos, n_pos >= n_neg, n_neg >= n_pos).to(dtype)
    else:  # causal: the standardized difference in mean advantage between holders and non-holders of the token
        s_g, n_g, span_g = group_stats
        n_with = n_pos + n_neg
        n_without = n_g - n_with
        mean_with = s_adv / n_with.clamp(min=1).to(dtype)
        mean_without = (s_g - s_adv) / n_without.clamp(min=1).to(dtype)
        known = (n_with > 0) & (n_without > 0) & (span_g > 0)  # no completion without the token: no counterfactual
        delta = torch.where(known, (mean_with - mean_without) / torch.where(span_g > 0, span_g, 1.0), 0.0)
        factor = torch.where(is_pos, delta.clamp(min=0.0), (-delta).clamp(min=0.0))
    return conflict, factor


def conflict_weights(
    completion_ids: Tensor,
    completion_mask: Tensor,
    advantages: Tensor,
    group_size: int,
    strategy: str = "gtpo",
    *,
    w_pos: float = 2.0,
    w_neg: float = 0.0,
    combine: str = "product",
    detect: str = "positional",
) -> tuple[Tensor, Tensor]:
    r"""Per-token conflict weights :math:`\lambda_{i,t}` for groups of G right-padded completions.

    A token y of completion i with :math:`A_i > 0` is a *conflict* if some completion j of the same group with
    :math:`A_j < 0` *holds* it too (and symmetrically for :math:`A_i < 0`). Masked tokens never conflict; completions
    with :math:`A = 0` (NaN counts as 0) neither have nor cause conflicts. What "holds" means (``detect``):

    - ``"positional"`` (GTPO): j holds y at the same position t. Only the leading run of conflicts from the first
      token counts (*prefix*), and the same test on the sequences right-aligned at their last valid token (*suffix*);
      a masked token ends a run.
    - ``"anywhere"`` (S-GRPO seed: "tokens appearing in both r=1 and r=0 completions"): j holds y at any valid
      position, independent of t. Every valid occurrence of y in a signed completion of the group is a conflict
      (no runs). A completion counts once per token id however often it repeats it.

    Strategies (the factor a conflict token gets; every other token and every :math:`A = 0` completion gets 1), with
    :math:`n^+_y, n^-_y` the positive / negative completions of the group that hold y:

    - ``"gtpo"``: ``w_pos`` on the positive side, ``w_neg`` on the negative side (GTPO: 2 and 0).
    - ``"skip"``: 0 on both sides.
    - ``"weight"``: the empirical success rate :math:`p = n^+_y / (n^+_y + n^-_y)` on the positive side and
      :math:`1 - p` on the negative side.
    - ``"majority"``: the side with more holders keeps 1, the other gets 0 (a tie keeps 1).
    - ``"causal"``: counterfactual credit, the difference in mean advantage between the group's signed completions
      that hold y (:math:`S_y`) and those that do not (:math:`\bar S_y`), standardized by the group's advantage range:

      .. math::
          \delta_y = \frac{\mathrm{mean}_{j \in S_y} A_j - \mathrm{mean}_{j \in \bar S_y} A_j}
                          {\max_j A_j - \min_j A_j} \in [-1, 1],\qquad
          \lambda = \max(0, \delta_y)\ (A_i > 0),\quad \lambda = \max(0, -\delta_y)\ (A_i < 0)

      over signed completions (:math:`A_j \ne 0`) only; :math:`\delta_y = 0` when no signed completion lacks y.
      Within a group the advantage is an affine function of the reward (every method of ``group_advantages``), so
      :math:`\delta_y` equals the same contrast of rewards over the reward range: with binary rewards, the risk
      difference :math:`P(r=1 \mid y) - P(r=1 \mid \neg y)`. A token that does not change the outcome gets 0 on
      both sides; one associated with success keeps :math:`\delta_y` of its update in successes and none in
      failures, and conversely. ``w_pos`` / ``w_neg`` are used by ``"gtpo"`` only.

    ``combine`` merges the prefix factor :math:`f^{pre}` and suffix factor :math:`f^{suf}` of a token (positional
    detection): ``"product"`` :math:`f^{pre} f^{suf}` (the official GTPO code; a positive token in both runs gets 4) or
    ``"max"`` (the factor is applied once: of the two, the one farther from 1, i.e. the max for ``w_pos >= 1``). With
    ``"anywhere"`` a token has one factor and ``combine`` changes nothing.

    Args:
        completion_ids: ``[B, T]`` integer token ids, right-padded.
        completion_mask: ``[B, T]`` bool or float (non-zero = valid token).
        advantages: ``[B]`` float; the sign selects the side (NaN counts as 0); ``"causal"`` also uses the values.
        group_size: G; B must be a multiple of G; groups contiguous.
        strategy, w_pos, w_neg, combine, detect: as above.

    Returns:
        ``(weights[B, T], conflict_counts[B])``: float weights (1 at padding; the loss applies the mask) and the number
        of conflict tokens of each completion (positional: in its prefix or suffix run; 0 for :math:`A = 0`), used by
        the official code's per-completion division (``LossConfig.conflict_count_norm``).
    """
    ids = check_tensor("completion_ids", completion_ids)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"completion_ids must be an integer tensor, got dtype {ids.dtype}")
    check_rank("completion_ids", ids, 2, "[B, T]")
    b, t = ids.shape
    mask = check_mask("completion_mask", completion_mask, (b, t), " (the shape of completion_ids)")
    adv = check_float_tensor("advantages", advantages, (b,), " ([B], B from completion_ids)")
    check_same_device("completion_mask", mask, ids, "completion_ids")
    check_same_device("advantages", adv, ids, "completion_ids")
    g = check_group_size(group_size, b, "completion_ids")
    check_choice("strategy", strategy, CONFLICT_STRATEGIES)
    check_choice("combine", combine, COMBINE_MODES)
    check_choice("detect", detect, CONFLICT_DETECTS)
    w_pos = check_number("w_pos", w_pos, low=0.0)  # a negative factor would flip the direction of the update
    w_neg = check_number("w_neg", w_neg, low=0.0)

    dtype = stats_dtype(adv.dtype)
    adv = adv.detach().to(dtype)
    pos, neg = adv > 0, adv < 0
    valid = mask != 0 if mask.dtype != torch.bool else mask
    if b == 0 or t == 0:
        return torch.ones(b, t, dtype=dtype, device=ids.device), torch.zeros(b, dtype=torch.int64, device=ids.device)
    group_stats = _group_signed_stats(adv, pos, neg, g)
    one = torch.ones((), dtype=dtype, device=ids.device)

    def detect_on(rows: Tensor, rows_valid: Tensor, positional: bool) -> tuple[Tensor, Tensor]:
        return _conflicts_and_factor(
            rows, rows_valid, adv, pos, neg, g, strategy, positional, group_stats, w_pos, w_neg
        )

    if detect == "anywhere":
        conflict, factor = detect_on(ids, valid, False)
        return torch.where(conflict, factor, one), conflict.sum(dim=1)

    # prefix: left-aligned as given
    run_pre, f_pre = detect_on(ids, valid, True)

    # suffix: right-align each row at its last valid token; s = L_i - 1 - t is an involution on [0, L_i)
    col = torch.arange(t, device=ids.device).unsqueeze(0)
    length = torch.where(valid, col + 1, torch.zeros_like(col)).amax(dim=1, keepdim=True)  # last valid index + 1
    src = length - 1 - col
    inb = src >= 0
    src_c = src.clamp(min=0)
    rids = ids.gather(1, src_c)
    rvalid = valid.gather(1, src_c) & inb
    rrun, rfac = detect_on(rids, rvalid, True)
    run_suf = rrun.gather(1, src_c) & inb
    f_suf = rfac.gather(1, src_c)

    fp = torch.where(run_pre, f_pre, one)
    fs = torch.where(run_suf, f_suf, one)
    if combine == "product":
        weights = fp * fs
    else:
        weights = torch.where((fp - 1).abs() >= (fs - 1).abs(), fp, fs)
    counts = (run_pre | run_suf).sum(dim=1)
    return weights, counts
