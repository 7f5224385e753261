"""The logprobs_from_logits kernels: `_logprobs_from_logits_fwd_kernel` (one pass over the vocabulary per row block
with the online statistics) and `_logprobs_from_logits_bwd_kernel` (dlogits, possibly written over the logits)."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import NEG, cut_to_support, finalize_store, log_prob, online_update, outside_support, support_threshold

__all__ = ["_logprobs_from_logits_bwd_kernel", "_logprobs_from_logits_fwd_kernel"]


@triton.jit
def scaled(x, inv_temp, temp, TRUNCATE: tl.constexpr):
    """z = logits / temperature in fp32. With the sampler's support, an IEEE division, as the threshold search, the
    torch backend and vLLM's sampler compute it: x * (1 / T) can land an ulp away, and where the last kept value and
    the next one below are adjacent floats (their midpoint, the threshold, rounds onto the kept one) that ulp dropped
    the kept token. Without it the cheaper product."""
    if TRUNCATE:
        return tl.math.div_rn(x.to(tl.float32), temp)
    else:
        return x.to(tl.float32) * inv_temp


@triton.jit
def _logprobs_from_logits_fwd_kernel(
    x_ptr, t_ptr, logp_ptr, ent_ptr, stats_ptr, thr_ptr, N, V, stride_xn, stride_xv, inv_temp, temp, ignore_index,
    WITH_ENTROPY: tl.constexpr, WITH_STATS: tl.constexpr, TRUNCATE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """TRUNCATE: z below the row's threshold (thr_ptr, (N,)), except the target, is outside the sampler's support."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
    live = row_ok & (tgt != ignore_index)  # ignored rows: logits never read
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    u = tl.zeros((BLOCK_M,), dtype=tl.float32)
    zy = tl.zeros((BLOCK_M,), dtype=tl.float32)
    thr = support_threshold(thr_ptr, rows, row_ok, TRUNCATE, BLOCK_M)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        col_ok = cols < V
        x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :] * stride_xv,
                    mask=live[:, None] & col_ok[None, :], other=0.0)
        z = tl.where(col_ok[None, :], scaled(x, inv_temp, temp, TRUNCATE), NEG)
        hit = tl.arange(0, BLOCK_V)[None, :] == (tgt - v0).to(tl.int32)[:, None]
        zy += tl.sum(tl.where(hit, z, 0.0), axis=1)
        if TRUNCATE:
            z = cut_to_support(z, thr, hit)
        # -inf -> NEG (finite); NaN is kept (tl.maximum drops it by default), so that it reaches s
        m, s, u = online_update(m, s, u, tl.maximum(z, NEG, propagate_nan=tl.PropagateNan.ALL), WITH_ENTROPY)
    finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, stats_ptr, N, rows, row_ok, WITH_ENTROPY,
                   WITH_STATS)


@triton.jit
def _logprobs_from_logits_bwd_kernel(
    x_ptr, t_ptr, stats_ptr, ent_ptr, gl_ptr, ge_ptr, out_ptr, thr_ptr, N, V,
    stride_xn, stride_xv, stride_on, stride_ov, stride_stats, inv_temp, temp, ignore_index,
    HAS_GE: tl.constexpr, TRUNCATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """dlogits chunk by chunk; out_ptr may alias x_ptr (each element is read, then written, by one program);
    stats_ptr: the forward's (2, N) row statistics [m; log s], row stride stride_stats."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
    gl = tl.load(gl_ptr + rows, mask=row_ok, other=0.0)
    m = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
    log_s = tl.load(stats_ptr + stride_stats + rows, mask=row_ok, other=0.0)
    live = gl != 0.0
    if HAS_GE:
        ge = tl.load(ge_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        live = live | (ge != 0.0)
    live = live & row_ok & (tgt != ignore_index)
    thr = support_threshold(thr_ptr, rows, row_ok, TRUNCATE, BLOCK_M)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        col_ok = cols < V
        # elements not read (rows without gradient, columns past V) are -inf: p = 0, no exp overflow
        x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :] * stride_xv,
                    mask=live[:, None] & col_ok[None, :], other=float("-inf"))
        z = scaled(x, inv_temp, temp, TRUNCATE)
        hit = tl.arange(0, BLOCK_V)[None, :] == (tgt - v0).to(tl.int32)[:, None]
        if TRUNCATE:
            cut = outside_support(z, thr, hit)
        logp_j = log_prob(z, m, log_s)
        p = tl.exp(logp_j)
        dz = -gl[:, None] * p
        if HAS_GE:
            dz -= ge[:, None] * p * (logp_j + ent[:, None])
        dz += tl.where(hit, gl[:, None], 0.0)
        dz = tl.where(live[:, None], dz * inv_temp, 0.0)
        if TRUNCATE:  # outside the support: 0 (what a NEG logit gives, +0.0; and 0, not 0 * NaN, on a +inf row)
            dz = tl.where(cut, 0.0, dz)
        tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :] * stride_ov,
                 dz.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
