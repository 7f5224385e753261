"""The two ops of the contract, defined once with torch.library: schema, fake implementation, autograd.

Layers (one name stem per op): backend entry points (`sgrpo_kernels.backends.*`) -> custom ops
`sgrpo::linear_logprobs_fwd/_bwd`, `sgrpo::logprobs_from_logits_fwd/_bwd` (which dispatch to the backend named in
their `backend` argument) -> autograd registration -> the public functions `linear_logprobs`,
`logprobs_from_logits` (validation, backend resolution, flattening of leading dims).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from sgrpo_kernels import backends
from sgrpo_kernels._validation import (
    check_flag,
    check_linear_inputs,
    check_logits_inputs,
    check_memory_budget,
    check_target_values,
)
from sgrpo_kernels.backends import Options, env_flag, stats_dtype

ENV_MEMORY_BUDGET_MB = "SGRPO_MEMORY_BUDGET_MB"
ENV_DETERMINISTIC = "SGRPO_DETERMINISTIC"
ENV_CHECK_TARGETS = "SGRPO_CHECK_TARGETS"


def _options(temperature, ignore_index, return_entropy, need_lse, memory_budget, deterministic, inplace=False,
             need_grad_hidden=True, need_grad_weight=True):
    return Options(
        temperature=temperature, ignore_index=ignore_index, return_entropy=return_entropy, need_lse=need_lse,
        memory_budget=memory_budget, deterministic=deterministic, inplace_backward=inplace,
        need_grad_hidden=need_grad_hidden, need_grad_weight=need_grad_weight,
    )


def _check_values() -> bool:
    return os.environ.get(ENV_CHECK_TARGETS, "1") != "0"


def _row_stats_fake(ref: Tensor, n: int, return_entropy: bool, need_lse: bool) -> tuple[Tensor, Tensor, Tensor]:
    kw = dict(dtype=stats_dtype(ref.dtype), device=ref.device)
    return (
        ref.new_empty((n,), **kw),
        ref.new_empty((n if return_entropy else 0,), **kw),
        ref.new_empty((n if need_lse else 0,), **kw),
    )


# -------------------------------------------------------------------------------------------------- linear_logprobs


@torch.library.custom_op("sgrpo::linear_logprobs_fwd", mutates_args=())
def linear_logprobs_fwd(
    hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, temperature: float, ignore_index: int,
    return_entropy: bool, need_lse: bool, backend: str, memory_budget: int, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(N, D), (V, D), (N,) -> logp (N,), entropy (N,) or (0,), lse (N,) or (0,); fp32 (fp64 for fp64 inputs)."""
    if _check_values():
        check_target_values(targets, weight.shape[0], ignore_index)
    opts = _options(temperature, ignore_index, return_entropy, need_lse, memory_budget, deterministic)
    return backends.get(backend).linear_logprobs_fwd(hidden, weight, targets, bias, opts)


@linear_logprobs_fwd.register_fake
def _(hidden, weight, targets, bias, temperature, ignore_index, return_entropy, need_lse, backend, memory_budget,
      deterministic):
    return _row_stats_fake(hidden, hidden.shape[0], return_entropy, need_lse)


@torch.library.custom_op("sgrpo::linear_logprobs_bwd", mutates_args=())
def linear_logprobs_bwd(
    grad_logp: Tensor, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor, targets: Tensor,
    bias: Tensor | None, lse: Tensor, entropy: Tensor | None, temperature: float, ignore_index: int,
    return_entropy: bool, backend: str, memory_budget: int, deterministic: bool, need_grad_hidden: bool,
    need_grad_weight: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """-> grad_hidden (N, D), grad_weight (V, D), grad_bias (V,); a gradient that is not needed (no bias, or
    need_grad_* False) comes back as an empty (0,) tensor."""
    opts = _options(temperature, ignore_index, return_entropy, True, memory_budget, deterministic,
                    need_grad_hidden=need_grad_hidden, need_grad_weight=need_grad_weight)
    grads = backends.get(backend).linear_logprobs_bwd(
        grad_logp, grad_entropy, hidden, weight, targets, bias, lse, entropy, opts
    )
    wanted = (need_grad_hidden, need_grad_weight, need_grad_weight and bias is not None)
    return tuple(g if (w and g is not None) else hidden.new_empty((0,)) for g, w in zip(grads, wanted))


@linear_logprobs_bwd.register_fake
def _(grad_logp, grad_entropy, hidden, weight, targets, bias, lse, entropy, temperature, ignore_index,
      return_entropy, backend, memory_budget, deterministic, need_grad_hidden, need_grad_weight):
    def like(t, wanted):
        return torch.empty_like(t) if (wanted and t is not None) else hidden.new_empty((0,))

    return like(hidden, need_grad_hidden), like(weight, need_grad_weight), like(bias, need_grad_weight)


def _linear_setup_context(ctx, inputs, output):
    (hidden, weight, targets, bias, temperature, ignore_index, return_entropy, _need_lse, backend, memory_budget,
     deterministic) = inputs
    _, entropy, lse = output
    ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy)
    ctx.args = (temperature, ignore_index, return_entropy, backend, memory_budget, deterministic)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad_logp, grad_entropy, _grad_lse):
    hidden, weight, targets, bias, lse, entropy = ctx.saved_tensors
    temperature, ignore_index, return_entropy, backend, memory_budget, deterministic = ctx.args
    if lse.numel() != hidden.shape[0]:
        raise RuntimeError("linear_logprobs: backward called on a forward that saved no statistics (need_lse=False)")
    g_ent = grad_entropy if (return_entropy and grad_entropy is not None) else None
    need_h = ctx.needs_input_grad[0]
    need_w = ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[3])
    gh, gw, gb = linear_logprobs_bwd(
        grad_logp.to(lse.dtype), g_ent.to(lse.dtype) if g_ent is not None else None, hidden, weight, targets, bias, lse,
        entropy if return_entropy else None, temperature, ignore_index, return_entropy, backend, memory_budget,
        deterministic, need_h, need_w,
    )
    return (gh if need_h else None, gw if ctx.needs_input_grad[1] else None, None,
            gb if (ctx.has_bias and ctx.needs_input_grad[3]) else None, None, None, None, None, None, None, None)


