"""The sampler's support inside the ops: `top_k`, `top_p`, `min_p` (vLLM's rules, in its order; docs/ops.md, "Sampler
support") turned into one per-row logit threshold, which the backends apply to their logits tiles.

Here: the :class:`Sampling` settings of one call (validated, per row), the custom ops `sgrpo::linear_support_threshold`
and `sgrpo::logits_support_threshold` (opaque to torch.compile: the search in `sgrpo_kernels.support` is data
dependent), the backward ops and autograd of the support forwards (`sgrpo::*_support_fwd`, in sgrpo_kernels.ops next
to the other forwards), and the refusals (a backend that does not apply a threshold; vocabulary-parallel calls). The
threshold is found on detached inputs: the support is piecewise constant, so it carries no gradient and the backward
holds it fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sgrpo_kernels.backends import get, stats_dtype
from sgrpo_kernels.custom_ops import N_CALL, Call, _check_saved, _upstream, custom_op
from sgrpo_kernels.support import find_thresholds
from sgrpo_kernels.validation import check_min_p, check_sampler_values, check_top_k, check_top_p

__all__ = ["SAMPLER_OPTIONS", "Sampling", "linear_support_backward", "linear_support_setup_context", "linear_threshold",
           "logits_support_backward", "logits_support_setup_context", "logits_threshold"]

SAMPLER_OPTIONS = ("top_k", "top_p", "min_p")
# a backend that applies a threshold sets this module attribute to True (contract: `threshold=` keyword)
CAPABILITY = "APPLIES_THRESHOLD"


@dataclass(frozen=True)
class Sampling:
    """One call's sampler settings, validated: each None (off), a Python number, or a flat (N,) tensor."""

    top_k: Tensor | int | None = None
    top_p: Tensor | float | None = None
    min_p: Tensor | float | None = None

    @classmethod
    def from_args(cls, top_k: object, top_p: object, min_p: object, lead: torch.Size, device: torch.device,
                  vocab: int | None = None) -> Sampling | None:
        """Validated settings, or None when none of them can cut a token (the ops then run exactly as without).
        `vocab`: the vocabulary size when the call sees all of it (not vocab-sharded): a Python int top_k >= vocab
        keeps every token, as top_p = 1.0 does (it was refused where top_p = 1.0 ran)."""
        out = cls(check_top_k(top_k, lead, device), check_top_p(top_p, lead, device), check_min_p(min_p, lead, device))
        return None if out.keeps_all(math.inf if vocab is None else vocab) else out

    def keeps_all(self, vocab: float) -> bool:
        """Whether these settings cut no token of a `vocab`-token vocabulary: each off or a Python number that keeps
        all (top_p = 1.0, min_p = 0.0, top_k >= vocab); a tensor counts as cutting."""

        def off(value: object, keeps_all) -> bool:
            return value is None or (not isinstance(value, Tensor) and keeps_all(value))

        return (off(self.top_k, lambda k: k >= vocab) and off(self.top_p, lambda p: p == 1.0)
                and off(self.min_p, lambda p: p == 0.0))

    def named(self) -> str:
        return ", ".join(f"{n}={getattr(self, n)!r}" if not isinstance(getattr(self, n), Tensor) else f"{n}=<tensor>"
                         for n in SAMPLER_OPTIONS if getattr(self, n) is not None)

    def refuse_if_unsupported(self, op: str, backend: str, sharded: bool, vocab: int | None = None) -> None:
        """Refuse settings the call cannot apply; a sharded call passes its global `vocab` (known after shard_range):
        a top_k >= vocab cuts nothing and passes."""
        if sharded and not (vocab is not None and self.keeps_all(vocab)):
            raise ValueError(f"{op}: {self.named()} (sampler support) is not supported with process_group "
                             "(vocab-sharded) yet")
        if not applies_threshold(backend):
            raise ValueError(f"{op}: the {backend!r} backend does not apply {self.named()} (sampler support) yet; use "
                             "backend='torch' or 'triton', or leave top_k, top_p and min_p unset")

    def rows(self, n: int, vocab: int, ref: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(top_k int64, top_p, min_p), each (n,) on ref's device; the no-op values where off (k = V, p = 1, 0)."""
        kw = dict(device=ref.device)

        def full(v, default, dtype):
            if isinstance(v, Tensor):  # a constant of the loss: the support carries no gradient (one that required
                return v.detach().to(dtype)  # grad failed in backward: no autograd formula for the threshold op)
            return torch.full((n,), default if v is None else v, dtype=dtype, **kw)

        # a Python int k >= V keeps all (as V does): clamped, so that k beyond int64 (2**70) is not an OverflowError
        k = full(min(self.top_k, vocab) if isinstance(self.top_k, int) else self.top_k, vocab, torch.int64)
        return k, full(self.top_p, 1.0, torch.float64), full(self.min_p, 0.0, torch.float64)


@torch.compiler.assume_constant_result
def applies_threshold(backend: str) -> bool:
    """Whether the backend applies the sampler's threshold (a constant of the backend: not traced by torch.compile)."""
    return bool(getattr(get(backend), CAPABILITY, False))


# ------------------------------------------------------------------------------------------------ the custom ops


class _Buffer:
    """One reused tile buffer per search (the passes consume each tile before asking for the next), so large tiles do
    not pay fresh page faults every time; grown when a larger tile is asked for."""

    def __init__(self, ref: Tensor, dtype: torch.dtype):
        self.ref, self.dtype, self.flat = ref, dtype, ref.new_empty((0,), dtype=dtype)

    def view(self, r: int, c: int) -> Tensor:
        if self.flat.numel() < r * c:
            self.flat = self.ref.new_empty((r * c,), dtype=self.dtype)
        return self.flat[: r * c].view(r, c)


_KPM = "Tensor top_k, Tensor top_p, Tensor min_p"


def _search(call: tuple, ref: Tensor, vocab: int, fill, targets: Tensor, k: Tensor, p: Tensor, mp: Tensor) -> Tensor:
    """The threshold ops' common part: the per-row values checked (here, where torch.compile does not trace the host
    sync), the no-op values put on ignored rows, then the search (sgrpo_kernels.support) over tiles z = fill(buffer,
    rows, v0, v1, compute dtype, opts) / temperature, in one reused buffer."""
    opts = Call.unpack(call).opts
    cdt = stats_dtype(ref.dtype)
    buf = _Buffer(ref, cdt)

    def tile(rows: Tensor, v0: int, v1: int) -> Tensor:
        x = fill(buf.view(rows.numel(), v1 - v0), rows, v0, v1, cdt, opts)
        return x.div_(opts.temperature) if opts.temperature != 1.0 else x

    check_sampler_values(k, p, mp)
    ign = targets == opts.ignore_index
    k, p, mp = k.masked_fill(ign, vocab), p.masked_fill(ign, 1.0), mp.masked_fill(ign, 0.0)
    return find_thresholds(tile, targets.shape[0], vocab, k, p, mp, dtype=cdt, device=targets.device,
                           memory_budget=opts.memory_budget)


@custom_op("linear_support_threshold", f"Tensor hidden, Tensor weight, Tensor targets, Tensor? bias, {_KPM}", "Tensor")
def linear_support_threshold(hidden, weight, targets, bias, top_k, top_p, min_p, *call: object) -> Tensor:
    """(N, D), (V, D), (N,), (V,) | None, per-row settings (N,) -> the threshold (N,) of z = head(h W^T + b) / T, in
    the statistics dtype (-inf: keep all)."""

    def head(x: Tensor, rows: Tensor, v0: int, v1: int, cdt: torch.dtype, opts) -> Tensor:
        h = hidden.index_select(0, rows).to(cdt)
        if bias is not None:
            torch.addmm(bias[v0:v1].to(cdt), h, weight[v0:v1].to(cdt).T, out=x)
        else:
            torch.mm(h, weight[v0:v1].to(cdt).T, out=x)
        return x.mul_(opts.logit_scale / opts.softcap).tanh_().mul_(opts.softcap) if opts.softcap else x

    return _search(call, hidden, weight.shape[0], head, targets, top_k, top_p, min_p)


@linear_support_threshold.register_fake
def _(hidden, weight, targets, bias, top_k, top_p, min_p, *call):
    return hidden.new_empty((hidden.shape[0],), dtype=stats_dtype(hidden.dtype))


@custom_op("logits_support_threshold", f"Tensor logits, Tensor targets, {_KPM}", "Tensor")
def logits_support_threshold(logits, targets, top_k, top_p, min_p, *call: object) -> Tensor:
    """(N, V), (N,), per-row settings (N,) -> the threshold (N,) of z = logits / T in the statistics dtype."""

    def copy(x: Tensor, rows: Tensor, v0: int, v1: int, cdt: torch.dtype, opts) -> Tensor:
        return x.copy_(logits[:, v0:v1].index_select(0, rows))

    return _search(call, logits, logits.shape[1], copy, targets, top_k, top_p, min_p)


@logits_support_threshold.register_fake
def _(logits, targets, top_k, top_p, min_p, *call):
    return logits.new_empty((logits.shape[0],), dtype=stats_dtype(logits.dtype))


def linear_threshold(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, sampling: Sampling,
                     call: Call) -> Tensor:
    k, p, mp = sampling.rows(hidden.shape[0], weight.shape[0], hidden)
    return linear_support_threshold(hidden.detach(), weight.detach(), targets, None if bias is None else bias.detach(),
                                    k, p, mp, *call.pack())


def logits_threshold(logits: Tensor, targets: Tensor, sampling: Sampling, call: Call) -> Tensor:
    k, p, mp = sampling.rows(logits.shape[0], logits.shape[1], logits)
    return logits_support_threshold(logits.detach(), targets, k, p, mp, *call.pack())



# ------------------------------------------------------------------------- the backwards of the support forwards
# (the forwards, `sgrpo::linear_logprobs_support_fwd` and `sgrpo::logprobs_from_logits_support_fwd`, are defined in
# sgrpo_kernels.ops next to the other forwards; these mirror sgrpo_kernels.custom_ops with the threshold added)

_LIN_BWD = ("Tensor grad_logp, Tensor? grad_entropy, Tensor hidden, Tensor weight, Tensor targets, Tensor? bias, "
            "Tensor stats, Tensor? entropy, Tensor threshold")
_LOG_BWD = ("Tensor grad_logp, Tensor? grad_entropy, Tensor{} logits, Tensor targets, Tensor stats, Tensor? entropy, "
            "Tensor threshold")


@custom_op("linear_logprobs_support_bwd", _LIN_BWD, "(Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")
def linear_logprobs_support_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, threshold,
                                *call: object):
    """As sgrpo::linear_logprobs_bwd, over the support held fixed at `threshold`."""
    call = Call.unpack(call)
    opts = call.opts
    grads = get(call.backend).linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats,
                                                  entropy, opts, threshold=threshold)
    wanted = (opts.need_grad_hidden, opts.need_grad_weight, opts.need_grad_weight and bias is not None)
    return tuple(g if (w and g is not None) else hidden.new_empty((0,)) for g, w in zip(grads, wanted))


