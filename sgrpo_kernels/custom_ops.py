"""The torch.library side of the two ops: the arguments every sgrpo:: custom op takes, and the backward.

Every custom op (`sgrpo::linear_logprobs_fwd/_bwd`, `sgrpo::logprobs_from_logits_fwd/_bwd/_bwd_`) takes its tensors,
then the fields of one :class:`Call`: the backend, the target check, and every field of the backend
:class:`~sgrpo_kernels.backends.Options` (the caller's :class:`~sgrpo_kernels.backends.HeadOptions` first, then the
per-call fields). The schemas (:func:`custom_op`), the fakes, `setup_context` and the backwards pack and unpack that
one structure by iterating over its fields, so a new option is one new field, never an edit here.

Here: `Call`, the schema builder, the backward custom ops and the autograd formulas. The forward custom ops, which
check the targets and which the public functions call, and their autograd registration: `sgrpo_kernels.ops`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from sgrpo_kernels.backends import Options, get, stats_dtype

__all__ = [
    "N_CALL",
    "STATS",
    "Call",
    "custom_op",
    "linear_backward",
    "linear_setup_context",
    "logits_backward",
    "logits_setup_context",
    "row_stats_fake",
]


# ---------------------------------------------------------------------------------------- the op arguments, once


@dataclasses.dataclass(frozen=True)
class Call:
    """The non-tensor arguments of every sgrpo:: custom op.

    backend: the resolved backend name; check_targets: verify that targets lie in [0, V) (one host sync, forward
    only); opts: what the backend receives.
    """

    backend: str
    check_targets: bool
    opts: Options

    def pack(self) -> tuple:
        return (self.backend, self.check_targets, *(getattr(self.opts, f.name) for f in _OPTION_FIELDS))

    @classmethod
    def unpack(cls, args: tuple) -> Call:
        backend, check, *values = args
        return cls(backend, check, Options(*values))

    def for_backward(self, **grads_needed: bool) -> Call:
        return dataclasses.replace(self, opts=dataclasses.replace(self.opts, need_stats=True, **grads_needed))


_OPTION_FIELDS = dataclasses.fields(Options)
N_CALL = 2 + len(_OPTION_FIELDS)  # the Call fields in a schema: backward returns None for each
_CALL_SCHEMA = "str backend, bool check_targets, " + ", ".join(f"{f.type} {f.name}" for f in _OPTION_FIELDS)
# stats (2, N) = [row max m; log s] of z = logits / temperature (backends/contract.py), kept for the backward;
# entropy is empty (0,) and stats empty (2, 0) when not requested
STATS = "(Tensor logp, Tensor entropy, Tensor stats)"


def custom_op(name: str, tensors: str, returns: str, mutates: tuple[str, ...] = ()):
    """Decorator: a custom op `sgrpo::name(tensors..., <Call fields>) -> returns`, the Call fields' part of the schema
    generated from their dataclass fields."""
    schema = f"({tensors}, {_CALL_SCHEMA}) -> {returns}"
    return lambda fn: torch.library.custom_op(f"sgrpo::{name}", fn, mutates_args=mutates, schema=schema)


def row_stats_fake(ref: Tensor, call: Call) -> tuple[Tensor, Tensor, Tensor]:
    """The fake of a forward op: logp, entropy and stats of the shapes the Call asks for."""
    n, kw = ref.shape[0], dict(dtype=stats_dtype(ref.dtype), device=ref.device)
    return (
        ref.new_empty((n,), **kw),
        ref.new_empty((n if call.opts.return_entropy else 0,), **kw),
        ref.new_empty((2, n if call.opts.need_stats else 0), **kw),
    )


def _upstream(grad_logp: Tensor, grad_entropy: Tensor | None, stats: Tensor, entropy: Tensor, call: Call):
    """The two upstream gradients in the statistics dtype, and the saved entropy; None where the entropy was not
    requested or received no gradient."""
    ent = call.opts.return_entropy
    g_ent = grad_entropy.to(stats.dtype) if (ent and grad_entropy is not None) else None
    return grad_logp.to(stats.dtype), g_ent, (entropy if ent else None)


def _check_saved(stats: Tensor, n: int, op: str) -> None:
    if stats.shape != (2, n):
        raise RuntimeError(f"{op}: backward called on a forward that saved no statistics (need_stats=False)")


# -------------------------------------------------------------------------------------------------- linear_logprobs


@custom_op(
    "linear_logprobs_bwd",
    "Tensor grad_logp, Tensor? grad_entropy, Tensor hidden, Tensor weight, Tensor targets, Tensor? bias, Tensor stats, "
    "Tensor? entropy",
    "(Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)",
)
def linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, *call: object):
    """-> grad_hidden (N, D), grad_weight (V, D), grad_bias (V,); a gradient that is not needed (no bias, or
    need_grad_* False) comes back as an empty (0,) tensor."""
    call = Call.unpack(call)
    opts = call.opts
    grads = get(call.backend).linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats,
                                                  entropy, opts)
    wanted = (opts.need_grad_hidden, opts.need_grad_weight, opts.need_grad_weight and bias is not None)
    return tuple(g if (w and g is not None) else hidden.new_empty((0,)) for g, w in zip(grads, wanted))


@linear_logprobs_bwd.register_fake
def _(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, *call):
    opts = Call.unpack(call).opts

    def like(t, wanted):
        return torch.empty_like(t) if (wanted and t is not None) else hidden.new_empty((0,))

    return like(hidden, opts.need_grad_hidden), like(weight, opts.need_grad_weight), like(bias, opts.need_grad_weight)


def linear_setup_context(ctx, inputs, output):
    """`sgrpo::linear_logprobs_fwd`'s autograd: what the backward needs, the Call unpacked once."""
    hidden, weight, targets, bias, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(hidden, weight, targets, bias, stats, entropy)
    ctx.call = Call.unpack(tuple(call))
    ctx.has_bias = bias is not None


