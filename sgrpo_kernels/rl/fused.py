"""``sgrpo_loss``: hidden states -> ``linear_logprobs`` (logits never exist) -> :func:`policy_loss`, in one call."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from sgrpo_kernels.backends.contract import HeadOptions
from sgrpo_kernels.ops import linear_logprobs
from sgrpo_kernels.rl.checks import check_loss_inputs
from sgrpo_kernels.rl.config import LossConfig
from sgrpo_kernels.rl.loss import checked_policy_loss
from sgrpo_kernels.validation import check_flag, check_float_tensor, check_int_tensor, check_mask, check_rank
from sgrpo_kernels.vocab_parallel import shard_range

__all__ = ["sgrpo_loss"]


def sgrpo_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    *,
    bias: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    token_weights: Tensor | None = None,
    conflict_counts: Tensor | None = None,
    rewards: Tensor | None = None,
    group_size: int | None = None,
    sampler_logp: Tensor | None = None,
    policy_weights: Tensor | None = None,
    generator: torch.Generator | None = None,
    compute_entropy: bool | None = None,
    backend: str | None = None,
    memory_budget: int | None = None,
    check_targets: bool | None = None,
    process_group=None,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    min_p: float | Tensor | None = None,
    on_logp: Callable[[Tensor], Mapping[str, object]] | None = None,
    **head_options: object,  # temperature, ignore_index, logit_scale, softcap: passed to linear_logprobs as given
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""The GRPO-family loss straight from LM hidden states, without materializing ``[B*T, V]`` logits.

    .. math::
        (\log\pi_{it}, H_{it}) = \mathrm{linear\_logprobs}(h_{it}, W, y_{it}; b, \tau),\quad
        (L, metrics) = \mathrm{policy\_loss}(\log\pi, A, m, config, H, \ldots)

    Positions where ``mask`` is 0 or ``targets == ignore_index`` are passed to ``linear_logprobs`` as ignored rows and
    excluded from the loss; together with zero-weight tokens and filtered completions they receive exactly zero
    upstream gradient, so the fast backends skip them in the backward. Gradients reach ``hidden``, ``weight`` and
    ``bias``.

    Args:
        hidden: ``[B, T, D]`` float hidden states at the positions that predict ``targets`` (already shifted).
        weight: ``[V, D]`` LM-head weight; bias: optional ``[V]``.
        targets: ``[B, T]`` integer sampled completion tokens.
        advantages: ``[B]``; mask: ``[B, T]`` bool or float; config: a :class:`~sgrpo_kernels.rl.LossConfig`.
        old_logp, ref_logp, token_weights, conflict_counts, rewards, group_size, sampler_logp, policy_weights,
            generator: as in
            :func:`~sgrpo_kernels.rl.policy_loss` (``vocab_size`` is taken from ``weight``).
        compute_entropy: compute token entropies (default: only when the config needs them); when computed, the
            ``entropy_mean`` metric is reported.
        backend, memory_budget, check_targets: forwarded to ``linear_logprobs`` (``check_targets`` costs one host
            sync per call; a trainer that calls several times per step on the same targets can check on the first
            call only).
        **head_options: the head options of ``linear_logprobs`` (:class:`~sgrpo_kernels.backends.HeadOptions`:
            ``temperature`` the sampling temperature, ``ignore_index``, the model's ``logit_scale`` and ``softcap``),
            forwarded as given; ``**lm_head(model).options()`` supplies a Hugging Face model's bias and head options.
            With ``config.prob_compensation`` set, the op also returns log p_max (``return_max_logprob``; free) for
            the compensation factor.
        process_group: the LM head is sharded by vocabulary over this ``torch.distributed`` group (``weight`` /
            ``bias`` are this rank's shard; ``targets`` global ids): as in ``linear_logprobs``. The loss and metrics
            are the same on every rank; ``weight`` gets this rank's shard of the gradient.
        top_k, top_p, min_p: the sampler's support, as in ``linear_logprobs`` (docs/ops.md, "Sampler support"):
            log-probs, entropies and their gradients of the distribution the sampler truly drew from (None: the
            full softmax).
        on_logp: called once with the op's log-probs ``[B, T]`` (detached; 0 where ignored) before the loss is
            formed; returns keyword arguments of this function's loss inputs (``old_logp``, ``ref_logp``,
            ``token_weights``, ``conflict_counts``, ``rewards``, ``group_size``, ``sampler_logp``,
            ``policy_weights``) that depend on them, which replace the given ones. For a trainer whose first pass is
            on-policy: the policy's log-probs before the update are this forward's own, so e.g. a sampler correction
            (TIS weights) computed from them needs no second LM-head pass.

    Returns:
        ``(loss, metrics)`` as :func:`~sgrpo_kernels.rl.policy_loss`.
    """
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig (see sgrpo_kernels.rl.preset), got {type(config).__name__}")
    hidden = check_float_tensor("hidden", hidden)
    check_rank("hidden", hidden, 3, "[B, T, D]")
    b, t, _ = hidden.shape
    targets = check_int_tensor("targets", targets)
    if tuple(targets.shape) != (b, t):
        raise ValueError(f"targets has shape {tuple(targets.shape)}, expected ({b}, {t}) (the [B, T] of hidden)")
    mask = check_mask("mask", mask, (b, t), " (the [B, T] of hidden)")
    if mask.device != hidden.device:
        raise ValueError(f"mask is on {mask.device}, expected {hidden.device} (the device of hidden)")
    inputs = dict(old_logp=old_logp, ref_logp=ref_logp, token_weights=token_weights, conflict_counts=conflict_counts,
                  sampler_logp=sampler_logp, policy_weights=policy_weights)
    advantages = check_loss_inputs(config, advantages, hidden, "hidden", **inputs, op_outputs=False)  # before the head
    need_entropy = config.needs_entropy
    if compute_entropy is None:
        compute_entropy = need_entropy
    elif not check_flag("compute_entropy", compute_entropy) and need_entropy:  # "False" would count as True
        raise ValueError(f"compute_entropy=False but config {config.name!r} needs token entropies")

    ignore_index = HeadOptions.from_kwargs("sgrpo_loss", head_options).ignore_index
    wide = targets.long()  # ignore_index in int64: in the targets' own dtype -100 would wrap (uint8: 156) or overflow
    valid = (mask != 0) & (wide != ignore_index)
    eff_targets = torch.where(valid, wide, ignore_index)
    eff_mask = valid if mask.dtype == torch.bool else torch.where(valid, mask, torch.zeros_like(mask))
    out = linear_logprobs(
        hidden,
        weight,
        eff_targets,
        bias=bias,
        return_entropy=bool(compute_entropy),
        backend=backend,
        memory_budget=memory_budget,
        check_targets=check_targets,
        process_group=process_group,
        return_max_logprob=config.needs_max_logprob,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        **head_options,
    )
    vocab = int(weight.shape[0])
    if process_group is not None:  # the global vocabulary (the adaptive entropy threshold uses ln V)
        vocab = shard_range(vocab, process_group, hidden.device)[2]
    inputs |= dict(rewards=rewards, group_size=group_size)
    if on_logp is not None:
        inputs.update(_inputs_from_logp(on_logp, out.logp.detach(), inputs))
        tensors = {k: v for k, v in inputs.items() if k not in ("rewards", "group_size")}
        check_loss_inputs(config, advantages, hidden, "hidden", **tensors, op_outputs=False)
    return checked_policy_loss(out.logp, advantages, eff_mask, config, entropy=out.entropy, vocab_size=vocab,
                               max_logprob=out.max_logprob, generator=generator, **inputs)


def _inputs_from_logp(on_logp: Callable, logp: Tensor, inputs: dict) -> Mapping[str, object]:
    got = on_logp(logp)
    if not isinstance(got, Mapping):
        raise TypeError(f"on_logp must return a mapping of loss inputs ({', '.join(inputs)}), got {type(got).__name__}")
    unknown = [k for k in got if k not in inputs]
    if unknown:
        raise TypeError(f"on_logp returned {unknown[0]!r}, not a loss input of sgrpo_loss (expected some of: "
                        f"{', '.join(inputs)})")
    return got
