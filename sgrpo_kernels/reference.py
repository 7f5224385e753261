"""The naive path: the specification of the ops and the baseline of every benchmark.

It materializes the full (N, V) logits, runs log_softmax, gathers the target and computes the entropy, all with plain
autograd. It works in whatever dtype it is given (float64 in tests). Imported by tests and benchmarks only, never by a
backend.
"""

from __future__ import annotations

import math

import torch


def _per_row(value, rows: int, dtype: torch.dtype, device: torch.device, off: float) -> torch.Tensor:
    if value is None:
        value = off
    if isinstance(value, torch.Tensor):
        return value.reshape(-1).to(device=device, dtype=dtype)
    return torch.full((rows,), value, dtype=dtype, device=device)


def sampler_support(z: torch.Tensor, targets: torch.Tensor, *, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """The tokens a vLLM sampler may draw at z = logits / temperature (R, V), as a bool mask, plus each row's target.

    vLLM's order (its sampler: temperature, then the min_p logits processor, then top-k, then top-p), by plain sorts:
      min_p: keep z_j >= max z + log(min_p)                 (vLLM: p_j >= min_p * p_max)
      top_k: of those, keep z_j >= their k-th largest value (ties at it kept, as vLLM)
      top_p: of those, renormalized, keep z_j >= the largest value v with mass(z >= v) >= top_p
             (vLLM keeps j iff the mass above j in its sort is < top_p: the same set, but a tie at the boundary is
             kept whole here, where vLLM keeps an order-dependent part of it)
    Each setting: None (off), a number, or an (R,) tensor.
    """
    rows, vocab = z.shape
    ninf = torch.tensor(-math.inf, dtype=z.dtype, device=z.device)
    keep = torch.ones_like(z, dtype=torch.bool)
    mp = _per_row(min_p, rows, z.dtype, z.device, 0.0)
    bound = z.amax(-1) + torch.log(mp.clamp(min=torch.finfo(z.dtype).tiny))
    keep &= z >= torch.where(mp > 0, bound, ninf).unsqueeze(-1)

    k = _per_row(top_k, rows, torch.int64, z.device, vocab).clamp(max=vocab)
    desc = torch.where(keep, z, ninf).sort(-1, descending=True).values
    kth = desc.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
    keep &= z >= torch.where(k < vocab, kth, ninf).unsqueeze(-1)

    p = _per_row(top_p, rows, z.dtype, z.device, 1.0)
    desc = torch.where(keep, z, ninf).sort(-1, descending=True).values
    cum = torch.softmax(desc, -1).cumsum(-1)
    n_ge = torch.searchsorted((-desc).contiguous(), (-desc).contiguous(), right=True)  # count of values >= desc_j
    mass_ge = cum.gather(-1, n_ge - 1)  # mass(z >= desc_j), a tie group counted whole
    first = (mass_ge >= p.unsqueeze(-1)).to(torch.int8).argmax(-1, keepdim=True)
    keep &= z >= torch.where(p < 1, desc.gather(-1, first).squeeze(-1), ninf).unsqueeze(-1)

    safe = targets.clamp(0, vocab - 1).long().unsqueeze(-1)
    return keep.scatter(-1, safe, True)


def logprobs_from_logits(
    logits: torch.Tensor,  # (..., V)
    targets: torch.Tensor,  # (...)
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = True,
    out_dtype: torch.dtype | None = torch.float32,
    top_k=None,
    top_p=None,
    min_p=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp = log_softmax(z)[y], H = -sum p log p with z = logits / temperature; ignored rows give 0.

    top_k / top_p / min_p: z outside `sampler_support` (found without gradient) is set to -inf first, so logp and H
    are those of the renormalized truncated distribution and the gradient holds the support fixed.

    Computed in the dtype of `logits` (the "same-dtype naive computation"); results cast to `out_dtype`
    (None keeps the computation dtype). torch.log_softmax works in the shifted form (z - max z) - log sum exp(z - max z)
    (values and gradient), so in float64 this is the accurate specification even at large |z| and with ties at the top.
    """
    z = logits / temperature
    if top_k is not None or top_p is not None or min_p is not None:
        with torch.no_grad():
            flat = z.reshape(-1, z.shape[-1])
            keep = sampler_support(flat, targets.reshape(-1), top_k=top_k, top_p=top_p, min_p=min_p).view(z.shape)
        z = z.masked_fill(~keep, -math.inf)
    logp_all = torch.log_softmax(z, dim=-1)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets)).long()
    logp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    entropy = None
    if return_entropy:
        p = logp_all.exp()
        # p log p -> 0 where p = 0 (-inf logits); the inner where keeps the backward free of 0 * inf
        safe_logp = torch.where(p > 0, logp_all, torch.zeros_like(logp_all))
        entropy = -(p * safe_logp).sum(-1)
        entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    if out_dtype is not None:
        logp = logp.to(out_dtype)
        entropy = entropy.to(out_dtype) if entropy is not None else None
    return logp, entropy


def linear_logprobs(
    hidden: torch.Tensor,  # (..., D)
    weight: torch.Tensor,  # (V, D)
    targets: torch.Tensor,  # (...)
    *,
    bias: torch.Tensor | None = None,  # (V,)
    **options,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits = hidden @ weight.T + bias, then `logprobs_from_logits` with the same keyword options (temperature,
    ignore_index, return_entropy, out_dtype, top_k / top_p / min_p). Materializes (..., V)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    return logprobs_from_logits(logits, targets, **options)
