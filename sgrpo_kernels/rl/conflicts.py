"""GTPO token-conflict weights: tokens shared at the same position by completions of opposite advantage sign.

Source: GTPO, Simoni et al., arXiv 2508.03772 (paper section "conflict-aware gradient correction") and its official
code (github.com/winstonsmith1897/GTPO): prefix runs, right-aligned suffix runs, lambda = 2 / 0, prefix * suffix.
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

__all__ = ["COMBINE_MODES", "CONFLICT_STRATEGIES", "conflict_weights"]

CONFLICT_STRATEGIES = ("gtpo", "skip", "weight", "majority")
COMBINE_MODES = ("product", "max")


def _side_counts(ids: Tensor, valid: Tensor, pos: Tensor, neg: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """For every (i, t): how many positive / negative completions of i's group hold ids[i, t] at position t.

    Vectorized with one ``torch.unique`` over (group, position, token) keys; invalid entries contribute nothing.
    ids, valid: [B, T]; pos, neg: [B] bool. Returns two int64 [B, T].
    """
    b, t = ids.shape
    grp = (torch.arange(b, device=ids.device) // group_size).unsqueeze(1).expand(b, t)
    col = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t)
    ids64 = ids.to(torch.int64)
    lo = int(ids64.min()) if ids64.numel() else 0
    span = (int(ids64.max()) - lo + 1) if ids64.numel() else 1
    n_groups = b // group_size
    if n_groups * t * span < 2**62:
        keys = ((grp * t + col) * span + (ids64 - lo)).reshape(-1)
        _, inv = torch.unique(keys, return_inverse=True)
    else:  # huge id range: lexicographic unique over rows instead of one packed key
        rows = torch.stack([grp.reshape(-1), col.reshape(-1), ids64.reshape(-1)], dim=1)
        _, inv = torch.unique(rows, dim=0, return_inverse=True)
    n_keys = int(inv.max()) + 1 if inv.numel() else 0
    pos_c = (valid & pos.unsqueeze(1)).reshape(-1).to(torch.int64)
    neg_c = (valid & neg.unsqueeze(1)).reshape(-1).to(torch.int64)
    n_pos = torch.zeros(n_keys, dtype=torch.int64, device=ids.device).index_add_(0, inv, pos_c)
    n_neg = torch.zeros(n_keys, dtype=torch.int64, device=ids.device).index_add_(0, inv, neg_c)
    return n_pos[inv].reshape(b, t), n_neg[inv].reshape(b, t)


def _run_and_factor(
    ids: Tensor,
    valid: Tensor,
    pos: Tensor,
    neg: Tensor,
    group_size: int,
    strategy: str,
    w_pos: float,
    w_neg: float,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Leading conflict run (bool [B, T]) and the factor a conflict token gets (float [B, T]), left-aligned input."""
    n_pos, n_neg = _side_counts(ids, valid, pos, neg, group_size)
    signed = (pos | neg).unsqueeze(1)
    raw = valid & signed & (n_pos > 0) & (n_neg > 0)
    run = torch.cumprod(raw.to(torch.int32), dim=1).to(torch.bool)  # only the leading run from t = 0 counts
    is_pos = pos.unsqueeze(1)
    if strategy == "gtpo":
        factor = torch.where(is_pos, w_pos, w_neg).to(dtype).expand(ids.shape)
    elif strategy == "skip":
        factor = torch.zeros(ids.shape, dtype=dtype, device=ids.device)
    elif strategy == "weight":
        total = (n_pos + n_neg).clamp(min=1).to(dtype)
        p_success = n_pos.to(dtype) / total
        factor = torch.where(is_pos, p_success, 1.0 - p_success)
    else:  # majority: the side with more completions holding the token keeps 1; a tie keeps 1 on both sides
        factor = torch.where(is_pos, n_pos >= n_neg, n_neg >= n_pos).to(dtype)
    return run, factor


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
) -> tuple[Tensor, Tensor]:
    r"""Per-token conflict weights :math:`\lambda_{i,t}` for groups of G right-padded completions.

    A token ``(t, y)`` of completion i with :math:`A_i > 0` is a *conflict* if some completion j of the same group with
    :math:`A_j < 0` holds the same token y at the same position t (and symmetrically for :math:`A_i < 0`). Only the
    leading run of conflicts from the first token counts (*prefix*), and the same test on the sequences right-aligned
    at their last valid token (*suffix*). Masked tokens never conflict and end a run.

    Strategies (the factor a token in a run gets; every other token and every :math:`A = 0` completion gets 1):

    - ``"gtpo"``: ``w_pos`` on the positive side, ``w_neg`` on the negative side (GTPO: 2 and 0).
    - ``"skip"``: 0 on both sides.
    - ``"weight"``: the empirical success rate of the token at that position in the group,
      :math:`p = n^+_{t,y} / (n^+_{t,y} + n^-_{t,y})`, on the positive side and :math:`1 - p` on the negative side.
    - ``"majority"``: the side with more completions holding the token keeps 1, the other gets 0 (a tie keeps 1).

    ``combine`` merges the prefix factor :math:`f^{pre}` and suffix factor :math:`f^{suf}` of a token:
    ``"product"`` :math:`f^{pre} f^{suf}` (the official GTPO code; a positive token in both runs gets 4) or ``"max"``
    (the factor is applied once: of the two, the one farther from 1, i.e. the max for ``w_pos >= 1``).

    Args:
        completion_ids: ``[B, T]`` integer token ids, right-padded.
        completion_mask: ``[B, T]`` bool or float (non-zero = valid token).
        advantages: ``[B]`` float; only the sign is used (NaN counts as 0).
        group_size: G; B must be a multiple of G; groups contiguous.

    Returns:
        ``(weights[B, T], conflict_counts[B])``: float weights (1 at padding; the loss applies the mask) and the number
        of tokens of each completion in its prefix or suffix run (0 for :math:`A = 0`), used by the official code's
        per-completion division (``LossConfig.conflict_count_norm``).
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
    w_pos = check_number("w_pos", w_pos)
    w_neg = check_number("w_neg", w_neg)

    dtype = stats_dtype(adv.dtype)
    adv = adv.detach()
    pos, neg = adv > 0, adv < 0
    valid = mask != 0 if mask.dtype != torch.bool else mask
    if b == 0 or t == 0:
        return torch.ones(b, t, dtype=dtype, device=ids.device), torch.zeros(b, dtype=torch.int64, device=ids.device)

    # prefix: left-aligned as given
    run_pre, f_pre = _run_and_factor(ids, valid, pos, neg, g, strategy, w_pos, w_neg, dtype)

    # suffix: right-align each row at its last valid token; s = L_i - 1 - t is an involution on [0, L_i)
    col = torch.arange(t, device=ids.device).unsqueeze(0)
    length = torch.where(valid, col + 1, torch.zeros_like(col)).amax(dim=1, keepdim=True)  # last valid index + 1
    src = length - 1 - col
    inb = src >= 0
    src_c = src.clamp(min=0)
    rids = ids.gather(1, src_c)
    rvalid = valid.gather(1, src_c) & inb
    rrun, rfac = _run_and_factor(rids, rvalid, pos, neg, g, strategy, w_pos, w_neg, dtype)
    run_suf = rrun.gather(1, src_c) & inb
    f_suf = rfac.gather(1, src_c)

    one = torch.ones((), dtype=dtype, device=ids.device)
    fp = torch.where(run_pre, f_pre, one)
    fs = torch.where(run_suf, f_suf, one)
    if combine == "product":
        weights = fp * fs
    else:
        weights = torch.where((fp - 1).abs() >= (fs - 1).abs(), fp, fs)
    counts = (run_pre | run_suf).sum(dim=1)
    return weights, counts
