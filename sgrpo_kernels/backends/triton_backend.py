"""The `triton` backend: fused LM head -> log-prob + entropy kernels for CUDA (and CPU under TRITON_INTERPRET=1).

Layers (one name stem per op): `_linear_logprobs_fwd_kernel` ... -> launchers `linear_logprobs_fwd/_bwd`,
`logprobs_from_logits_fwd/_bwd` (the backend interface of `sgrpo_kernels.backends`).

linear_logprobs forward
    Grid (row blocks, vocab splits). A program owns BLOCK_M rows and one contiguous vocab span; for each BLOCK_V
    column block it computes the logits tile z = (h @ W^T + b) / tau with `tl.dot` over D (fp32 accumulator; the
    tile lives only in registers) and folds it into per-row online statistics in fp32:
        m = running max,  s = sum exp(z - m),  u = sum exp(z - m) * (z - m),  z_y = target logit
    (u is kept relative to m, as in the torch backend, so H = log s - u / s never cancels two large numbers).
    When the row blocks alone cannot fill the GPU the vocabulary is split across programs; each writes its partial
    (m, s, u, z_y) and `_linear_logprobs_merge_kernel` combines them (a log-sum-exp merge) into logp, entropy, lse.

linear_logprobs backward (no atomics: every output element is owned by one program; deterministic by construction)
    1. Device-side compaction of the active rows (target != ignore_index and a non-zero upstream gradient): an
       inclusive cumsum (torch, on device) and `_compact_rows_kernel` scattering each active row to its rank build
       `idx` (active rows first) and a one-element device `count`. No host synchronization: every later grid is sized
       for the worst case (all N rows) and programs past `count` exit at once, or loop only up to `count`.
    2. For each vocab chunk [v0, v0 + vc) (vc from the memory budget):
       `_linear_logprobs_bwd_dz_kernel` recomputes the logits tile of the active rows (tl.dot over D) and writes
           dZ = [g_logp (1[j = y] - p) - g_H p (z - lse + H)] / tau      into a (N, vc) buffer, compacted row order;
       `_linear_logprobs_bwd_dh_kernel`  grad_h[idx] += dZ @ W[v0:v0+vc]   (fp32 accumulator buffer, K = vc);
       `_linear_logprobs_bwd_dw_kernel`  grad_W[v0:v0+vc] = dZ^T @ h[idx], grad_b = column sums of dZ, K = count:
           the loop over active rows stops at the device-side count, so the cost is proportional to active rows.
    dZ is stored in the input dtype (bf16/fp16; fp32 for fp32 inputs) like a cuBLAS-fed GEMM would; all products
    accumulate in fp32. Chunks run in stream order and each (row, d) / (v, d) tile is written by exactly one program,
    so gradients are bitwise identical run to run whether or not `opts.deterministic` is set.

logprobs_from_logits
    Forward: one pass over V per row block with the same online statistics. Backward: per row block, vocab chunk by
    vocab chunk, dlogits written into a new buffer or (opts.inplace_backward) into `logits` itself; rows without
    gradient get zeros without reading their logits.

Dtypes: fp32, bf16, fp16 computed natively (tl.dot in the input dtype, fp32 accumulation; fp32 dot products use
"ieee" precision, never TF32). fp64 inputs are computed in fp32 (the kernels read fp32 copies); outputs and gradients
are returned in fp64 but are fp32-accurate: use the torch backend when fp64 accuracy matters.
"""

from __future__ import annotations

import functools
import os

import torch

from sgrpo_kernels.backends import Options, env_flag, stats_dtype

try:
    import triton
    import triton.language as tl

    _IMPORT_ERROR = ""
except ImportError as exc:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    _IMPORT_ERROR = str(exc)

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE_TYPES = ("cuda", "cpu") if _INTERPRET else ("cuda",)

# dZ chunk buffer (N x vc elements) of the linear backward; opts.memory_budget overrides.
DEFAULT_MEMORY_BUDGET = 64 * 2**20
# Tests may set this to force a number of vocab splits in the linear forward (None = heuristic).
FORCE_SPLITS: int | None = None
# Tests set this: output and scratch buffers start as NaN instead of uninitialized memory.
POISON = False


def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _interpreter_problem(triton_version: str, numpy_version: str) -> str:
    """Why this triton's interpreter cannot run our kernels with this numpy ("" when it can). Triton <= 3.6 turns
    1-element arrays into Python ints (loop bounds), which numpy >= 2.4 refuses; triton 3.7+ does not."""
    if _version(triton_version) < (3, 7) and _version(numpy_version) >= (2, 4):
        return (f"TRITON_INTERPRET=1 with triton {triton_version} needs numpy < 2.4 (found numpy {numpy_version}: "
                "its interpreter converts 1-element arrays to int, an error since numpy 2.4); "
                "install 'numpy<2.4' or 'triton>=3.7'")
    return ""


