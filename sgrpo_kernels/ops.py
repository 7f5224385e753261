"""The two ops of the contract, defined once with torch.library: schema, fake implementation, autograd.

Layers (docs/design.md): the public functions `linear_logprobs`, `logprobs_from_logits` (validation, backend
resolution, flattening of leading dims) -> custom ops `sgrpo::linear_logprobs_fwd/_bwd`,
`sgrpo::logprobs_from_logits_fwd/_bwd(_)` with autograd -> the backend named in their arguments
(`sgrpo_kernels.backends`).

Every custom op takes its tensors, then the fields of one :class:`Call` (the backend, the target check and the
backend :class:`~sgrpo_kernels.backends.Options`). The schemas, the fakes, `setup_context` and the backwards pack and
unpack that one structure, so adding an option is one new `Options` field (and its keyword in the public function).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from sgrpo_kernels.backends import Options, get, resolve, stats_dtype
from sgrpo_kernels.validation import (
    check_flag,
    check_global_vocab,
    check_head_options,
    check_linear_inputs,
    check_logits_inputs,
    check_memory_budget,
    check_process_group,
    check_target_values,
    env_flag,
    env_mebibytes,
)
from sgrpo_kernels.vocab_parallel import LinearVP, LogitsVP, shard_range

__all__ = ["linear_logprobs", "logprobs_from_logits"]

ENV_MEMORY_BUDGET_MB = "SGRPO_MEMORY_BUDGET_MB"
ENV_CHECK_TARGETS = "SGRPO_CHECK_TARGETS"


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
_N_CALL = 2 + len(_OPTION_FIELDS)  # the Call fields in a schema: backward returns None for each
_CALL_SCHEMA = "str backend, bool check_targets, " + ", ".join(f"{f.type} {f.name}" for f in _OPTION_FIELDS)
# stats (2, N) = [row max m; log s] of z = logits / temperature (backends/contract.py), kept for the backward;
# entropy is empty (0,) and stats empty (2, 0) when not requested
_STATS = "(Tensor logp, Tensor entropy, Tensor stats)"


def _custom_op(name: str, tensors: str, returns: str, mutates: tuple[str, ...] = ()):
    """Decorator: a custom op `sgrpo::name(tensors..., <Call fields>) -> returns`."""
    schema = f"({tensors}, {_CALL_SCHEMA}) -> {returns}"
    return lambda fn: torch.library.custom_op(f"sgrpo::{name}", fn, mutates_args=mutates, schema=schema)


def _row_stats_fake(ref: Tensor, call: Call) -> tuple[Tensor, Tensor, Tensor]:
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


@_custom_op("linear_logprobs_fwd", "Tensor hidden, Tensor weight, Tensor targets, Tensor? bias", _STATS)
def linear_logprobs_fwd(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, *call: object):
    """(N, D), (V, D), (N,) -> logp (N,), entropy (N,) or (0,), stats (2, N) or (2, 0); fp32 (fp64 for fp64
    inputs)."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, weight.shape[0], call.opts.ignore_index)
    return get(call.backend).linear_logprobs_fwd(hidden, weight, targets, bias, call.opts)


@linear_logprobs_fwd.register_fake
def _(hidden, weight, targets, bias, *call):
    return _row_stats_fake(hidden, Call.unpack(call))


@_custom_op(
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


def _linear_setup_context(ctx, inputs, output):
    hidden, weight, targets, bias, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(hidden, weight, targets, bias, stats, entropy)
    ctx.call = Call.unpack(tuple(call))
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad_logp, grad_entropy, _grad_stats):
    hidden, weight, targets, bias, stats, entropy = ctx.saved_tensors
    _check_saved(stats, hidden.shape[0], "linear_logprobs")
    need_h, need_w, _, need_b = ctx.needs_input_grad[:4]
    need_b = ctx.has_bias and need_b
    call = ctx.call.for_backward(need_grad_hidden=need_h, need_grad_weight=need_w or need_b)
    g_logp, g_ent, ent = _upstream(grad_logp, grad_entropy, stats, entropy, call)
    gh, gw, gb = linear_logprobs_bwd(g_logp, g_ent, hidden, weight, targets, bias, stats, ent, *call.pack())
    return (gh if need_h else None, gw if need_w else None, None, gb if need_b else None) + (None,) * _N_CALL


torch.library.register_autograd("sgrpo::linear_logprobs_fwd", _linear_backward, setup_context=_linear_setup_context)


# --------------------------------------------------------------------------------------------- logprobs_from_logits

_LOGITS_BWD_TENSORS = ("Tensor grad_logp, Tensor? grad_entropy, Tensor{} logits, Tensor targets, Tensor stats, "
                       "Tensor? entropy")