@linear_logprobs_support_bwd.register_fake
def _(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, threshold, *call):
    opts = Call.unpack(call).opts

    def like(t, wanted):
        return torch.empty_like(t) if (wanted and t is not None) else hidden.new_empty((0,))

    return like(hidden, opts.need_grad_hidden), like(weight, opts.need_grad_weight), like(bias, opts.need_grad_weight)


def linear_support_setup_context(ctx, inputs, output):
    hidden, weight, targets, bias, threshold, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(hidden, weight, targets, bias, stats, entropy, threshold)
    ctx.call = Call.unpack(tuple(call))
    ctx.has_bias = bias is not None


def linear_support_backward(ctx, grad_logp, grad_entropy, _grad_stats):
    hidden, weight, targets, bias, stats, entropy, threshold = ctx.saved_tensors
    _check_saved(stats, hidden.shape[0], "linear_logprobs")
    need_h, need_w, _, need_b = ctx.needs_input_grad[:4]
    need_b = ctx.has_bias and need_b
    call = ctx.call.for_backward(need_grad_hidden=need_h, need_grad_weight=need_w or need_b)
    g_logp, g_ent, ent = _upstream(grad_logp, grad_entropy, stats, entropy, call)
    gh, gw, gb = linear_logprobs_support_bwd(g_logp, g_ent, hidden, weight, targets, bias, stats, ent, threshold,
                                             *call.pack())
    return (gh if need_h else None, gw if need_w else None, None, gb if need_b else None, None) + (None,) * N_CALL


