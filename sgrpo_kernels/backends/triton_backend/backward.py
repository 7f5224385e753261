"""The linear_logprobs backward kernels: `_compact_rows_kernel` (device-side list of the active rows), then per vocab
chunk `_linear_logprobs_bwd_dz_kernel` (dZ of the active rows), `_linear_logprobs_bwd_dh_kernel` (grad_hidden += dZ @ W)
and `_linear_logprobs_bwd_dw_kernel` (grad_W = dZ^T @ h, grad_b). No atomics: each output tile has one owner."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import log_prob, logits_tile, mma, outside_support, softcap_slope, support_threshold

__all__ = ["_compact_rows_kernel", "_linear_logprobs_bwd_dh_kernel", "_linear_logprobs_bwd_dw_kernel",
           "_linear_logprobs_bwd_dz_kernel"]


@triton.jit
def _compact_rows_kernel(keep_ptr, rank_ptr, idx_ptr, N, BLOCK: tl.constexpr):
    """idx[rank[i] - 1] = i for every kept row i (rank = inclusive cumsum of keep): active rows first, in order."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    keep = tl.load(keep_ptr + rows, mask=row_ok, other=0) != 0
    rank = tl.load(rank_ptr + rows, mask=row_ok, other=1).to(tl.int64)
    tl.store(idx_ptr + rank - 1, rows.to(tl.int32), mask=row_ok & keep)