torch.library.register_autograd(
    "sgrpo::linear_logprobs_fwd", _linear_backward, setup_context=_linear_setup_context
)


# --------------------------------------------------------------------------------------------- logprobs_from_logits


@torch.library.custom_op("sgrpo::logprobs_from_logits_fwd", mutates_args=())
def logprobs_from_logits_fwd(
    logits: Tensor, targets: Tensor, temperature: float, ignore_index: int, return_entropy: bool, need_lse: bool,
    backend: str, memory_budget: int, inplace_backward: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(N, V), (N,) -> logp (N,), entropy (N,) or (0,), lse (N,) or (0,); fp32 (fp64 for fp64 inputs)."""
    if _check_values():
        check_target_values(targets, logits.shape[1], ignore_index)
    opts = _options(temperature, ignore_index, return_entropy, need_lse, memory_budget, False)
    return backends.get(backend).logprobs_from_logits_fwd(logits, targets, opts)


@logprobs_from_logits_fwd.register_fake
def _(logits, targets, temperature, ignore_index, return_entropy, need_lse, backend, memory_budget,
      inplace_backward):
    return _row_stats_fake(logits, logits.shape[0], return_entropy, need_lse)


@torch.library.custom_op("sgrpo::logprobs_from_logits_bwd", mutates_args=())
def logprobs_from_logits_bwd(
    grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, targets: Tensor, lse: Tensor,
    entropy: Tensor | None, temperature: float, ignore_index: int, return_entropy: bool, backend: str,
    memory_budget: int,
) -> Tensor:
    """-> grad_logits (N, V) in a new buffer."""
    opts = _options(temperature, ignore_index, return_entropy, True, memory_budget, False)
    return backends.get(backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, lse, entropy, opts)


@logprobs_from_logits_bwd.register_fake
def _(grad_logp, grad_entropy, logits, targets, lse, entropy, temperature, ignore_index, return_entropy, backend,
      memory_budget):
    return torch.empty_like(logits)


@torch.library.custom_op("sgrpo::logprobs_from_logits_bwd_", mutates_args=("logits",))
def logprobs_from_logits_bwd_(
    grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, targets: Tensor, lse: Tensor,
    entropy: Tensor | None, temperature: float, ignore_index: int, return_entropy: bool, backend: str,
    memory_budget: int,
) -> None:
    """In-place variant: overwrites `logits` with grad_logits (chunk by chunk, no second (N, V) buffer)."""
    opts = _options(temperature, ignore_index, return_entropy, True, memory_budget, False, inplace=True)
    backends.get(backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, lse, entropy, opts)


@logprobs_from_logits_bwd_.register_fake
def _(grad_logp, grad_entropy, logits, targets, lse, entropy, temperature, ignore_index, return_entropy, backend,
      memory_budget):
    return None


def _logits_setup_context(ctx, inputs, output):
    logits, targets, temperature, ignore_index, return_entropy, _need_lse, backend, memory_budget, inplace = inputs
    _, entropy, lse = output
    ctx.save_for_backward(logits, targets, lse, entropy)
    ctx.args = (temperature, ignore_index, return_entropy, backend, memory_budget, inplace)


def _logits_backward(ctx, grad_logp, grad_entropy, _grad_lse):
    logits, targets, lse, entropy = ctx.saved_tensors
    temperature, ignore_index, return_entropy, backend, memory_budget, inplace = ctx.args
    if lse.numel() != logits.shape[0]:
        raise RuntimeError("logprobs_from_logits: backward called on a forward that saved no statistics")
    g_ent = grad_entropy.to(lse.dtype) if (return_entropy and grad_entropy is not None) else None
    args = (grad_logp.to(lse.dtype), g_ent, logits, targets, lse, entropy if return_entropy else None, temperature,
            ignore_index, return_entropy, backend, memory_budget)
    if inplace:
        logprobs_from_logits_bwd_(*args)
        grad = logits
    else:
        grad = logprobs_from_logits_bwd(*args)
    return grad, None, None, None, None, None, None, None, None


torch.library.register_autograd(
    "sgrpo::logprobs_from_logits_fwd", _logits_backward, setup_context=_logits_setup_context
)


# ---------------------------------------------------------------------------------------------------- public API


def _budget(memory_budget: int | None) -> int:
    if memory_budget is not None:
        return check_memory_budget(memory_budget)
    env = os.environ.get(ENV_MEMORY_BUDGET_MB, "").strip()
    if env:
        try:
            mib = float(env)
        except ValueError:
            mib = math.nan
        if not math.isfinite(mib) or mib < 0 or mib * 2**20 >= 2**63:
            raise ValueError(f"env {ENV_MEMORY_BUDGET_MB}={env!r}: expected a finite number of MiB >= 0 "
                             "(0 = the backend's default)")
        return int(mib * 2**20)
    return 0


def _deterministic(flag: bool | None) -> bool:
    if flag is not None:
        return check_flag("deterministic", flag)
    return env_flag(ENV_DETERMINISTIC, False)


def linear_logprobs(
    hidden: Tensor,  # (..., D)
    weight: Tensor,  # (V, D)
    targets: Tensor,  # (...) integer
    *,
    bias: Tensor | None = None,  # (V,)
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = True,
    backend: str | None = None,
    memory_budget: int | None = None,
    deterministic: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of `targets` and entropy of softmax((hidden @ weight.T + bias) / temperature), fused.

    The (..., V) logits are never materialized. With z = (h . W_j + b_j) / temperature for one row:
        logp = z_y - logsumexp(z),   entropy = -sum_j p_j log p_j,   p = softmax(z).

    Returns `(logp, entropy)`, both float32 (float64 for float64 inputs) with the leading shape `hidden.shape[:-1]`;
    with `return_entropy=False` the entropy is not computed and `(logp, None)` is returned. Rows whose target equals
    `ignore_index` give 0 for both and receive no gradient. Differentiable w.r.t. hidden, weight and bias through
    both outputs. Under `torch.no_grad()` (or when no input requires grad) nothing is saved for backward.

    Args:
        backend: "torch", "triton", "npu" or None/"auto" (env SGRPO_BACKEND, else chosen by device).
        memory_budget: bytes for a backend's temporaries (env SGRPO_MEMORY_BUDGET_MB); default per backend: torch
            128 MiB of tiles, triton 64 MiB (backward dZ chunk), npu 256 MiB (logits chunk).
        deterministic: bitwise reproducible gradients (env SGRPO_DETERMINISTIC); the torch backend always is.
    """
    temperature, ignore_index = check_linear_inputs(hidden, weight, targets, bias, temperature, ignore_index)
    name = backends.resolve(backend, hidden.device)
    lead = targets.shape
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    logp, entropy, _ = linear_logprobs_fwd(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1).long(), bias, temperature, ignore_index,
        check_flag("return_entropy", return_entropy), needs_grad, name, _budget(memory_budget),
        _deterministic(deterministic),
    )
    return logp.view(lead), (entropy.view(lead) if return_entropy else None)