@custom_op("logprobs_from_logits_support_bwd", _LOG_BWD.format(""), "Tensor")
def logprobs_from_logits_support_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, threshold,
                                     *call: object):
    """-> grad_logits (N, V) in a new buffer, over the support held fixed at `threshold`."""
    call = Call.unpack(call)
    return get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy,
                                                      call.opts, threshold=threshold)


@logprobs_from_logits_support_bwd.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, threshold, *call):
    return torch.empty_like(logits)


@custom_op("logprobs_from_logits_support_bwd_", _LOG_BWD.format("(a!)"), "()", mutates=("logits",))
def logprobs_from_logits_support_bwd_(grad_logp, grad_entropy, logits, targets, stats, entropy, threshold,
                                      *call: object) -> None:
    """In-place variant (inplace_backward): grad_logits written over `logits`."""
    call = Call.unpack(call)
    get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, call.opts,
                                               threshold=threshold)


@logprobs_from_logits_support_bwd_.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, threshold, *call):
    return None


def logits_support_setup_context(ctx, inputs, output):
    logits, targets, threshold, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(logits, targets, stats, entropy, threshold)
    ctx.call = Call.unpack(tuple(call))


def logits_support_backward(ctx, grad_logp, grad_entropy, _grad_stats):
    logits, targets, stats, entropy, threshold = ctx.saved_tensors
    _check_saved(stats, logits.shape[0], "logprobs_from_logits")
    call = ctx.call.for_backward()
    g_logp, g_ent, ent = _upstream(grad_logp, grad_entropy, stats, entropy, call)
    args = (g_logp, g_ent, logits, targets, stats, ent, threshold, *call.pack())
    if call.opts.inplace_backward:
        logprobs_from_logits_support_bwd_(*args)
        grad = logits
    else:
        grad = logprobs_from_logits_support_bwd(*args)
    return (grad, None, None) + (None,) * N_CALL
