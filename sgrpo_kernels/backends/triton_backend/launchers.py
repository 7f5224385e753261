"""The four backend entry points (the contract of sgrpo_kernels.backends.contract) and their host-side work: buffers,
fp64 -> fp32 inputs, output dtypes, the vocab split of the linear forward, the device-side row compaction and the vocab
chunking of the backward, then the kernel launches (through configs.launch).

Test hooks: every entry point takes a keyword-only `hooks` (:class:`Hooks`; the default changes nothing)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sgrpo_kernels.backends.contract import Options, stats_dtype

from .backward import (
    _compact_rows_kernel,
    _linear_logprobs_bwd_dh_kernel,
    _linear_logprobs_bwd_dw_kernel,
    _linear_logprobs_bwd_dz_kernel,
)
from .configs import (
    CHUNK_ALIGN,
    GPU_FWD_BLOCK_M,
    INTERP_GEMM_DH,
    INTERP_GEMM_DW,
    INTERP_LOGITS,
    INTERP_TILE,
    SPLIT_ALIGN,
    launch,
    logits_bwd_config,
    num_sms,
    on_gpu,
)
from .forward import _linear_logprobs_fwd_kernel, _linear_logprobs_merge_kernel
from .logits import _logprobs_from_logits_bwd_kernel, _logprobs_from_logits_fwd_kernel

__all__ = ["DEFAULT_MEMORY_BUDGET", "NO_HOOKS", "Hooks", "linear_logprobs_bwd", "linear_logprobs_fwd",
           "logprobs_from_logits_bwd", "logprobs_from_logits_fwd"]

# dZ chunk buffer (N x vc elements) of the linear backward; opts.memory_budget overrides.
DEFAULT_MEMORY_BUDGET = 64 * 2**20


@dataclass(frozen=True)
class Hooks:
    """Test hooks of the entry points, passed explicitly: ``linear_logprobs_fwd(..., opts, hooks=Hooks(poison=True))``.

    splits: force this many vocab splits in the linear forward (None: the heuristic), so a test can drive the merge
        kernel at any split count.
    poison: output and scratch buffers start as NaN instead of uninitialized memory, so an element a kernel failed to
        write fails the comparisons.
    """

    splits: int | None = None
    poison: bool = False


NO_HOOKS = Hooks()  # the default: production behaviour


def _dot_precision(dtype: torch.dtype, ref: torch.Tensor) -> str:
    if dtype == torch.bfloat16 and not on_gpu(ref):
        return "upcast"  # see tiles.mma
    return "ieee"  # fp32 inputs: no TF32 (the contract is fp32 accuracy); ignored for bf16/fp16


def _compute_inputs(*tensors):
    """fp64 -> fp32 copies (the kernels compute in fp32); other dtypes unchanged."""
    return tuple(t.float() if t is not None and t.dtype == torch.float64 else t for t in tensors)


def _new(shape, ref: torch.Tensor, hooks: Hooks, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An output buffer the kernels must fully write; NaN-filled under hooks.poison (tests), so a skipped row shows."""
    if hooks.poison:
        return torch.full(shape, float("nan"), device=ref.device, dtype=dtype)
    return torch.empty(shape, device=ref.device, dtype=dtype)


def _f32_rows(n: int, ref: torch.Tensor, hooks: Hooks) -> torch.Tensor:
    return _new((n,), ref, hooks)


