"""Shared `@triton.jit` tile helpers of the kernels: the matrix product, the logits tile, the online log-sum-exp /
entropy update, the target logit, the final store of logp / entropy / row statistics, the backward's log p and the
sampler's support (threshold, cut) (inlined into every kernel that calls them; docs in the package docstring)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["LOGP_FLOOR", "NEG", "cut_to_support", "finalize_store", "log_prob", "logits_tile", "mma", "online_update",
           "outside_support", "softcap", "softcap_slope", "support_threshold", "target_logit"]

# masked logit: exp(NEG - m) = 0 exactly, and finite so 0 * (z - m) = 0. Far below any logit a model produces (fp32
# ends at 3.4e38) but with room for NEG - m to stay finite: logits down to -1e38 keep their value in the statistics.
NEG = tl.constexpr(-1.0e38)
# -inf logits (masked vocabulary, -inf bias) are clamped to NEG for the statistics, and log p to LOGP_FLOOR in
# the backward: exp of either is exactly 0, so p is unchanged and no 0 * inf = nan appears
LOGP_FLOOR = tl.constexpr(-1.0e4)


@triton.jit
def mma(a, b, acc, DOT_PRECISION: tl.constexpr):
    """acc + a @ b. "upcast" (interpreter only): its numpy dot reads bf16 storage as raw uint16, so multiply in
    fp32 there (exact products, fp32 accumulation: what the bf16 tensor-core path computes)."""
    if DOT_PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def logits_tile(
    h_ptr, w_ptr, b_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wv, stride_wd, stride_b,
    inv_temp,
    HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """z = (h[rows] @ W[cols]^T + b[cols]) * inv_temp as a (BLOCK_M, BLOCK_V) fp32 tile; rows/cols are int64."""
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    h_base = h_ptr + rows[:, None] * stride_hn
    w_base = w_ptr + cols[:, None] * stride_wv
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        d_ok = dd < D
        h = tl.load(h_base + dd[None, :] * stride_hd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        w = tl.load(w_base + dd[None, :] * stride_wd, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        acc = mma(h, tl.trans(w), acc, DOT_PRECISION)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols * stride_b, mask=col_ok, other=0.0).to(tl.float32)
        acc = acc + b[None, :]
    return acc * inv_temp


@triton.jit
def softcap(x, cap_in, cap_out):
    """The softcapped head, z = cap_out * tanh(cap_in * x) with cap_in = logit_scale / softcap and cap_out = softcap /
    temperature (Gemma 2/3; the model's order: scale, cap, temperature), x the raw logits h W^T + b. Triton has no
    tanh: tanh y = 1 - 2 / (exp(2y) + 1), one exp per element (a second branch for small |y| made the forward spill
    registers on sm_90), with exact limits +-1 where exp overflows or underflows. Near y = 0 it keeps absolute, not
    relative, accuracy: |error| <= ~1.2e-7 * cap_out, below the fp32 rounding of the logits' own dot product."""
    return (1.0 - 2.0 / (tl.exp(2.0 * cap_in * x) + 1.0)) * cap_out


@triton.jit
def softcap_slope(x, cap_in, cap_out):
    """(z, dz/dx) of `softcap` for the backward: with e = exp(-2|y|), tanh |y| = (1 - e) / (1 + e) and
    dz/dx = cap_out * cap_in * 4 e / (1 + e)^2, exact (relative) where the cap saturates, unlike 1 - tanh^2."""
    y = x * cap_in
    e = tl.exp(-2.0 * tl.abs(y))
    one_e = 1.0 + e
    t = (1.0 - e) / one_e
    z = tl.where(y < 0.0, -t, t) * cap_out
    return z, (4.0 * e / (one_e * one_e)) * (cap_out * cap_in)


@triton.jit
def online_update(m, s, u, z, WITH_ENTROPY: tl.constexpr):
    """Fold the tile z (BLOCK_M, BLOCK_V) into the per-row statistics. Masked columns must hold NEG (finite, so
    e * (z - m) is 0 * finite rather than 0 * inf: no per-element masks here, fewer live registers)."""
    m_new = tl.maximum(m, tl.max(z, axis=1))
    # a +inf logit: the sums are kept relative to 0 instead of m = +inf (inf - inf = nan), so s becomes +inf and
    # logp = -inf, as in the torch backend; a per-row select, the same bits on every finite row
    m_ref = tl.where(m_new == float("inf"), 0.0, m_new)
    scale = tl.exp(m - m_ref)  # 0 on the first tile (m = -inf)
    zc = z - m_ref[:, None]
    e = tl.exp(zc)  # a NaN logit (kept by the callers' clamp) makes s NaN: the row's results are NaN
    if WITH_ENTROPY:
        # the shift is 0 where the scale vanishes: the first tile (m = -inf) and rows with only NEG columns so far,
        # whose s * (m - m_new) = s * -1e38 would overflow to -inf (and 0 * -inf = nan)
        shift = tl.where(scale == 0.0, 0.0, m - m_ref)
        u = scale * (u + s * shift) + tl.sum(e * zc, axis=1)
    s = s * scale + tl.sum(e, axis=1)
    return m_new, s, u


@triton.jit
def target_logit(h_ptr, w_ptr, b_ptr, rows, row_ok, tgt, D, stride_hn, stride_hd, stride_wv, stride_wd, stride_b,
                 inv_temp, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """z_y = (h . W_y + b_y) * inv_temp per row, as a row-wise dot (kept out of the tile epilogue); 0 if ignored."""
    ok = row_ok & (tgt >= 0)
    y = tl.where(ok, tgt, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (dd < D)[None, :]
        h = tl.load(h_ptr + rows[:, None] * stride_hn + dd[None, :] * stride_hd, mask=mask, other=0.0)
        w = tl.load(w_ptr + y[:, None] * stride_wv + dd[None, :] * stride_wd, mask=mask, other=0.0)
        acc += h.to(tl.float32) * w.to(tl.float32)
    zy = tl.sum(acc, axis=1)
    if HAS_BIAS:
        zy += tl.load(b_ptr + y * stride_b, mask=ok, other=0.0).to(tl.float32)
    return tl.where(ok, zy * inv_temp, 0.0)


@triton.jit
def finalize_store(m, s, u, zy, ignored, logp_ptr, ent_ptr, stats_ptr, stride_stats, rows, row_ok,
                   WITH_ENTROPY: tl.constexpr, WITH_STATS: tl.constexpr):
    """Turn the row statistics into logp = (z_y - m) - log s, entropy and stats = [m; log s] (a (2, N) tensor with
    row stride `stride_stats`; all 0 on ignored rows) and store the requested ones. The shifted form keeps log s at
    any |m| (m + log s would round it away). logp <= 0 and H >= 0 hold exactly: z_y comes from a row-wise dot, m from
    the tiles' tensor-core sums, and on a confident row (p ~ 1) their different summation orders would otherwise give
    log p ~ +1e-5.

    Non-finite logits give what the torch backend gives: a NaN logit makes s NaN, so logp, entropy and log s are NaN
    (the clamps propagate NaN); a +inf logit makes s +inf (see online_update): logp -inf (NaN at a +inf target),
    entropy NaN; a row of -inf logits only (every column at NEG: m = NEG) has no distribution: logp and entropy NaN,
    stats [-inf; -inf] (the torch backend's, which the vocab-parallel combine weighs 0). Per-row work only."""
    dead = m == NEG
    log_s = tl.log(s)
    logp = tl.minimum((zy - m) - log_s, 0.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(logp_ptr + rows, tl.where(ignored, 0.0, tl.where(dead, float("nan"), logp)), mask=row_ok)
    if WITH_ENTROPY:
        ent = tl.maximum(log_s - u / s, 0.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(ent_ptr + rows, tl.where(ignored, 0.0, tl.where(dead, float("nan"), ent)), mask=row_ok)
    if WITH_STATS:
        m = tl.where(dead, float("-inf"), m)
        log_s = tl.where(dead, float("-inf"), log_s)
        tl.store(stats_ptr + rows, tl.where(ignored, 0.0, m), mask=row_ok)
        tl.store(stats_ptr + stride_stats + rows, tl.where(ignored, 0.0, log_s), mask=row_ok)


@triton.jit
def log_prob(z, m, log_s):
    """The backward's log p = (z - m) - log s of a (rows, cols) tile from the saved row statistics (never z - lse:
    lse = m + log s is rounded at large |m|), floored at LOGP_FLOOR (p = 0 exactly there; -inf logits stay finite).
    NaN stays NaN (a NaN logit, or a row whose statistics are NaN): its gradient is NaN, as in the torch backend."""
    return tl.maximum((z - m[:, None]) - log_s[:, None], LOGP_FLOOR, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def support_threshold(thr_ptr, rows, row_ok, TRUNCATE: tl.constexpr, BLOCK_M: tl.constexpr):
    """The rows' threshold of the sampler's support (thr_ptr, (N,)) with TRUNCATE; -inf (nothing cut) without."""
    thr = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    if TRUNCATE:
        thr = tl.load(thr_ptr + rows, mask=row_ok, other=float("-inf"))
    return thr


@triton.jit
def outside_support(z, thr, hit):
    """Where z is outside the sampler's support: below the row's threshold `thr`, except the target column (`hit`).
    A NaN logit is below no threshold: it stays in (its row's results are NaN), as in the torch backend."""
    return (z < thr[:, None]) & ~hit


@triton.jit
def cut_to_support(z, thr, hit):
    """z outside the sampler's support (`outside_support`): NEG (p = 0)."""
    return tl.where(outside_support(z, thr, hit), NEG, z)