def linear_backward(ctx, grad_logp, grad_entropy, _grad_stats):
    hidden, weight, targets, bias, stats, entropy = ctx.saved_tensors
    _check_saved(stats, hidden.shape[0], "linear_logprobs")
    need_h, need_w, _, need_b = ctx.needs_input_grad[:4]
    need_b = ctx.has_bias and need_b
    call = ctx.call.for_backward(need_grad_hidden=need_h, need_grad_weight=need_w or need_b)
    g_logp, g_ent, ent = _upstream(grad_logp, grad_entropy, stats, entropy, call)
    gh, gw, gb = linear_logprobs_bwd(g_logp, g_ent, hidden, weight, targets, bias, stats, ent, *call.pack())
    return (gh if need_h else None, gw if need_w else None, None, gb if need_b else None) + (None,) * N_CALL


# --------------------------------------------------------------------------------------------- logprobs_from_logits

_LOGITS_BWD_TENSORS = ("Tensor grad_logp, Tensor? grad_entropy, Tensor{} logits, Tensor targets, Tensor stats, "
                       "Tensor? entropy")


@custom_op("logprobs_from_logits_bwd", _LOGITS_BWD_TENSORS.format(""), "Tensor")
def logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, *call: object):
    """-> grad_logits (N, V) in a new buffer."""
    call = Call.unpack(call)
    return get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy,
                                                      call.opts)


@logprobs_from_logits_bwd.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, *call):
    return torch.empty_like(logits)


@custom_op("logprobs_from_logits_bwd_", _LOGITS_BWD_TENSORS.format("(a!)"), "()", mutates=("logits",))
def logprobs_from_logits_bwd_(grad_logp, grad_entropy, logits, targets, stats, entropy, *call: object) -> None:
    """In-place variant (call.opts.inplace_backward): overwrites `logits` with grad_logits chunk by chunk, no second
    (N, V) buffer."""
    call = Call.unpack(call)
    get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, call.opts)


@logprobs_from_logits_bwd_.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, *call):
    return None


def logits_setup_context(ctx, inputs, output):
    """`sgrpo::logprobs_from_logits_fwd`'s autograd: what the backward needs, the Call unpacked once."""
    logits, targets, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(logits, targets, stats, entropy)
    ctx.call = Call.unpack(tuple(call))


def logits_backward(ctx, grad_logp, grad_entropy, _grad_stats):
    logits, targets, stats, entropy = ctx.saved_tensors
    _check_saved(stats, logits.shape[0], "logprobs_from_logits")
    call = ctx.call.for_backward()
    g_logp, g_ent, ent = _upstream(grad_logp, grad_entropy, stats, entropy, call)
    args = (g_logp, g_ent, logits, targets, stats, ent, *call.pack())
    if call.opts.inplace_backward:
        logprobs_from_logits_bwd_(*args)
        grad = logits
    else:
        grad = logprobs_from_logits_bwd(*args)
    return (grad, None) + (None,) * N_CALL
