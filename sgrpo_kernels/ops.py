"""The two public ops, `linear_logprobs` and `logprobs_from_logits`, their result types, and the forward custom ops
they call.

Layers (docs/design.md): these functions (boundary checks, one :class:`~sgrpo_kernels.backends.HeadOptions` built from
the head keywords, backend resolution, flattening of leading dims) -> the custom ops `sgrpo::linear_logprobs_fwd`,
`sgrpo::logprobs_from_logits_fwd` (defined here: the target check, then the backend's forward) with their schema,
`Call` and autograd from `sgrpo_kernels.custom_ops` (the backward custom ops) -> the backend named in the `Call`.

Results are NamedTuples: :class:`LogProbs` ``(logp, entropy)`` by default, so ``logp, entropy = linear_logprobs(...)``
unpacks two values as it always has, and :class:`LogProbsWithMax` ``(logp, entropy, max_logprob)`` with
``return_max_logprob=True``. Both have ``.logp``, ``.entropy`` and ``.max_logprob`` (None on :class:`LogProbs`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import Tensor

from sgrpo_kernels.backends import HeadOptions, Options, get, resolve
from sgrpo_kernels.custom_ops import (
    STATS,
    Call,
    custom_op,
    linear_backward,
    linear_setup_context,
    logits_backward,
    logits_setup_context,
    row_stats_fake,
)
from sgrpo_kernels.truncation import (
    Sampling,
    linear_support_backward,
    linear_support_setup_context,
    linear_threshold,
    logits_support_backward,
    logits_support_setup_context,
    logits_threshold,
)
from sgrpo_kernels.validation import (
    MIN_TEMPERATURE,
    check_flag,
    check_global_vocab,
    check_linear_inputs,
    check_logits_inputs,
    check_memory_budget,
    check_process_group,
    check_target_values,
    env_flag,
    env_mebibytes,
)
from sgrpo_kernels.vocab_parallel import LinearVP, LogitsVP, shard_range

__all__ = ["LogProbs", "LogProbsWithMax", "linear_logprobs", "logprobs_from_logits"]

ENV_MEMORY_BUDGET_MB = "SGRPO_MEMORY_BUDGET_MB"
ENV_CHECK_TARGETS = "SGRPO_CHECK_TARGETS"
# the head options logprobs_from_logits serves: its logits already are the head's output, scaled and capped
LOGITS_HEAD_OPTIONS = ("temperature", "ignore_index")


# ------------------------------------------------------------------------------------------------------- results


class LogProbs(NamedTuple):
    """What the ops return by default: unpacks into exactly two values, ``logp, entropy = op(...)``."""

    logp: Tensor  # (...) float32 (float64 for float64 inputs), the leading shape of the input
    entropy: Tensor | None  # same; None with return_entropy=False

    @property
    def max_logprob(self) -> None:
        """Not requested (return_max_logprob=False): None, so code may read ``.max_logprob`` of either result."""
        return None


class LogProbsWithMax(NamedTuple):
    """What the ops return with ``return_max_logprob=True``: ``logp, entropy, max_logprob = op(...)``."""

    logp: Tensor
    entropy: Tensor | None
    max_logprob: Tensor  # log p_max per row, detached (no gradient), 0 on ignored rows


# ------------------------------------------------------------------------------------------ the forward custom ops
# Defined here, next to the public functions, so that the target check they run is this module's
# `check_target_values`: the one name a caller counts or replaces (the trainer's tests count checks per step).


@custom_op("linear_logprobs_fwd", "Tensor hidden, Tensor weight, Tensor targets, Tensor? bias", STATS)
def linear_logprobs_fwd(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, *call: object):
    """(N, D), (V, D), (N,) -> logp (N,), entropy (N,) or (0,), stats (2, N) or (2, 0); fp32 (fp64 for fp64
    inputs). The target check (a host sync) runs in here, where torch.compile does not trace it."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, weight.shape[0], call.opts.ignore_index)
    return get(call.backend).linear_logprobs_fwd(hidden, weight, targets, bias, call.opts)


