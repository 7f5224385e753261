"""The linear_logprobs forward kernels: `_linear_logprobs_fwd_kernel` (one program per row block and vocab split:
logits tiles folded into the online row statistics, then logp / entropy / stats, or the split's partial statistics) and
`_linear_logprobs_merge_kernel` (the log-sum-exp merge of those partials when the vocabulary is split)."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import (
    NEG,
    cut_to_support,
    finalize_store,
    logits_tile,
    online_update,
    softcap,
    support_threshold,
    target_logit,
)

__all__ = ["_linear_logprobs_fwd_kernel", "_linear_logprobs_merge_kernel"]


@triton.jit
def _linear_logprobs_fwd_kernel(
    h_ptr, w_ptr, b_ptr, t_ptr, thr_ptr,  # thr_ptr: (N,) the sampler's support threshold, read when TRUNCATE
    logp_ptr, ent_ptr, stats_ptr,  # (N,), (N,), (2, N) final outputs, written when not SPLIT
    pm_ptr, ps_ptr, pu_ptr, pzy_ptr,  # (splits, N) partial statistics, written when SPLIT
    N, V, D, v_per_split,
    stride_hn, stride_hd, stride_wv, stride_wd, stride_b,
    inv_temp, cap_in, cap_out, ignore_index,  # z = x * inv_temp, or cap_out * tanh(cap_in * x) with SOFTCAP
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, WITH_ENTROPY: tl.constexpr, WITH_STATS: tl.constexpr,
    SPLIT: tl.constexpr, TRUNCATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)  # rows on axis 0: up to 2^31 - 1 blocks
    pid_s = tl.program_id(1)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
    thr = support_threshold(thr_ptr, rows, row_ok, TRUNCATE, BLOCK_M)
    v_start = pid_s * v_per_split
    v_end = tl.minimum(v_start + v_per_split, V)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    u = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if pid_s == 0:  # the target logit is computed once per row, by the first split
        # an ignored row reads no weight row: its target may be any int64 (ignore_index = 10**9 read far past W)
        zy = target_logit(h_ptr, w_ptr, b_ptr, rows, row_ok, tl.where(tgt == ignore_index, -1, tgt), D, stride_hn,
                          stride_hd, stride_wv, stride_wd, stride_b, inv_temp, HAS_BIAS, BLOCK_M, BLOCK_D)
        if SOFTCAP:
            zy = softcap(zy, cap_in, cap_out)  # ignored rows: softcap(0) = 0
    else:
        zy = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        col_ok = cols < v_end
        z = logits_tile(h_ptr, w_ptr, b_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wv,
                        stride_wd, stride_b, inv_temp, HAS_BIAS, DOT_PRECISION, BLOCK_M, BLOCK_V, BLOCK_D)
        if SOFTCAP:
            z = softcap(z, cap_in, cap_out)
        # -inf -> NEG (finite); NaN is kept (tl.maximum drops it by default), so that it reaches s
        z = tl.where(col_ok[None, :], tl.maximum(z, NEG, propagate_nan=tl.PropagateNan.ALL), NEG)
        if TRUNCATE:  # outside the sampler's support, except the target: NEG (p = 0)
            # the target's column within the tile as int32 (an int64 compare over the tile doubles its registers)
            hit = tl.arange(0, BLOCK_V)[None, :] == (tgt - v0).to(tl.int32)[:, None]
            z = cut_to_support(z, thr, hit)
        m, s, u = online_update(m, s, u, z, WITH_ENTROPY)
    if SPLIT:
        off = pid_s.to(tl.int64) * N + rows
        tl.store(pm_ptr + off, m, mask=row_ok)
        tl.store(ps_ptr + off, s, mask=row_ok)
        tl.store(pzy_ptr + off, zy, mask=row_ok)
        if WITH_ENTROPY:
            tl.store(pu_ptr + off, u, mask=row_ok)
    else:
        finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, stats_ptr, N, rows, row_ok, WITH_ENTROPY,
                       WITH_STATS)


@triton.jit
def _linear_logprobs_merge_kernel(
    pm_ptr, ps_ptr, pu_ptr, pzy_ptr, t_ptr, logp_ptr, ent_ptr, stats_ptr, N, n_splits, ignore_index,
    WITH_ENTROPY: tl.constexpr, WITH_STATS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Combine the per-split statistics of each row (fixed split order: deterministic)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
    m = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    u = tl.zeros((BLOCK,), dtype=tl.float32)
    zy = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(0, n_splits):
        off = k * N + rows
        mk = tl.load(pm_ptr + off, mask=row_ok, other=0.0)
        sk = tl.load(ps_ptr + off, mask=row_ok, other=1.0)  # masked rows: finite log s
        zy += tl.load(pzy_ptr + off, mask=row_ok, other=0.0)  # non-zero only in the split holding the target
        m_new = tl.maximum(m, mk)
        m_ref = tl.where(m_new == float("inf"), 0.0, m_new)  # a +inf logit: relative to 0 (tiles.online_update)
        a = tl.exp(m - m_ref)
        b = tl.exp(mk - m_ref)
        if WITH_ENTROPY:
            uk = tl.load(pu_ptr + off, mask=row_ok, other=0.0)
            # as in tiles.online_update: a shift whose weight vanishes is 0 (a split of NEG columns only would give
            # s * -1e38 = -inf, and 0 * -inf = nan)
            shift = tl.where(a == 0.0, 0.0, m - m_ref)
            shift_k = tl.where(b == 0.0, 0.0, mk - m_ref)
            u = a * (u + s * shift) + b * (uk + sk * shift_k)
        s = a * s + b * sk
        m = m_new
    finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, stats_ptr, N, rows, row_ok, WITH_ENTROPY,
                   WITH_STATS)
