"""The group-level part of a loss, computed on verl's driver where a batch's groups are whole: advantages, GTPO's
conflict weights and the completion-entropy filter, with ``sgrpo_kernels.rl`` (no second implementation), turned into
the per-token tensors the workers' loss reads.

verl keeps a prompt's completions together by ``uid`` but not in contiguous rows (its batch balancing reorders them),
so the rows are sorted into contiguous groups for the RL layer and put back afterwards. The entropy filter uses the
per-token entropy the old-policy pass stored (``entropy``): on the batch's first mini-batch of its first epoch that is
the current policy's, so the result equals the RL layer's loss-side filter; later mini-batches keep the batch's
decision (the bundled trainer re-decides per pass). What the filter removes, and the conflict weights, travel as one
``[B, T]`` weight per token; the loss then runs with ``entropy_filter=None`` (:func:`loss_side_config`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sgrpo_kernels.rl import LossConfig, completion_entropy, entropy_threshold, prepare_groups

__all__ = ["DriverSignals", "driver_signals", "group_order", "loss_side_config"]


@dataclass(frozen=True)
class DriverSignals:
    """What the driver sends to the workers, in the batch's row order.

    advantages: ``[B]``; token_weights: ``[B, T]`` conflict weight x (1 kept / 0 filtered), 0 on padding;
    conflict_counts: ``[B]`` (0 without a conflict strategy); stats: floats for the logs (advantage statistics,
    ``filtered_frac``, ``entropy_threshold``)."""

    advantages: Tensor
    token_weights: Tensor
    conflict_counts: Tensor
    stats: dict[str, float]


def loss_side_config(config: LossConfig) -> LossConfig:
    """The config the workers' loss runs with: the entropy filter was applied on the driver (a zero token weight)."""
    return dataclasses.replace(config, entropy_filter=None)


def group_order(uid: Sequence, group_size: int) -> Tensor:
    """A permutation that puts the rows of each ``uid`` next to each other (groups in order of first appearance, rows
    in batch order within a group); ValueError unless every uid has exactly ``group_size`` rows."""
    first: dict = {}
    gid = [first.setdefault(u, len(first)) for u in uid]
    counts = torch.bincount(torch.tensor(gid, dtype=torch.long), minlength=len(first)) if gid else torch.zeros(0)
    bad = [(u, int(counts[g])) for u, g in first.items() if int(counts[g]) != group_size]
    if bad:
        raise ValueError(
            f"sgrpo_kernels on verl needs every prompt (uid) to have actor_rollout_ref.rollout.n = {group_size} "
            f"completions in the batch; got {len(bad)} uid(s) with other counts, e.g. {bad[:3]} (multi-turn sessions "
            "and partially filtered groups are not supported)"
        )
    return torch.argsort(torch.tensor(gid, dtype=torch.long), stable=True)


def driver_signals(
    config: LossConfig,
    rewards: Tensor,
    responses: Tensor,
    response_mask: Tensor,
    uid: Sequence,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    vocab_size: int | None = None,
) -> DriverSignals:
    """Advantages, conflict weights and the entropy filter of a verl batch of whole groups.

    Args:
        config: the preset's LossConfig (:func:`sgrpo_kernels.integrations.verl.loss_config`).
        rewards: ``[B]`` one reward per completion (verl: the row sum of ``token_level_scores``).
        responses: ``[B, T]`` token ids; response_mask: ``[B, T]`` (non-zero = completion token).
        uid: ``B`` group ids (verl's ``uid``); group_size: completions per uid (``rollout.n``).
        entropy: ``[B, T]`` the old policy's token entropies (verl stores them in the old-log-prob pass); required
            when the config has an entropy filter.
        vocab_size: |V|, for ``entropy_filter="adaptive"`` / ``"coverage"``.
    """
    b, t = responses.shape
    if tuple(response_mask.shape) != (b, t):
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected {(b, t)} (responses)")
    if tuple(rewards.shape) != (b,):
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}, expected ({b},) (one per response)")
    if len(uid) != b:
        raise ValueError(f"uid has {len(uid)} entries, expected {b} (one per response)")
    order = group_order(uid, group_size)
    back = torch.argsort(order)
    mask = response_mask[order] != 0
    rew = rewards[order].float()
    groups = prepare_groups(config, rew, responses[order], mask, group_size)
    weights = torch.ones(b, t, dtype=torch.float32)
    if groups.token_weights is not None:
        weights = groups.token_weights.to(torch.float32)
    stats = dict(groups.stats)
    if config.entropy_filter is not None:
        if entropy is None:
            raise ValueError(
                f"entropy [B, T] (the old policy's, verl's old-log-prob pass) is required by the entropy filter "
                f"{config.entropy_filter!r} of {config.name!r}"
            )
        h_seq = completion_entropy(entropy[order].float(), mask)
        seq_valid = mask.any(dim=1)
        thr = entropy_threshold(
            config.entropy_filter, h_seq, seq_valid, rewards=rew, group_size=group_size, vocab_size=vocab_size
        )
        keep = h_seq <= thr
        weights = weights * keep.unsqueeze(1).to(weights.dtype)
        stats["filtered_frac"] = (seq_valid & ~keep).sum() / seq_valid.sum().clamp(min=1)
        stats["entropy_threshold"] = thr.float().mean()
    weights = torch.where(mask, weights, torch.zeros_like(weights))
    counts = groups.conflict_counts if groups.conflict_counts is not None else torch.zeros(b)
    floats = {k: float(v) for k, v in stats.items()}
    return DriverSignals(groups.advantages[back], weights[back], counts.to(torch.float32)[back], floats)