@linear_logprobs_fwd.register_fake
def _(hidden, weight, targets, bias, *call):
    return row_stats_fake(hidden, Call.unpack(call))


torch.library.register_autograd("sgrpo::linear_logprobs_fwd", linear_backward, setup_context=linear_setup_context)


@custom_op("logprobs_from_logits_fwd", "Tensor logits, Tensor targets", STATS)
def logprobs_from_logits_fwd(logits: Tensor, targets: Tensor, *call: object):
    """(N, V), (N,) -> logp (N,), entropy (N,) or (0,), stats (2, N) or (2, 0); fp32 (fp64 for fp64 inputs)."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, logits.shape[1], call.opts.ignore_index)
    return get(call.backend).logprobs_from_logits_fwd(logits, targets, call.opts)


@logprobs_from_logits_fwd.register_fake
def _(logits, targets, *call):
    return row_stats_fake(logits, Call.unpack(call))


torch.library.register_autograd("sgrpo::logprobs_from_logits_fwd", logits_backward, setup_context=logits_setup_context)


# The sampler's support (top_k / top_p / min_p): the same forwards with the per-row threshold of
# `sgrpo_kernels.truncation` as one more input (their backwards and autograd: that module). Ops of their own, so that
# the schemas above stay what they were.


@custom_op("linear_logprobs_support_fwd",
           "Tensor hidden, Tensor weight, Tensor targets, Tensor? bias, Tensor threshold", STATS)
def linear_logprobs_support_fwd(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None,
                                threshold: Tensor, *call: object):
    """`linear_logprobs_fwd` over the tokens z_j >= threshold[row] (and the row's target)."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, weight.shape[0], call.opts.ignore_index)
    return get(call.backend).linear_logprobs_fwd(hidden, weight, targets, bias, call.opts, threshold=threshold)


@linear_logprobs_support_fwd.register_fake
def _(hidden, weight, targets, bias, threshold, *call):
    return row_stats_fake(hidden, Call.unpack(call))


torch.library.register_autograd("sgrpo::linear_logprobs_support_fwd", linear_support_backward,
                                setup_context=linear_support_setup_context)


@custom_op("logprobs_from_logits_support_fwd", "Tensor logits, Tensor targets, Tensor threshold", STATS)
def logprobs_from_logits_support_fwd(logits: Tensor, targets: Tensor, threshold: Tensor, *call: object):
    """`logprobs_from_logits_fwd` over the tokens z_j >= threshold[row] (and the row's target)."""
    call = Call.unpack(call)
    if call.check_targets:
        check_target_values(targets, logits.shape[1], call.opts.ignore_index)
    return get(call.backend).logprobs_from_logits_fwd(logits, targets, call.opts, threshold=threshold)


@logprobs_from_logits_support_fwd.register_fake
def _(logits, targets, threshold, *call):
    return row_stats_fake(logits, Call.unpack(call))


torch.library.register_autograd("sgrpo::logprobs_from_logits_support_fwd", logits_support_backward,
                                setup_context=logits_support_setup_context)


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


def _may_overlap(t: Tensor) -> bool:
    """Two elements of `t` may share memory: a dim of stride 0 and size > 1 (an expand()), or, dims of size > 1 taken
    by increasing stride, a stride that does not clear the offsets the dims before it reach (an as_strided view).
    From sizes and strides alone, so that torch.compile traces it (torch._debug_has_internal_overlap it cannot)."""
    if t.numel() == 0:
        return False
    dims = [(st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1]
    reach = 0  # the largest offset the dims taken so far reach
    while dims:  # (by hand: Dynamo cannot sort symbolic strides)
        k = 0
        for i in range(1, len(dims)):
            if dims[i][0] < dims[k][0]:
                k = i
        stride, size = dims.pop(k)
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _check_max_logprob(flag: object, shard: bool, op: str) -> bool:
    want = check_flag("return_max_logprob", flag)
    if want and shard:
        raise ValueError(f"{op}: return_max_logprob=True is not supported with process_group (vocab-sharded) yet")
    return want


def _max_logprob(stats: Tensor, lead: torch.Size) -> Tensor:
    """log p_max = max_j z_j - logsumexp(z) = -log s from the row statistics [m; log s] (0 on ignored rows, whose
    statistics are 0); detached: a statistic, no gradient."""
    return (0.0 - stats[1]).detach().view(lead)  # 0 - 0 = +0.0 on ignored rows


def _fold_scale(head: HeadOptions) -> HeadOptions:
    """Without a nonlinear head, z = scale * logits / T = logits / (T / scale): exact, and every backend serves it."""
    if head.nonlinear_head:
        return head
    t = head.temperature / head.logit_scale
    if t < MIN_TEMPERATURE:  # the same limit as a temperature given alone (1 / T overflowed float32: NaN rows)
        raise ValueError(f"temperature / logit_scale = {head.temperature!r} / {head.logit_scale!r} = {t:.6g} must "
                         f"be >= {MIN_TEMPERATURE:.8g} (float32's smallest normal number: the ops compute logits x "
                         "logit_scale / temperature in float32)")
    return dataclasses.replace(head, temperature=t, logit_scale=1.0)


def _result(
    logp: Tensor, entropy: Tensor, stats: Tensor | None, lead: torch.Size, opts: Options, want_max: bool
) -> LogProbs | LogProbsWithMax:
    out = LogProbs(logp.view(lead), entropy.view(lead) if opts.return_entropy else None)
    return LogProbsWithMax(*out, _max_logprob(stats, lead)) if want_max else out  # (refused with process_group)


def linear_logprobs(
    hidden: Tensor,  # (..., D)
    weight: Tensor,  # (V, D)
    targets: Tensor,  # (...) integer
    *,
    bias: Tensor | None = None,  # (V,)
    return_entropy: bool = True,
    backend: str | None = None,
    memory_budget: int | None = None,
    check_targets: bool | None = None,
    process_group=None,
    return_max_logprob: bool = False,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    min_p: float | Tensor | None = None,
    **head_options: object,  # temperature=1.0, ignore_index=-100, logit_scale=1.0, softcap=None: HeadOptions
) -> LogProbs | LogProbsWithMax:
    """Log-probability of `targets` and entropy of softmax((hidden @ weight.T + bias) / temperature), fused.

    The (..., V) logits are never materialized. With z = (h . W_j + b_j) / temperature for one row:
        logp = z_y - logsumexp(z),   entropy = -sum_j p_j log p_j,   p = softmax(z).

    Returns :class:`LogProbs` ``(logp, entropy)``, both float32 (float64 for float64 inputs) with the leading shape
    `hidden.shape[:-1]`; with `return_entropy=False` the entropy is not computed and is None. Rows whose target
    equals `ignore_index` give 0 for both and receive no gradient. Differentiable w.r.t. hidden, weight and bias
    through both outputs. Under `torch.no_grad()` (or when no input requires grad) nothing is saved for backward.

    Head options (keywords; the fields of :class:`~sgrpo_kernels.backends.HeadOptions`, each validated):
        temperature: the sampling temperature (> 0, default 1.0); ignore_index: the target of ignored rows (-100).
        logit_scale, softcap: a model's head options, applied in its order before the temperature:
            logits = softcap * tanh(logit_scale * (h W^T + b) / softcap) (Gemma 2/3's final_logit_softcapping), or
            logit_scale * (h W^T + b) without a softcap (softcap=None, the default; Cohere; Granite's
            1 / logits_scaling). A logit scale alone is folded into the temperature (every backend); a softcap is
            applied by the torch and triton backends (npu refuses it for now). `sgrpo_kernels.integrations.hf.lm_head`
            reads both from a Hugging Face model (`**lm_head(model).options()`).

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
        return_max_logprob: also return log p_max = max_j log p_j = -log sum_j exp(z_j - max z) per row (0 on
            ignored rows), forward only (no gradient flows through it): a :class:`LogProbsWithMax`
            ``(logp, entropy, max_logprob)``. Free: it is the forward's own row statistic on every backend. Not
            supported with `process_group` yet.
        top_k, top_p, min_p: the sampler's support (vLLM's rules and order, docs/ops.md "Sampler support"): each None
            (off), a Python number, or a tensor of one value per row (the shape of `targets`), so that one batch may
            mix settings. top_k >= 1 (k >= V keeps all), top_p in (0, 1] (1 keeps all), min_p in [0, 1) (0 keeps
            all), applied to z after the temperature: min_p, then top_k, then top_p. logp and entropy are those of
            the distribution renormalized over the kept tokens, to which the target always belongs (it was
            sampled); the gradients hold the support fixed. Found without (N, V) logits (sgrpo_kernels/support.py).
            Not with `process_group`, nor on the npu backend, yet. With none of them cutting a token the op is
            exactly the full-vocabulary op.
    """
    shard = process_group is not None
    check_linear_inputs(hidden, weight, targets, bias, shard=shard)
    full_vocab = None if shard else weight.shape[0]  # (sharded: the global vocabulary is known after shard_range)
    sampling = Sampling.from_args(top_k, top_p, min_p, targets.shape, hidden.device, full_vocab)
    head = _fold_scale(HeadOptions.from_kwargs("linear_logprobs", head_options))
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    want_max = _check_max_logprob(return_max_logprob, shard, "linear_logprobs")
    call = Call(
        backend=resolve(backend, hidden.device),
        check_targets=_check_targets(check_targets),
        opts=Options.with_head(
            head, return_entropy=check_flag("return_entropy", return_entropy), need_stats=needs_grad or want_max,
            memory_budget=_budget(memory_budget),
        ),
    )
    if sampling is not None and not shard:  # (sharded: below, with the global vocabulary)
        sampling.refuse_if_unsupported("linear_logprobs", call.backend, shard)
    lead = targets.shape
    h2, t1 = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    stats = None
    if shard:
        group = check_process_group(process_group, "linear_logprobs")
        offset, _, vocab = shard_range(weight.shape[0], group, hidden.device)
        check_global_vocab(vocab, "linear_logprobs")
        if sampling is not None:
            sampling.refuse_if_unsupported("linear_logprobs", call.backend, shard, vocab)
        if call.check_targets:
            check_target_values(t1, vocab, head.ignore_index)
        logp, entropy = LinearVP.apply(h2, weight, t1, bias, group, call.backend, call.opts, offset)
    else:
        if sampling is None:
            logp, entropy, stats = linear_logprobs_fwd(h2, weight, t1, bias, *call.pack())
        else:
            thr = linear_threshold(h2, weight, t1, bias, sampling, call)
            logp, entropy, stats = linear_logprobs_support_fwd(h2, weight, t1, bias, thr, *call.pack())
    return _result(logp, entropy, stats, lead, call.opts, want_max)


def logprobs_from_logits(
    logits: Tensor,  # (..., V)
    targets: Tensor,  # (...) integer
    *,
    return_entropy: bool = True,
    backend: str | None = None,
    memory_budget: int | None = None,
    inplace_backward: bool = False,
    check_targets: bool | None = None,
    process_group=None,
    return_max_logprob: bool = False,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    min_p: float | Tensor | None = None,
    **head_options: object,  # temperature=1.0, ignore_index=-100 (LOGITS_HEAD_OPTIONS)
) -> LogProbs | LogProbsWithMax:
    """Log-probability of `targets` and entropy of softmax(logits / temperature), for callers that hold logits.

    One streaming pass over V per row (online statistics); the backward writes grad_logits vocab chunk by vocab chunk.
    Returns :class:`LogProbs` ``(logp, entropy)`` float32 (float64 for float64 logits) with the leading shape
    `logits.shape[:-1]` (entropy None with `return_entropy=False`). Ignored rows give 0 and no gradient.

    Head options (keywords): temperature and ignore_index, as in `linear_logprobs`. The logits are the head's
    output already, so logit_scale and softcap are refused (apply them to the logits).

    Args:
        inplace_backward: write grad_logits into the `logits` buffer itself instead of a new (N, V) tensor. Only safe
            when nothing else needs `logits` after this op's backward (autograd raises if something saved it).
            Refused for a leaf that requires grad and for any view of one (its data would become its gradient), and
            for logits whose strides may overlap (an expand()); allowed for non-leaf tensors and their views, e.g.
            `(hidden @ weight.T).view(B, T, V)`.
        backend, memory_budget, check_targets: as in `linear_logprobs`.
        process_group: the logits are this rank's contiguous vocabulary shard (N, V_r) over a `torch.distributed`
            group, as in `linear_logprobs`; `targets` are global ids; each rank gets its shard's gradient.
            `inplace_backward` is not supported with it.
        return_max_logprob: as in `linear_logprobs`: a :class:`LogProbsWithMax`, forward only.
        top_k, top_p, min_p: the sampler's support, as in `linear_logprobs`.
    """
    shard = process_group is not None
    check_logits_inputs(logits, targets, shard=shard)
    full_vocab = None if shard else logits.shape[-1]
    sampling = Sampling.from_args(top_k, top_p, min_p, targets.shape, logits.device, full_vocab)
    head = HeadOptions.from_kwargs("logprobs_from_logits", head_options, LOGITS_HEAD_OPTIONS)
    check_flag("return_entropy", return_entropy)
    check_flag("inplace_backward", inplace_backward)
    if inplace_backward and _may_overlap(logits):
        raise ValueError(
            f"inplace_backward=True needs a logits buffer whose elements are distinct, but logits (shape "
            f"{tuple(logits.shape)}, stride {logits.stride()}) has overlapping elements (e.g. an expand()) or strides "
            "that cannot rule them out: the gradient cannot be written into it; pass logits.contiguous() or "
            "inplace_backward=False"
        )
    if inplace_backward and _aliases_grad_leaf(logits):
        raise ValueError(
            "inplace_backward=True would overwrite logits, which is (or is a view of) a leaf tensor that requires "
            "grad, with its own gradient; pass a non-leaf buffer (e.g. the output of the LM-head matmul) or use "
            "inplace_backward=False"
        )
    want_max = _check_max_logprob(return_max_logprob, shard, "logprobs_from_logits")
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    call = Call(
        backend=resolve(backend, logits.device),
        check_targets=_check_targets(check_targets),
        opts=Options.with_head(
            head, return_entropy=return_entropy, need_stats=needs_grad or want_max,
            memory_budget=_budget(memory_budget), inplace_backward=inplace_backward,
        ),
    )
    if sampling is not None and not shard:  # (sharded: below, with the global vocabulary)
        sampling.refuse_if_unsupported("logprobs_from_logits", call.backend, shard)
    lead = targets.shape
    t1 = targets.reshape(-1).long()
    l2 = logits.reshape(t1.shape[0], logits.shape[-1])  # (an empty shard has no -1 to infer)
    stats = None
    if shard:
        if inplace_backward:
            raise ValueError("inplace_backward=True is not supported with process_group (vocab-sharded logits)")
        group = check_process_group(process_group, "logprobs_from_logits")
        offset, _, vocab = shard_range(logits.shape[-1], group, logits.device)
        check_global_vocab(vocab, "logprobs_from_logits")
        if sampling is not None:
            sampling.refuse_if_unsupported("logprobs_from_logits", call.backend, shard, vocab)
        if call.check_targets:
            check_target_values(t1, vocab, head.ignore_index)
        logp, entropy = LogitsVP.apply(l2, t1, group, call.backend, call.opts, offset)
    else:
        if sampling is None:
            logp, entropy, stats = logprobs_from_logits_fwd(l2, t1, *call.pack())
        else:
            thr = logits_threshold(l2, t1, sampling, call)
            logp, entropy, stats = logprobs_from_logits_support_fwd(l2, t1, thr, *call.pack())
    return _result(logp, entropy, stats, lead, call.opts, want_max)
