"""The naive path: the specification of the ops and the baseline of every benchmark.

It materializes the full (N, V) logits, runs log_softmax, gathers the target and computes the entropy, all with plain
autograd. It works in whatever dtype it is given (float64 in tests). Imported by tests and benchmarks only, never by a
backend.
"""

from __future__ import annotations

import torch


def logprobs_from_logits(
    logits: torch.Tensor,  # (..., V)
    targets: torch.Tensor,  # (...)
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = True,
    out_dtype: torch.dtype | None = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp = log_softmax(z)[y], H = -sum p log p with z = logits / temperature; ignored rows give 0.

    Computed in the dtype of `logits` (the "same-dtype naive computation"); results cast to `out_dtype`
    (None keeps the computation dtype). torch.log_softmax works in the shifted form (z - max z) - log sum exp(z - max z)
    (values and gradient), so in float64 this is the accurate specification even at large |z| and with ties at the top.
    """
    z = logits / temperature
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
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = True,
    out_dtype: torch.dtype | None = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits = hidden @ weight.T + bias, then `logprobs_from_logits`. Materializes (..., V)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    return logprobs_from_logits(
        logits, targets, temperature=temperature, ignore_index=ignore_index, return_entropy=return_entropy,
        out_dtype=out_dtype,
    )