def logprobs_from_logits(
    logits: Tensor,  # (..., V)
    targets: Tensor,  # (...) integer
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = True,
    backend: str | None = None,
    memory_budget: int | None = None,
    inplace_backward: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of `targets` and entropy of softmax(logits / temperature), for callers that hold logits.

    One streaming pass over V per row (online statistics); the backward writes grad_logits vocab chunk by vocab chunk.
    Returns `(logp, entropy)` float32 (float64 for float64 logits) with the leading shape `logits.shape[:-1]`
    (`(logp, None)` with `return_entropy=False`). Ignored rows give 0 and no gradient.

    Args:
        inplace_backward: write grad_logits into the `logits` buffer itself instead of a new (N, V) tensor. Only safe
            when nothing else needs `logits` after this op's backward (autograd raises if something saved it).
        backend, memory_budget: as in `linear_logprobs`.
    """
    temperature, ignore_index = check_logits_inputs(logits, targets, temperature, ignore_index)
    check_flag("return_entropy", return_entropy)
    check_flag("inplace_backward", inplace_backward)
    if inplace_backward and logits.is_leaf and logits.requires_grad:
        raise ValueError(
            "inplace_backward=True would overwrite logits, a leaf tensor that requires grad, with its own gradient; "
            "pass a non-leaf buffer (e.g. the output of the LM-head matmul) or use inplace_backward=False"
        )
    name = backends.resolve(backend, logits.device)
    lead = targets.shape
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    flat = logits.reshape(-1, logits.shape[-1])
    logp, entropy, _ = logprobs_from_logits_fwd(
        flat, targets.reshape(-1).long(), temperature, ignore_index, bool(return_entropy), needs_grad, name,
        _budget(memory_budget), bool(inplace_backward),
    )
    return logp.view(lead), (entropy.view(lead) if return_entropy else None)