def _empty(ref: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.empty(shape or (0,), device=ref.device, dtype=torch.float32)


def _stats_out(n: int, ref: torch.Tensor, hooks: Hooks, opts: Options) -> torch.Tensor:
    """The forward's (2, N) row statistics [m; log s] (contract: stats), or an empty (2, 0) when not requested."""
    return _new((2, n), ref, hooks) if opts.need_stats else _empty(ref, 2, 0)


def _as_output_dtype(in_dtype: torch.dtype, *stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The op's statistics dtype (fp64 for fp64 inputs; computed here in fp32, so fp32-accurate values)."""
    dtype = stats_dtype(in_dtype)
    return tuple(t.to(dtype) for t in stats)


def _num_splits(n: int, vocab: int, ref: torch.Tensor, forced: int | None) -> tuple[int, int]:
    """(number of vocab splits, vocab columns per split) for the linear forward; `forced` = Hooks.splits."""
    if forced is not None:
        want = max(1, forced)
        align = INTERP_TILE["BLOCK_V"] if not on_gpu(ref) else SPLIT_ALIGN
    elif on_gpu(ref):
        row_blocks = triton.cdiv(n, GPU_FWD_BLOCK_M)
        target = 2 * num_sms(ref.device.index if ref.device.index is not None else torch.cuda.current_device())
        want = max(1, target // max(row_blocks, 1)) if row_blocks < target else 1
        align = SPLIT_ALIGN
    else:  # interpreter: split small problems too, so the merge path is exercised by the shared suite
        row_blocks = triton.cdiv(n, INTERP_TILE["BLOCK_M"])
        want = 2 if row_blocks < 2 else 1
        align = INTERP_TILE["BLOCK_V"]
    per = triton.cdiv(triton.cdiv(vocab, want), align) * align
    splits = triton.cdiv(vocab, per)
    return splits, per


# ----------------------------------------------------------------------------------------------- linear_logprobs


def _threshold(threshold: torch.Tensor | None, fallback: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the (N,) fp32 threshold of the sampler's support, or `fallback` as an unread pointer; TRUNCATE)."""
    if threshold is None:
        return fallback, False
    return threshold.to(torch.float32).contiguous(), True


def linear_logprobs_fwd(hidden, weight, targets, bias, opts: Options, threshold=None, *, hooks: Hooks = NO_HOOKS):
    """hidden (N, D), weight (V, D), targets (N,), bias (V,) | None -> (logp, entropy | (0,), stats | (2, 0)), fp32
    (fp64 for fp64 inputs). threshold (N,): the sampler's support (contract), or None."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    in_dtype = hidden.dtype
    logp = _f32_rows(n, hidden, hooks)
    ent = _f32_rows(n, hidden, hooks) if opts.return_entropy else _empty(hidden)
    stats = _stats_out(n, hidden, hooks, opts)
    if n == 0:
        return _as_output_dtype(in_dtype, logp, ent, stats)
    hidden, weight, bias = _compute_inputs(hidden, weight, bias)
    splits, per = _num_splits(n, vocab, hidden, hooks.splits)
    if splits > 1:
        part = torch.empty((4 if opts.return_entropy else 3, splits, n), device=hidden.device, dtype=torch.float32)
        pm, ps, pzy = part[0], part[1], part[2]
        pu = part[3] if opts.return_entropy else pm
    else:
        pm = ps = pu = pzy = logp  # unused
    b_arg = bias if bias is not None else weight
    thr, truncate = _threshold(threshold, logp)
    launch(
        "fwd_truncate" if truncate else "fwd", _linear_logprobs_fwd_kernel,
        lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), splits), hidden,
        INTERP_TILE,
        hidden, weight, b_arg, targets, thr, logp, ent if opts.return_entropy else logp,
        stats if opts.need_stats else logp,
        pm, ps, pu, pzy, n, vocab, d, per,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        bias.stride(0) if bias is not None else 0,
        *_head_scales(opts), opts.ignore_index,
        HAS_BIAS=bias is not None, SOFTCAP=opts.softcap > 0, WITH_ENTROPY=opts.return_entropy,
        WITH_STATS=opts.need_stats, SPLIT=splits > 1, TRUNCATE=truncate,
        DOT_PRECISION=_dot_precision(hidden.dtype, hidden),
    )
    if splits > 1:
        block = 128
        _linear_logprobs_merge_kernel[(triton.cdiv(n, block),)](
            pm, ps, pu, pzy, targets, logp, ent if opts.return_entropy else logp, stats if opts.need_stats else logp,
            n, splits, opts.ignore_index, WITH_ENTROPY=opts.return_entropy, WITH_STATS=opts.need_stats, BLOCK=block,
        )
    return _as_output_dtype(in_dtype, logp, ent, stats)


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
    align = CHUNK_ALIGN if on_gpu(ref) else INTERP_TILE["BLOCK_V"]
    vc = budget // max(n * elem_bytes, 1) // align * align
    return min(max(vc, align), vocab)


def linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, opts: Options,
                        threshold=None, *, hooks: Hooks = NO_HOOKS):
    """-> grad_hidden (N, D) hidden.dtype, grad_weight (V, D) weight.dtype, grad_bias (V,) | None."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    out_dtype = hidden.dtype
    has_ge = grad_entropy is not None and entropy is not None and entropy.numel() > 0 and opts.return_entropy
    h, w, b, stats, entropy = _compute_inputs(hidden, weight, bias, stats, entropy)
    # a frozen weight gets no buffer (a (V, 0) stand-in keeps the code below uniform; its kernel is never launched)
    grad_w = _new(w.shape if opts.need_grad_weight else (w.shape[0], 0), w, hooks, w.dtype)
    grad_b = _new(b.shape, b, hooks, b.dtype) if (b is not None and opts.need_grad_weight) else None
    gh = torch.zeros((n, d) if opts.need_grad_hidden else (0, d), device=h.device, dtype=torch.float32)
    if n == 0:
        grad_w.zero_()
        if grad_b is not None:
            grad_b.zero_()
    else:
        gl = grad_logp.float().contiguous()
        ge = grad_entropy.float().contiguous() if has_ge else gl
        stats = stats.contiguous()
        ent = entropy.contiguous() if has_ge else gl
        idx, count = _compact_active_rows(targets, gl, ge if has_ge else None, opts.ignore_index)
        thr, truncate = _threshold(threshold, gl)
        vc = _chunk_width(n, vocab, w.element_size(), opts.memory_budget, h)
        dz = _new((n, vc), h, hooks, w.dtype)
        b_arg = b if b is not None else w
        b_stride = b.stride(0) if b is not None else 0
        prec = _dot_precision(w.dtype, h)
        for v0 in range(0, vocab, vc):
            width = min(vc, vocab - v0)
            launch(
                "dz_softcap" if opts.softcap > 0 else "dz", _linear_logprobs_bwd_dz_kernel,
                lambda meta, width=width: (triton.cdiv(n, meta["BLOCK_M"]), triton.cdiv(width, meta["BLOCK_V"])),
                h, INTERP_TILE,
                h, w, b_arg, targets, stats, ent, gl, ge, idx, count, dz, thr, d, v0, width,
                h.stride(0), h.stride(1), w.stride(0), w.stride(1), b_stride, dz.stride(0), stats.stride(0),
                *_head_scales(opts),
                HAS_BIAS=b is not None, SOFTCAP=opts.softcap > 0, HAS_GE=has_ge, TRUNCATE=truncate,
                DOT_PRECISION=prec,
            )
            if opts.need_grad_hidden:
                launch(
                    "dh", _linear_logprobs_bwd_dh_kernel,
                    lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), triton.cdiv(d, meta["BLOCK_D"])), h, INTERP_GEMM_DH,
                    dz, w, idx, count, gh, d, v0, width, dz.stride(0), w.stride(0), w.stride(1), gh.stride(0),
                    DOT_PRECISION=prec,
                )
            if opts.need_grad_weight:
                launch(
                    "dw", _linear_logprobs_bwd_dw_kernel,
                    lambda meta, width=width: (triton.cdiv(width, meta["BLOCK_V"]), triton.cdiv(d, meta["BLOCK_D"])), h,
                    INTERP_GEMM_DW,
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


def logprobs_from_logits_fwd(logits, targets, opts: Options, threshold=None, *, hooks: Hooks = NO_HOOKS):
    """logits (N, V), targets (N,) -> (logp, entropy | (0,), stats | (2, 0)), fp32 (fp64 for fp64 logits)."""
    n, vocab = logits.shape
    logp = _f32_rows(n, logits, hooks)
    ent = _f32_rows(n, logits, hooks) if opts.return_entropy else _empty(logits)
    stats = _stats_out(n, logits, hooks, opts)
    if n == 0:
        return _as_output_dtype(logits.dtype, logp, ent, stats)
    (x,) = _compute_inputs(logits)
    thr, truncate = _threshold(threshold, logp)
    launch(
        "logits_fwd", _logprobs_from_logits_fwd_kernel, lambda meta: (triton.cdiv(n, meta["BLOCK_M"]),), x,
        INTERP_LOGITS,
        x, targets, logp, ent if opts.return_entropy else logp, stats if opts.need_stats else logp, thr, n, vocab,
        x.stride(0), x.stride(1), 1.0 / opts.temperature, opts.temperature, opts.ignore_index,
        WITH_ENTROPY=opts.return_entropy, WITH_STATS=opts.need_stats, TRUNCATE=truncate,
    )
    return _as_output_dtype(logits.dtype, logp, ent, stats)


def logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, opts: Options,
                             threshold=None, *, hooks: Hooks = NO_HOOKS):
    """-> grad_logits (N, V) logits.dtype; written into `logits` itself when opts.inplace_backward."""
    n, vocab = logits.shape
    has_ge = grad_entropy is not None and entropy is not None and entropy.numel() > 0 and opts.return_entropy
    stats, entropy = _compute_inputs(stats, entropy)
    if logits.dtype == torch.float64:
        x = logits.float()  # computed in fp32 (package docstring); the gradient is copied back in fp64
        out = x
    else:
        x = logits
        out = logits if opts.inplace_backward else _new(logits.shape, logits, hooks, logits.dtype)
    if n > 0:
        gl = grad_logp.float().contiguous()
        ge = grad_entropy.float().contiguous() if has_ge else gl
        stats = stats.contiguous()
        ent = entropy.contiguous() if has_ge else gl
        meta = logits_bwd_config() if on_gpu(x) else INTERP_LOGITS
        thr, truncate = _threshold(threshold, gl)
        _logprobs_from_logits_bwd_kernel[(triton.cdiv(n, meta["BLOCK_M"]),)](
            x, targets, stats, ent, gl, ge, out, thr, n, vocab, x.stride(0), x.stride(1), out.stride(0),
            out.stride(1), stats.stride(0), 1.0 / opts.temperature, opts.temperature, opts.ignore_index,
            HAS_GE=has_ge,
            TRUNCATE=truncate, **meta,
        )
    if logits.dtype == torch.float64:
        if opts.inplace_backward:
            logits.copy_(out)
            return logits
        return out.double()
    return out


def _head_scales(opts: Options) -> tuple[float, float, float]:
    """(inv_temp, cap_in, cap_out) of the linear kernels: the logits tile is x * inv_temp, then with a softcap
    z = cap_out * tanh(cap_in * x) (x the raw h W^T + b: inv_temp = 1); the model's order, scale, cap, temperature."""
    if opts.softcap > 0:
        return 1.0, opts.logit_scale / opts.softcap, opts.softcap / opts.temperature
    return opts.logit_scale / opts.temperature, 1.0, 1.0