@_custom_op("logprobs_from_logits_fwd", "Tensor logits, Tensor targets", _STATS)
def logprobs_from_logits_fwd(logits: Tensor, targets: Tensor, *call: object):
    """(N, V), (N,) -> logp (N,), entropy (N,) or (0,), stats (2, N) or (2, 0); fp32 (fp64 for fp64 inputs)."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, logits.shape[1], call.opts.ignore_index)
    return get(call.backend).logprobs_from_logits_fwd(logits, targets, call.opts)


@logprobs_from_logits_fwd.register_fake
def _(logits, targets, *call):
    return _row_stats_fake(logits, Call.unpack(call))


@_custom_op("logprobs_from_logits_bwd", _LOGITS_BWD_TENSORS.format(""), "Tensor")
def logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, *call: object):
    """-> grad_logits (N, V) in a new buffer."""
    call = Call.unpack(call)
    return get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy,
                                                      call.opts)


@logprobs_from_logits_bwd.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, *call):
    return torch.empty_like(logits)


@_custom_op("logprobs_from_logits_bwd_", _LOGITS_BWD_TENSORS.format("(a!)"), "()", mutates=("logits",))
def logprobs_from_logits_bwd_(grad_logp, grad_entropy, logits, targets, stats, entropy, *call: object) -> None:
    """In-place variant (call.opts.inplace_backward): overwrites `logits` with grad_logits chunk by chunk, no second
    (N, V) buffer."""
    call = Call.unpack(call)
    get(call.backend).logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, call.opts)


@logprobs_from_logits_bwd_.register_fake
def _(grad_logp, grad_entropy, logits, targets, stats, entropy, *call):
    return None


def _logits_setup_context(ctx, inputs, output):
    logits, targets, *call = inputs
    _, entropy, stats = output
    ctx.save_for_backward(logits, targets, stats, entropy)
    ctx.call = Call.unpack(tuple(call))


def _logits_backward(ctx, grad_logp, grad_entropy, _grad_stats):
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
    return (grad, None) + (None,) * _N_CALL


torch.library.register_autograd(
    "sgrpo::logprobs_from_logits_fwd", _logits_backward, setup_context=_logits_setup_context
)


# ---------------------------------------------------------------------------------------------------- public API


def _budget(memory_budget: int | None) -> int:
    if memory_budget is not None:
        return check_memory_budget(memory_budget)
    env = env_mebibytes(ENV_MEMORY_BUDGET_MB)
    return 0 if env is None else env


def _check_targets(flag: bool | None) -> bool:
    if flag is not None:
        return check_flag("check_targets", flag)
    return env_flag(ENV_CHECK_TARGETS, True)


def _aliases_grad_leaf(t: Tensor) -> bool:
    """`t` is a leaf that requires grad, or a view of one (a view's `_base` is the tensor owning the storage)."""
    return any(x is not None and x.is_leaf and x.requires_grad for x in (t, t._base))


def _check_max_logprob(flag: object, shard: bool, op: str) -> bool:
    want = check_flag("return_max_logprob", flag)
    if want and shard:
        raise ValueError(f"{op}: return_max_logprob=True is not supported with process_group (vocab-sharded) yet")
    return want


def _max_logprob(stats: Tensor, lead: torch.Size) -> Tensor:
    """log p_max = max_j z_j - logsumexp(z) = -log s from the row statistics [m; log s] (0 on ignored rows, whose
    statistics are 0); detached: a statistic, no gradient."""
    return (0.0 - stats[1]).detach().view(lead)  # 0 - 0 = +0.0 on ignored rows


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
    check_targets: bool | None = None,
    process_group=None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    return_max_logprob: bool = False,
) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, Tensor]:
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
        check_targets: verify that every target lies in [0, V) or equals ignore_index (env SGRPO_CHECK_TARGETS,
            default on). It costs one device-to-host sync per call; a caller that validated its targets once may
            pass False for the calls that follow.
        process_group: a `torch.distributed` group over which the head is sharded by vocabulary (vocab parallel):
            `weight` (and `bias`) is this rank's contiguous shard, shards in rank order, sizes may differ (a shard
            may be empty); `targets` are global token ids; `hidden` is the same on every rank. The result is the
            unsharded op's on every rank; the gradient of `hidden` is the full one on every rank, those of `weight`
            and `bias` this rank's shard of the full gradient. Collectives: sgrpo_kernels/vocab_parallel.py.
        logit_scale, softcap: a model's head options, applied in its order before the temperature:
            logits = softcap * tanh(logit_scale * (h W^T + b) / softcap) (Gemma 2/3's final_logit_softcapping), or
            logit_scale * (h W^T + b) without a softcap (Cohere; Granite's 1 / logits_scaling). A logit scale alone is
            folded into the temperature (every backend); a softcap is applied by the torch and triton backends (npu
            refuses it for now). `sgrpo_kernels.integrations.hf.lm_head` reads both from a Hugging Face model.
        return_max_logprob: also return log p_max = max_j log p_j = -log sum_j exp(z_j - max z) per row (0 on
            ignored rows), forward only (no gradient flows through it): `(logp, entropy, max_logprob)`. Free: it is
            the forward's own row statistic on every backend. Not supported with `process_group` yet.
    """
    shard = process_group is not None
    temperature, ignore_index = check_linear_inputs(
        hidden, weight, targets, bias, temperature, ignore_index, shard=shard
    )
    logit_scale, softcap = check_head_options(logit_scale, softcap)
    if not softcap:  # z = scale * logits / T = logits / (T / scale): exact, and every backend serves it
        temperature, logit_scale = temperature / logit_scale, 1.0
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    want_max = _check_max_logprob(return_max_logprob, shard, "linear_logprobs")
    call = Call(
        backend=resolve(backend, hidden.device),
        check_targets=_check_targets(check_targets),
        opts=Options(
            temperature=temperature, ignore_index=ignore_index,
            return_entropy=check_flag("return_entropy", return_entropy), need_stats=needs_grad or want_max,
            memory_budget=_budget(memory_budget), softcap=softcap, logit_scale=logit_scale,
        ),
    )
    lead = targets.shape
    h2, t1 = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    if shard:
        group = check_process_group(process_group, "linear_logprobs")
        offset, _, vocab = shard_range(weight.shape[0], group, hidden.device)
        check_global_vocab(vocab, "linear_logprobs")
        if call.check_targets:
            check_target_values(t1, vocab, ignore_index)
        logp, entropy = LinearVP.apply(h2, weight, t1, bias, group, call.backend, call.opts, offset)
    else:
        logp, entropy, stats = linear_logprobs_fwd(h2, weight, t1, bias, *call.pack())
    out = (logp.view(lead), entropy.view(lead) if return_entropy else None)
    return out + (_max_logprob(stats, lead),) if want_max else out  # want_max is refused with process_group


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
    check_targets: bool | None = None,
    process_group=None,
    return_max_logprob: bool = False,
) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, Tensor]:
    """Log-probability of `targets` and entropy of softmax(logits / temperature), for callers that hold logits.

    One streaming pass over V per row (online statistics); the backward writes grad_logits vocab chunk by vocab chunk.
    Returns `(logp, entropy)` float32 (float64 for float64 logits) with the leading shape `logits.shape[:-1]`
    (`(logp, None)` with `return_entropy=False`). Ignored rows give 0 and no gradient.

    Args:
        inplace_backward: write grad_logits into the `logits` buffer itself instead of a new (N, V) tensor. Only safe
            when nothing else needs `logits` after this op's backward (autograd raises if something saved it).
            Refused for a leaf that requires grad and for any view of one (its data would become its gradient);
            allowed for non-leaf tensors and their views, e.g. `(hidden @ weight.T).view(B, T, V)`.
        backend, memory_budget, check_targets: as in `linear_logprobs`.
        process_group: the logits are this rank's contiguous vocabulary shard (N, V_r) over a `torch.distributed`
            group, as in `linear_logprobs`; `targets` are global ids; each rank gets its shard's gradient.
            `inplace_backward` is not supported with it.
        return_max_logprob: as in `linear_logprobs`: `(logp, entropy, max_logprob)`, forward only.
    """
    shard = process_group is not None
    temperature, ignore_index = check_logits_inputs(logits, targets, temperature, ignore_index, shard=shard)
    check_flag("return_entropy", return_entropy)
    check_flag("inplace_backward", inplace_backward)
    if inplace_backward and _aliases_grad_leaf(logits):
        raise ValueError(
            "inplace_backward=True would overwrite logits, which is (or is a view of) a leaf tensor that requires "
            "grad, with its own gradient; pass a non-leaf buffer (e.g. the output of the LM-head matmul) or use "
            "inplace_backward=False"
        )
    want_max = _check_max_logprob(return_max_logprob, shard, "logprobs_from_logits")
    call = Call(
        backend=resolve(backend, logits.device),
        check_targets=_check_targets(check_targets),
        opts=Options(
            temperature=temperature, ignore_index=ignore_index, return_entropy=return_entropy,
            need_stats=(torch.is_grad_enabled() and logits.requires_grad) or want_max,
            memory_budget=_budget(memory_budget), inplace_backward=inplace_backward,
        ),
    )
    lead = targets.shape
    t1 = targets.reshape(-1).long()
    l2 = logits.reshape(t1.shape[0], logits.shape[-1])  # (an empty shard has no -1 to infer)
    if shard:
        if inplace_backward:
            raise ValueError("inplace_backward=True is not supported with process_group (vocab-sharded logits)")
        group = check_process_group(process_group, "logprobs_from_logits")
        offset, _, vocab = shard_range(logits.shape[-1], group, logits.device)
        check_global_vocab(vocab, "logprobs_from_logits")
        if call.check_targets:
            check_target_values(t1, vocab, ignore_index)
        logp, entropy = LogitsVP.apply(l2, t1, group, call.backend, call.opts, offset)
    else:
        logp, entropy, stats = logprobs_from_logits_fwd(l2, t1, *call.pack())
    out = (logp.view(lead), entropy.view(lead) if return_entropy else None)
    return out + (_max_logprob(stats, lead),) if want_max else out  # want_max is refused with process_group