def is_available() -> tuple[bool, str]:
    if triton is None:
        return False, f"triton is not importable: {_IMPORT_ERROR}"
    if _INTERPRET:
        import numpy

        problem = _interpreter_problem(triton.__version__, numpy.__version__)
        return (False, problem) if problem else (True, "")
    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on CPU tensors in the interpreter)"
    return True, ""


# ------------------------------------------------------------------------------------------------------- kernels

if triton is not None:
    _NEG = tl.constexpr(-1.0e30)  # masked logit: exp(_NEG - m) = 0 exactly, and finite so 0 * (z - m) = 0
    # -inf logits (masked vocabulary, -inf bias) are clamped to _NEG for the statistics, and log p to _LOGP_FLOOR in
    # the backward: exp of either is exactly 0, so p is unchanged and no 0 * inf = nan appears
    _LOGP_FLOOR = tl.constexpr(-1.0e4)

    @triton.jit
    def _mma(a, b, acc, DOT_PRECISION: tl.constexpr):
        """acc + a @ b. "upcast" (interpreter only): its numpy dot reads bf16 storage as raw uint16, so multiply in
        fp32 there (exact products, fp32 accumulation: what the bf16 tensor-core path computes)."""
        if DOT_PRECISION == "upcast":
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    @triton.jit
    def _logits_tile(
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
            acc = _mma(h, tl.trans(w), acc, DOT_PRECISION)
        if HAS_BIAS:
            b = tl.load(b_ptr + cols * stride_b, mask=col_ok, other=0.0).to(tl.float32)
            acc = acc + b[None, :]
        return acc * inv_temp

    @triton.jit
    def _online_update(m, s, u, z, WITH_ENTROPY: tl.constexpr):
        """Fold the tile z (BLOCK_M, BLOCK_V) into the per-row statistics. Masked columns must hold _NEG (finite, so
        e * (z - m) is 0 * finite rather than 0 * inf: no per-element masks here, fewer live registers)."""
        m_new = tl.maximum(m, tl.max(z, axis=1))
        scale = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        zc = z - m_new[:, None]
        e = tl.exp(zc)
        if WITH_ENTROPY:
            shift = tl.where(m == float("-inf"), 0.0, m - m_new)
            u = scale * (u + s * shift) + tl.sum(e * zc, axis=1)
        s = s * scale + tl.sum(e, axis=1)
        return m_new, s, u

    @triton.jit
    def _target_logit(h_ptr, w_ptr, b_ptr, rows, row_ok, tgt, D, stride_hn, stride_hd, stride_wv, stride_wd, stride_b,
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
    def _finalize_store(m, s, u, zy, ignored, logp_ptr, ent_ptr, lse_ptr, rows, row_ok,
                        WITH_ENTROPY: tl.constexpr, WITH_LSE: tl.constexpr):
        """Turn the row statistics into logp, entropy, lse (0 on ignored rows) and store the requested ones.
        logp <= 0 and H >= 0 hold exactly: z_y comes from a row-wise dot, lse from the tiles' tensor-core sums, and on
        a confident row (p ~ 1) their different summation orders would otherwise give log p ~ +1e-5."""
        log_s = tl.log(s)
        lse = m + log_s
        tl.store(logp_ptr + rows, tl.where(ignored, 0.0, tl.minimum(zy - lse, 0.0)), mask=row_ok)
        if WITH_ENTROPY:
            tl.store(ent_ptr + rows, tl.where(ignored, 0.0, tl.maximum(log_s - u / s, 0.0)), mask=row_ok)
        if WITH_LSE:
            tl.store(lse_ptr + rows, tl.where(ignored, 0.0, lse), mask=row_ok)

    @triton.jit
    def _linear_logprobs_fwd_kernel(
        h_ptr, w_ptr, b_ptr, t_ptr,
        logp_ptr, ent_ptr, lse_ptr,  # (N,) final outputs, written when not SPLIT
        pm_ptr, ps_ptr, pu_ptr, pzy_ptr,  # (splits, N) partial statistics, written when SPLIT
        N, V, D, v_per_split,
        stride_hn, stride_hd, stride_wv, stride_wd, stride_b,
        inv_temp, ignore_index,
        HAS_BIAS: tl.constexpr, WITH_ENTROPY: tl.constexpr, WITH_LSE: tl.constexpr, SPLIT: tl.constexpr,
        DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)  # rows on axis 0: up to 2^31 - 1 blocks
        pid_s = tl.program_id(1)
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < N
        tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
        v_start = pid_s * v_per_split
        v_end = tl.minimum(v_start + v_per_split, V)
        m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        u = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if pid_s == 0:  # the target logit is computed once per row, by the first split
            zy = _target_logit(h_ptr, w_ptr, b_ptr, rows, row_ok, tgt, D, stride_hn, stride_hd, stride_wv, stride_wd,
                               stride_b, inv_temp, HAS_BIAS, BLOCK_M, BLOCK_D)
        else:
            zy = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for v0 in range(v_start, v_end, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
            col_ok = cols < v_end
            z = _logits_tile(h_ptr, w_ptr, b_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wv,
                             stride_wd, stride_b, inv_temp, HAS_BIAS, DOT_PRECISION, BLOCK_M, BLOCK_V, BLOCK_D)
            z = tl.where(col_ok[None, :], tl.maximum(z, _NEG), _NEG)
            m, s, u = _online_update(m, s, u, z, WITH_ENTROPY)
        if SPLIT:
            off = pid_s.to(tl.int64) * N + rows
            tl.store(pm_ptr + off, m, mask=row_ok)
            tl.store(ps_ptr + off, s, mask=row_ok)
            tl.store(pzy_ptr + off, zy, mask=row_ok)
            if WITH_ENTROPY:
                tl.store(pu_ptr + off, u, mask=row_ok)
        else:
            _finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, lse_ptr, rows, row_ok, WITH_ENTROPY,
                            WITH_LSE)

    @triton.jit
    def _linear_logprobs_merge_kernel(
        pm_ptr, ps_ptr, pu_ptr, pzy_ptr, t_ptr, logp_ptr, ent_ptr, lse_ptr, N, n_splits, ignore_index,
        WITH_ENTROPY: tl.constexpr, WITH_LSE: tl.constexpr, BLOCK: tl.constexpr,
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
            a = tl.exp(m - m_new)
            b = tl.exp(mk - m_new)
            if WITH_ENTROPY:
                uk = tl.load(pu_ptr + off, mask=row_ok, other=0.0)
                shift = tl.where(m == float("-inf"), 0.0, m - m_new)
                u = a * (u + s * shift) + b * (uk + sk * (mk - m_new))
            s = a * s + b * sk
            m = m_new
        _finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, lse_ptr, rows, row_ok, WITH_ENTROPY,
                        WITH_LSE)

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
        h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, ent_ptr, gl_ptr, ge_ptr, idx_ptr, count_ptr, dz_ptr,
        D, v0, vc,
        stride_hn, stride_hd, stride_wv, stride_wd, stride_b, stride_dz,
        inv_temp,
        HAS_BIAS: tl.constexpr, HAS_GE: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """dZ[i, c] for compacted active row i and chunk column c (vocab v0 + c), dtype of dz_ptr."""
        pid_m = tl.program_id(0)
        pid_v = tl.program_id(1)
        n_active = tl.load(count_ptr)
        start = pid_m.to(tl.int64) * BLOCK_M
        if start < n_active:  # programs past the active rows do nothing
            i = start + tl.arange(0, BLOCK_M)
            i_ok = i < n_active
            rows = tl.load(idx_ptr + i, mask=i_ok, other=0).to(tl.int64)
            tgt = tl.load(t_ptr + rows, mask=i_ok, other=-1)
            lse = tl.load(lse_ptr + rows, mask=i_ok, other=0.0)
            gl = tl.load(gl_ptr + rows, mask=i_ok, other=0.0)
            cl = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
            c_ok = cl < vc
            cols = v0 + cl.to(tl.int64)
            z = _logits_tile(h_ptr, w_ptr, b_ptr, rows, i_ok, cols, c_ok, D, stride_hn, stride_hd, stride_wv,
                             stride_wd, stride_b, inv_temp, HAS_BIAS, DOT_PRECISION, BLOCK_M, BLOCK_V, BLOCK_D)
            logp_j = tl.maximum(z - lse[:, None], _LOGP_FLOOR)
            p = tl.exp(logp_j)
            dz = -gl[:, None] * p
            if HAS_GE:
                ge = tl.load(ge_ptr + rows, mask=i_ok, other=0.0)
                ent = tl.load(ent_ptr + rows, mask=i_ok, other=0.0)
                dz -= ge[:, None] * p * (logp_j + ent[:, None])
            hit = cl[None, :] == (tgt - v0).to(tl.int32)[:, None]  # int32 compare: cheaper than int64 tiles
            dz += tl.where(hit, gl[:, None], 0.0)
            dz = dz * inv_temp
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
                acc = _mma(a, b, acc, DOT_PRECISION)
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
            acc = _mma(a, hb, acc, DOT_PRECISION)
            if HAS_BIAS:
                acc_b += tl.sum(a.to(tl.float32), axis=1)
        cols = v0 + cl.to(tl.int64)
        tl.store(gw_ptr + cols[:, None] * stride_gw + dd[None, :], acc.to(gw_ptr.dtype.element_ty),
                 mask=c_ok[:, None] & d_ok[None, :])
        if HAS_BIAS:
            if pid_d == 0:
                tl.store(gb_ptr + cols * stride_gb, acc_b.to(gb_ptr.dtype.element_ty), mask=c_ok)

    @triton.jit
    def _logprobs_from_logits_fwd_kernel(
        x_ptr, t_ptr, logp_ptr, ent_ptr, lse_ptr, N, V, stride_xn, stride_xv, inv_temp, ignore_index,
        WITH_ENTROPY: tl.constexpr, WITH_LSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < N
        tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
        live = row_ok & (tgt != ignore_index)  # ignored rows: logits never read
        m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        u = tl.zeros((BLOCK_M,), dtype=tl.float32)
        zy = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
            col_ok = cols < V
            x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :] * stride_xv,
                        mask=live[:, None] & col_ok[None, :], other=0.0)
            z = tl.where(col_ok[None, :], x.to(tl.float32) * inv_temp, _NEG)
            hit = tl.arange(0, BLOCK_V)[None, :] == (tgt - v0).to(tl.int32)[:, None]
            zy += tl.sum(tl.where(hit, z, 0.0), axis=1)
            m, s, u = _online_update(m, s, u, tl.maximum(z, _NEG), WITH_ENTROPY)
        _finalize_store(m, s, u, zy, tgt == ignore_index, logp_ptr, ent_ptr, lse_ptr, rows, row_ok, WITH_ENTROPY,
                        WITH_LSE)

    @triton.jit
    def _logprobs_from_logits_bwd_kernel(
        x_ptr, t_ptr, lse_ptr, ent_ptr, gl_ptr, ge_ptr, out_ptr, N, V,
        stride_xn, stride_xv, stride_on, stride_ov, inv_temp, ignore_index,
        HAS_GE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    ):
        """dlogits chunk by chunk; out_ptr may alias x_ptr (each element is read, then written, by one program)."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < N
        tgt = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index)
        gl = tl.load(gl_ptr + rows, mask=row_ok, other=0.0)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        live = gl != 0.0
        if HAS_GE:
            ge = tl.load(ge_ptr + rows, mask=row_ok, other=0.0)
            ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
            live = live | (ge != 0.0)
        live = live & row_ok & (tgt != ignore_index)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
            col_ok = cols < V
            x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :] * stride_xv,
                        mask=live[:, None] & col_ok[None, :], other=0.0)
            logp_j = tl.maximum(x.to(tl.float32) * inv_temp - lse[:, None], _LOGP_FLOOR)
            p = tl.exp(logp_j)
            dz = -gl[:, None] * p
            if HAS_GE:
                dz -= ge[:, None] * p * (logp_j + ent[:, None])
            dz += tl.where(tl.arange(0, BLOCK_V)[None, :] == (tgt - v0).to(tl.int32)[:, None], gl[:, None], 0.0)
            dz = tl.where(live[:, None], dz * inv_temp, 0.0)
            tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :] * stride_ov,
                     dz.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# -------------------------------------------------------------------------------------------------- configuration


def _on_gpu(t: torch.Tensor) -> bool:
    """True when the kernels are compiled for a GPU (autotuning); False under the interpreter."""
    return t.device.type == "cuda" and not _INTERPRET


def _is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Interpreter: one small config each (numpy runs a program per grid point; few, larger tiles are faster there).
_INTERP_TILE = dict(BLOCK_M=16, BLOCK_V=32, BLOCK_D=16)
_INTERP_GEMM_DH = dict(BLOCK_M=16, BLOCK_D=32, BLOCK_K=32)
_INTERP_GEMM_DW = dict(BLOCK_V=32, BLOCK_D=32, BLOCK_K=16)
_INTERP_LOGITS = dict(BLOCK_M=16, BLOCK_V=64)

# Nominal BLOCK_M used to decide the vocab split (the autotuned BLOCK_M may differ; it only sizes grid axis 0).
_GPU_FWD_BLOCK_M = 128
_SPLIT_ALIGN = 256  # vocab span of a split: a multiple of every BLOCK_V candidate
_CHUNK_ALIGN = 256  # backward vocab chunk: a multiple of every BLOCK_V / BLOCK_K candidate


def _cfg(num_warps: int, num_stages: int, **meta) -> triton.Config:
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _tile_configs(hopper: bool, epilogue_heavy: bool = False, fp32: bool = False) -> list:
    """Forward (and, with epilogue_heavy, the dZ kernel: its 128x256 tile spills registers on sm_90)."""
    if fp32:  # "ieee" fp32 dot products run on FMA units with operands in registers: small tiles, no spills
        return [_cfg(4, 2, BLOCK_M=64, BLOCK_V=64, BLOCK_D=32), _cfg(8, 2, BLOCK_M=128, BLOCK_V=64, BLOCK_D=32)]
    if hopper:  # H100/H200: 228 KB shared memory, wgmma; no register spills at these sizes (test_triton_compile)
        wide = [] if epilogue_heavy else [_cfg(8, 3, BLOCK_M=128, BLOCK_V=256, BLOCK_D=64)]
        return wide + [
            _cfg(8, 4, BLOCK_M=128, BLOCK_V=128, BLOCK_D=64),
            _cfg(8, 3, BLOCK_M=128, BLOCK_V=128, BLOCK_D=128),
            _cfg(4, 4, BLOCK_M=64, BLOCK_V=128, BLOCK_D=64),
        ]
    return [  # Ampere/Ada and older: a sane default that fits ~100 KB of shared memory
        _cfg(4, 3, BLOCK_M=64, BLOCK_V=128, BLOCK_D=32),
        _cfg(8, 3, BLOCK_M=128, BLOCK_V=128, BLOCK_D=32),
    ]


def _gemm_configs(hopper: bool, m: str, n: str, k: str, fp32: bool = False) -> list:
    """grad_h (m = BLOCK_M) and grad_W (m = BLOCK_V) products. grad_h's read-modify-write epilogue spills at 128x256
    and at 128x128 with 4 warps, so those are grad_W-only."""
    if fp32:
        shapes = [(64, 64, 32, 4, 2), (128, 64, 32, 8, 2)]
    elif hopper:
        shapes = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4)]
        if m == "BLOCK_V":
            shapes += [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]
    else:
        shapes = [(128, 128, 32, 8, 3), (64, 128, 32, 4, 3)]  # 128x128 with 4 warps spills on sm_80
    return [_cfg(w, st, **{m: bm, n: bn, k: bk}) for bm, bn, bk, w, st in shapes]


def _logits_fwd_configs() -> list:
    return [_cfg(8, 2, BLOCK_M=1, BLOCK_V=4096), _cfg(4, 2, BLOCK_M=1, BLOCK_V=2048),
            _cfg(8, 2, BLOCK_M=2, BLOCK_V=2048)]


def _logits_bwd_config() -> dict:
    """Not autotuned: the kernel may overwrite its own input, so it cannot be re-run for timing."""
    return dict(BLOCK_M=1, BLOCK_V=4096, num_warps=8)


@functools.cache
def _tuned(name: str, hopper: bool, fp32: bool):
    """Autotuned wrappers (CUDA only), built lazily so the interpreter never touches CUDA."""
    if name == "fwd":
        return triton.autotune(_tile_configs(hopper, fp32=fp32), key=["D", "V", "HAS_BIAS", "WITH_ENTROPY", "SPLIT"])(
            _linear_logprobs_fwd_kernel)
    if name == "dz":
        return triton.autotune(_tile_configs(hopper, epilogue_heavy=True, fp32=fp32),
                               key=["D", "vc", "HAS_BIAS", "HAS_GE"])(_linear_logprobs_bwd_dz_kernel)
    if name == "dh":  # read-modify-write of the fp32 accumulator: restore it between tuning runs
        return triton.autotune(_gemm_configs(hopper, "BLOCK_M", "BLOCK_D", "BLOCK_K", fp32), key=["D", "vc"],
                               restore_value=["gh_ptr"])(_linear_logprobs_bwd_dh_kernel)
    if name == "dw":
        return triton.autotune(_gemm_configs(hopper, "BLOCK_V", "BLOCK_D", "BLOCK_K", fp32),
                               key=["D", "vc", "HAS_BIAS"])(_linear_logprobs_bwd_dw_kernel)
    if name == "logits_fwd":
        return triton.autotune(_logits_fwd_configs(), key=["V", "WITH_ENTROPY"])(_logprobs_from_logits_fwd_kernel)
    raise KeyError(name)


# Env SGRPO_TRITON_AUTOTUNE=0: every kernel runs its first listed config instead of autotuning. For test suites that
# call the kernels at many small shapes (each new shape would otherwise compile and time every config); timings and
# benchmarks keep autotuning.
ENV_AUTOTUNE = "SGRPO_TRITON_AUTOTUNE"


def _autotune_enabled() -> bool:
    return env_flag(ENV_AUTOTUNE, True)


@functools.cache
def _fixed_config(name: str, hopper: bool, fp32: bool) -> triton.Config:
    """The config a kernel runs with when autotuning is off: the first of the list _tuned would search."""
    return _tuned(name, hopper, fp32).configs[0]


def _launch(name: str, kernel, grid, ref: torch.Tensor, interp_meta: dict, *args, **kwargs) -> None:
    """Autotuned launch on a GPU (a fixed config with SGRPO_TRITON_AUTOTUNE=0); the one interpreter config otherwise.
    `grid(meta)` gets the block sizes."""
    if _on_gpu(ref):
        hopper, fp32 = _is_hopper(ref.device), ref.dtype == torch.float32
        if _autotune_enabled():
            _tuned(name, hopper, fp32)[grid](*args, **kwargs)
        else:
            cfg = _fixed_config(name, hopper, fp32)
            kernel[grid(cfg.kwargs)](*args, **kwargs, **cfg.kwargs, num_warps=cfg.num_warps,
                                     num_stages=cfg.num_stages)
    else:
        kernel[grid(interp_meta)](*args, **kwargs, **interp_meta)


def _dot_precision(dtype: torch.dtype, ref: torch.Tensor) -> str:
    if dtype == torch.bfloat16 and not _on_gpu(ref):
        return "upcast"  # see _mma
    return "ieee"  # fp32 inputs: no TF32 (the contract is fp32 accuracy); ignored for bf16/fp16


def _compute_inputs(*tensors):
    """fp64 -> fp32 copies (the kernels compute in fp32); other dtypes unchanged."""
    return tuple(t.float() if t is not None and t.dtype == torch.float64 else t for t in tensors)


def _new(shape, ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An output buffer the kernels must fully write; NaN-filled when POISON is set (tests), so a skipped row shows."""
    if POISON:
        return torch.full(shape, float("nan"), device=ref.device, dtype=dtype)
    return torch.empty(shape, device=ref.device, dtype=dtype)


def _f32_rows(n: int, ref: torch.Tensor) -> torch.Tensor:
    return _new((n,), ref)


def _empty(ref: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, device=ref.device, dtype=torch.float32)


def _as_output_dtype(in_dtype: torch.dtype, *stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The op's statistics dtype (fp64 for fp64 inputs; computed here in fp32, so fp32-accurate values)."""
    dtype = stats_dtype(in_dtype)
    return tuple(t.to(dtype) for t in stats)


def _num_splits(n: int, vocab: int, ref: torch.Tensor) -> tuple[int, int]:
    """(number of vocab splits, vocab columns per split) for the linear forward."""
    if FORCE_SPLITS is not None:
        want = max(1, FORCE_SPLITS)
        align = _INTERP_TILE["BLOCK_V"] if not _on_gpu(ref) else _SPLIT_ALIGN
    elif _on_gpu(ref):
        row_blocks = triton.cdiv(n, _GPU_FWD_BLOCK_M)
        target = 2 * _num_sms(ref.device.index if ref.device.index is not None else torch.cuda.current_device())
        want = max(1, target // max(row_blocks, 1)) if row_blocks < target else 1
        align = _SPLIT_ALIGN
    else:  # interpreter: split small problems too, so the merge path is exercised by the shared suite
        row_blocks = triton.cdiv(n, _INTERP_TILE["BLOCK_M"])
        want = 2 if row_blocks < 2 else 1
        align = _INTERP_TILE["BLOCK_V"]
    per = triton.cdiv(triton.cdiv(vocab, want), align) * align
    splits = triton.cdiv(vocab, per)
    return splits, per


# ----------------------------------------------------------------------------------------------- linear_logprobs


def linear_logprobs_fwd(hidden, weight, targets, bias, opts: Options):
    """hidden (N, D), weight (V, D), targets (N,), bias (V,) | None -> (logp, entropy | (0,), lse | (0,)), fp32
    (fp64 for fp64 inputs)."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    in_dtype = hidden.dtype
    logp = _f32_rows(n, hidden)
    ent = _f32_rows(n, hidden) if opts.return_entropy else _empty(hidden)
    lse = _f32_rows(n, hidden) if opts.need_lse else _empty(hidden)
    if n == 0:
        return _as_output_dtype(in_dtype, logp, ent, lse)
    hidden, weight, bias = _compute_inputs(hidden, weight, bias)
    splits, per = _num_splits(n, vocab, hidden)
    if splits > 1:
        part = torch.empty((4 if opts.return_entropy else 3, splits, n), device=hidden.device, dtype=torch.float32)
        pm, ps, pzy = part[0], part[1], part[2]
        pu = part[3] if opts.return_entropy else pm
    else:
        pm = ps = pu = pzy = logp  # unused
    b_arg = bias if bias is not None else weight
    _launch(
        "fwd", _linear_logprobs_fwd_kernel, lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), splits), hidden,
        _INTERP_TILE,
        hidden, weight, b_arg, targets, logp, ent if opts.return_entropy else logp, lse if opts.need_lse else logp,
        pm, ps, pu, pzy, n, vocab, d, per,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        bias.stride(0) if bias is not None else 0,
        1.0 / opts.temperature, opts.ignore_index,
        HAS_BIAS=bias is not None, WITH_ENTROPY=opts.return_entropy, WITH_LSE=opts.need_lse, SPLIT=splits > 1,
        DOT_PRECISION=_dot_precision(hidden.dtype, hidden),
    )
    if splits > 1:
        block = 128
        _linear_logprobs_merge_kernel[(triton.cdiv(n, block),)](
            pm, ps, pu, pzy, targets, logp, ent if opts.return_entropy else logp, lse if opts.need_lse else logp,
            n, splits, opts.ignore_index, WITH_ENTROPY=opts.return_entropy, WITH_LSE=opts.need_lse, BLOCK=block,
        )
    return _as_output_dtype(in_dtype, logp, ent, lse)


def _compact_active_rows(targets, grad_logp, grad_entropy, ignore_index) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx (N,) int32 with the active rows first, count (1,) int32 on device). No host synchronization."""
    n = targets.shape[0]
    live = grad_logp != 0
    if grad_entropy is not None:
        live = live | (grad_entropy != 0)
    keep = (live & (targets != ignore_index)).to(torch.int32)
    rank = torch.cumsum(keep, 0, dtype=torch.int32)
    idx = torch.empty(n, device=targets.device, dtype=torch.int32)  # entries past count are never read
    block = 1024
    _compact_rows_kernel[(triton.cdiv(n, block),)](keep, rank, idx, n, BLOCK=block)
    return idx, rank[n - 1:]


def _chunk_width(n: int, vocab: int, elem_bytes: int, memory_budget: int, ref: torch.Tensor) -> int:
    budget = memory_budget if memory_budget > 0 else DEFAULT_MEMORY_BUDGET
    align = _CHUNK_ALIGN if _on_gpu(ref) else _INTERP_TILE["BLOCK_V"]
    vc = budget // max(n * elem_bytes, 1) // align * align
    return min(max(vc, align), vocab)


def linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, lse, entropy, opts: Options):
    """-> grad_hidden (N, D) hidden.dtype, grad_weight (V, D) weight.dtype, grad_bias (V,) | None."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    out_dtype = hidden.dtype
    has_ge = grad_entropy is not None and entropy is not None and entropy.numel() > 0 and opts.return_entropy
    h, w, b, lse, entropy = _compute_inputs(hidden, weight, bias, lse, entropy)
    # a frozen weight gets no buffer (a (V, 0) stand-in keeps the code below uniform; its kernel is never launched)
    grad_w = _new(w.shape if opts.need_grad_weight else (w.shape[0], 0), w, w.dtype)
    grad_b = _new(b.shape, b, b.dtype) if (b is not None and opts.need_grad_weight) else None
    gh = torch.zeros((n, d) if opts.need_grad_hidden else (0, d), device=h.device, dtype=torch.float32)
    if n == 0:
        grad_w.zero_()
        if grad_b is not None:
            grad_b.zero_()
    else:
        gl = grad_logp.float().contiguous()
        ge = grad_entropy.float().contiguous() if has_ge else gl
        ent = entropy.contiguous() if has_ge else lse
        idx, count = _compact_active_rows(targets, gl, ge if has_ge else None, opts.ignore_index)
        vc = _chunk_width(n, vocab, w.element_size(), opts.memory_budget, h)
        dz = _new((n, vc), h, w.dtype)
        b_arg = b if b is not None else w
        b_stride = b.stride(0) if b is not None else 0
        prec = _dot_precision(w.dtype, h)
        for v0 in range(0, vocab, vc):
            width = min(vc, vocab - v0)
            _launch(
                "dz", _linear_logprobs_bwd_dz_kernel,
                lambda meta, width=width: (triton.cdiv(n, meta["BLOCK_M"]), triton.cdiv(width, meta["BLOCK_V"])),
                h, _INTERP_TILE,
                h, w, b_arg, targets, lse, ent, gl, ge, idx, count, dz, d, v0, width,
                h.stride(0), h.stride(1), w.stride(0), w.stride(1), b_stride, dz.stride(0), 1.0 / opts.temperature,
                HAS_BIAS=b is not None, HAS_GE=has_ge, DOT_PRECISION=prec,
            )
            if opts.need_grad_hidden:
                _launch(
                    "dh", _linear_logprobs_bwd_dh_kernel,
                    lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), triton.cdiv(d, meta["BLOCK_D"])), h, _INTERP_GEMM_DH,
                    dz, w, idx, count, gh, d, v0, width, dz.stride(0), w.stride(0), w.stride(1), gh.stride(0),
                    DOT_PRECISION=prec,
                )
            if opts.need_grad_weight:
                _launch(
                    "dw", _linear_logprobs_bwd_dw_kernel,
                    lambda meta, width=width: (triton.cdiv(width, meta["BLOCK_V"]), triton.cdiv(d, meta["BLOCK_D"])), h,
                    _INTERP_GEMM_DW,
                    dz, h, idx, count, grad_w, grad_b if grad_b is not None else grad_w, d, v0, width,
                    dz.stride(0), h.stride(0), h.stride(1), grad_w.stride(0),
                    grad_b.stride(0) if grad_b is not None else 0,
                    HAS_BIAS=b is not None, DOT_PRECISION=prec,
                )
    grad_hidden = (gh if out_dtype == torch.float32 else gh.to(out_dtype)) if opts.need_grad_hidden else None
    if not opts.need_grad_weight:  # frozen weight (and bias): the dW GEMM was skipped
        return grad_hidden, None, None
    if grad_w.dtype != weight.dtype:
        grad_w = grad_w.to(weight.dtype)
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
    return grad_hidden, grad_w, grad_b


# ------------------------------------------------------------------------------------------ logprobs_from_logits


def logprobs_from_logits_fwd(logits, targets, opts: Options):
    """logits (N, V), targets (N,) -> (logp, entropy | (0,), lse | (0,)), fp32 (fp64 for fp64 logits)."""
    n, vocab = logits.shape
    logp = _f32_rows(n, logits)
    ent = _f32_rows(n, logits) if opts.return_entropy else _empty(logits)
    lse = _f32_rows(n, logits) if opts.need_lse else _empty(logits)
    if n == 0:
        return _as_output_dtype(logits.dtype, logp, ent, lse)
    (x,) = _compute_inputs(logits)
    _launch(
        "logits_fwd", _logprobs_from_logits_fwd_kernel, lambda meta: (triton.cdiv(n, meta["BLOCK_M"]),), x,
        _INTERP_LOGITS,
        x, targets, logp, ent if opts.return_entropy else logp, lse if opts.need_lse else logp, n, vocab,
        x.stride(0), x.stride(1), 1.0 / opts.temperature, opts.ignore_index,
        WITH_ENTROPY=opts.return_entropy, WITH_LSE=opts.need_lse,
    )
    return _as_output_dtype(logits.dtype, logp, ent, lse)


def logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, lse, entropy, opts: Options):
    """-> grad_logits (N, V) logits.dtype; written into `logits` itself when opts.inplace_backward."""
    n, vocab = logits.shape
    has_ge = grad_entropy is not None and entropy is not None and entropy.numel() > 0 and opts.return_entropy
    lse, entropy = _compute_inputs(lse, entropy)
    if logits.dtype == torch.float64:
        x = logits.float()  # computed in fp32 (module docstring); the gradient is copied back in fp64
        out = x
    else:
        x = logits
        out = logits if opts.inplace_backward else _new(logits.shape, logits, logits.dtype)
    if n > 0:
        gl = grad_logp.float().contiguous()
        ge = grad_entropy.float().contiguous() if has_ge else gl
        ent = entropy.contiguous() if has_ge else lse
        meta = _logits_bwd_config() if _on_gpu(x) else _INTERP_LOGITS
        _logprobs_from_logits_bwd_kernel[(triton.cdiv(n, meta["BLOCK_M"]),)](
            x, targets, lse, ent, gl, ge, out, n, vocab, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            1.0 / opts.temperature, opts.ignore_index, HAS_GE=has_ge, **meta,
        )
    if logits.dtype == torch.float64:
        if opts.inplace_backward:
            logits.copy_(out)
            return logits
        return out.double()
    return out