@triton.jit
def _linear_logprobs_bwd_dz_kernel(
    h_ptr, w_ptr, b_ptr, t_ptr, stats_ptr, ent_ptr, gl_ptr, ge_ptr, idx_ptr, count_ptr, dz_ptr, thr_ptr,
    D, v0, vc,
    stride_hn, stride_hd, stride_wv, stride_wd, stride_b, stride_dz, stride_stats,
    inv_temp, cap_in, cap_out,  # z = x * inv_temp, or cap_out * tanh(cap_in * x) with SOFTCAP (as the forward)
    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, HAS_GE: tl.constexpr, TRUNCATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dZ[i, c] = dL/dx for compacted active row i and chunk column c (vocab v0 + c), x the raw logits, dtype of
    dz_ptr; stats_ptr: the (2, N) row statistics [m; log s] of the forward, row stride stride_stats. TRUNCATE: z
    below the row's threshold (thr_ptr, (N,)), except the target, is outside the support: dZ = 0 there."""
    pid_m = tl.program_id(0)
    pid_v = tl.program_id(1)
    n_active = tl.load(count_ptr)
    start = pid_m.to(tl.int64) * BLOCK_M
    if start < n_active:  # programs past the active rows do nothing
        i = start + tl.arange(0, BLOCK_M)
        i_ok = i < n_active
        rows = tl.load(idx_ptr + i, mask=i_ok, other=0).to(tl.int64)
        tgt = tl.load(t_ptr + rows, mask=i_ok, other=-1)
        m = tl.load(stats_ptr + rows, mask=i_ok, other=0.0)
        log_s = tl.load(stats_ptr + stride_stats + rows, mask=i_ok, other=0.0)
        gl = tl.load(gl_ptr + rows, mask=i_ok, other=0.0)
        thr = support_threshold(thr_ptr, rows, i_ok, TRUNCATE, BLOCK_M)
        cl = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        c_ok = cl < vc
        cols = v0 + cl.to(tl.int64)
        z = logits_tile(h_ptr, w_ptr, b_ptr, rows, i_ok, cols, c_ok, D, stride_hn, stride_hd, stride_wv,
                        stride_wd, stride_b, inv_temp, HAS_BIAS, DOT_PRECISION, BLOCK_M, BLOCK_V, BLOCK_D)
        if SOFTCAP:
            # dL/dx = dL/dz * slope, the slope folded in as early as possible so that its tile dies with p's
            z, slope = softcap_slope(z, cap_in, cap_out)
            hit = cl[None, :] == (tgt - v0).to(tl.int32)[:, None]
            if TRUNCATE:
                cut = outside_support(z, thr, hit)
            dz = tl.where(hit, gl[:, None] * slope, 0.0)
            logp_j = log_prob(z, m, log_s)
            p = tl.exp(logp_j) * slope
            dz -= gl[:, None] * p
            if HAS_GE:
                ge = tl.load(ge_ptr + rows, mask=i_ok, other=0.0)
                ent = tl.load(ent_ptr + rows, mask=i_ok, other=0.0)
                dz -= ge[:, None] * p * (logp_j + ent[:, None])
        else:
            if TRUNCATE:
                cut = outside_support(z, thr, cl[None, :] == (tgt - v0).to(tl.int32)[:, None])
            logp_j = log_prob(z, m, log_s)
            p = tl.exp(logp_j)
            dz = -gl[:, None] * p
            if HAS_GE:
                ge = tl.load(ge_ptr + rows, mask=i_ok, other=0.0)
                ent = tl.load(ent_ptr + rows, mask=i_ok, other=0.0)
                dz -= ge[:, None] * p * (logp_j + ent[:, None])
            hit = cl[None, :] == (tgt - v0).to(tl.int32)[:, None]  # int32 compare: cheaper than int64 tiles
            dz += tl.where(hit, gl[:, None], 0.0)
            dz = dz * inv_temp
        if TRUNCATE:  # outside the support: 0 (what a NEG logit gives, +0.0; and 0, not 0 * NaN, on a +inf row)
            dz = tl.where(cut, 0.0, dz)
        ptrs = dz_ptr + i[:, None] * stride_dz + cl[None, :]
        tl.store(ptrs, dz.to(dz_ptr.dtype.element_ty), mask=i_ok[:, None] & c_ok[None, :])


@triton.jit
def _linear_logprobs_bwd_dh_kernel(
    dz_ptr, w_ptr, idx_ptr, count_ptr, gh_ptr,
    D, v0, vc,
    stride_dz, stride_wv, stride_wd, stride_gh,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """grad_h[idx[i], d] += sum_c dZ[i, c] W[v0 + c, d]  (fp32 buffer; one program owns each (i, d) tile)."""
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    n_active = tl.load(count_ptr)
    start = pid_m.to(tl.int64) * BLOCK_M
    if start < n_active:
        i = start + tl.arange(0, BLOCK_M)
        i_ok = i < n_active
        dd = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = dd < D
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for k0 in range(0, vc, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < vc
            a = tl.load(dz_ptr + i[:, None] * stride_dz + kk[None, :], mask=i_ok[:, None] & k_ok[None, :],
                        other=0.0)
            b = tl.load(w_ptr + (v0 + kk.to(tl.int64))[:, None] * stride_wv + dd[None, :] * stride_wd,
                        mask=k_ok[:, None] & d_ok[None, :], other=0.0)
            acc = mma(a, b, acc, DOT_PRECISION)
        rows = tl.load(idx_ptr + i, mask=i_ok, other=0).to(tl.int64)
        ptrs = gh_ptr + rows[:, None] * stride_gh + dd[None, :]
        mask = i_ok[:, None] & d_ok[None, :]
        tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + acc, mask=mask)


@triton.jit
def _linear_logprobs_bwd_dw_kernel(
    dz_ptr, h_ptr, idx_ptr, count_ptr, gw_ptr, gb_ptr,
    D, v0, vc,
    stride_dz, stride_hn, stride_hd, stride_gw, stride_gb,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """grad_W[v0 + c, d] = sum_{i < count} dZ[i, c] h[idx[i], d];  grad_b[v0 + c] = sum_i dZ[i, c]."""
    pid_v = tl.program_id(0)
    pid_d = tl.program_id(1)
    n_active = tl.load(count_ptr)
    cl = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    c_ok = cl < vc
    dd = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = dd < D
    acc = tl.zeros((BLOCK_V, BLOCK_D), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for k0 in range(0, n_active, BLOCK_K):  # K = active rows only (device-side count)
        kk = k0 + tl.arange(0, BLOCK_K).to(tl.int64)
        k_ok = kk < n_active
        rows = tl.load(idx_ptr + kk, mask=k_ok, other=0).to(tl.int64)
        a = tl.load(dz_ptr + kk[None, :] * stride_dz + cl[:, None], mask=c_ok[:, None] & k_ok[None, :],
                    other=0.0)  # (BLOCK_V, BLOCK_K) = dZ^T tile
        hb = tl.load(h_ptr + rows[:, None] * stride_hn + dd[None, :] * stride_hd,
                     mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        acc = mma(a, hb, acc, DOT_PRECISION)
        if HAS_BIAS:
            acc_b += tl.sum(a.to(tl.float32), axis=1)
    cols = v0 + cl.to(tl.int64)
    tl.store(gw_ptr + cols[:, None] * stride_gw + dd[None, :], acc.to(gw_ptr.dtype.element_ty),
             mask=c_ok[:, None] & d_ok[None, :])
    if HAS_BIAS:
        if pid_d == 0:
            tl.store(gb_ptr + cols * stride_gb, acc_b.to(gb_ptr.dtype.element_ty), mask=c_ok)
