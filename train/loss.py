"""The loss of one rollout batch as a function of the current weights (`loss_function`): the policy's hidden states
through the RL layer's fused op (never logits), with what does not change between passes computed once (targets,
the features' loss inputs, the reference's log-probs, this rank's loss scale) and the sampler correction of a vLLM
rollout (`sampler_correction`, TIS). The targets' range is checked by the step's first op call only: one host sync
per step."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sgrpo_kernels import sgrpo_loss
from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.rl import GroupSignals, logp_mismatch, sampler_importance_weights, truncated_importance_weights

from .batch import Batch, Update
from .distributed import Dist
from .policy import completion_targets, reference_logprobs


def rank_loss_scale(dist: Dist, loss_agg: str, completion_mask: Tensor) -> float | None:
    """The factor that turns this rank's loss into its share of the loss of the global batch (every rank's groups),
    given that DDP averages the ranks' gradients; None when the loss needs none (one process, or a mean over
    completions: the ranks hold equal numbers of completions, so the average of their means is the global mean).

    - `token-mean` (dapo, lite_ppo): the global loss is sum_r S_r / N with S_r the rank's token sum and N the global
      token count, and the rank computes S_r / n_r; so the factor is n_r * world / N (one all-reduce of the token
      count per step, shared by its passes).
    - `seq-sum-token-mean` (gtpo_official): the global loss is the sum of the ranks' sums, which the average divides
      by world; so the factor is world (no collective).

    The entropy terms are scaled with the rest: the bonus aggregates like the policy term (exact); the entropy band
    penalty is a function of the rank's mean entropy, not a sum over tokens, and stays a rank-level approximation (as
    it is for every aggregation under DDP). The TRL integration makes the same correction."""
    if not dist.enabled:
        return None
    if loss_agg == "token-mean":
        local = completion_mask.sum().to(dist.device, torch.float64)
        total = dist.sum(local)
        return float(local * dist.world / total.clamp(min=1))
    if loss_agg == "seq-sum-token-mean":
        return float(dist.world)
    return None


def ratio_stats(trainer: Tensor, sampler: Tensor, mask: Tensor) -> tuple[float | None, float | None]:
    """The importance ratio pi_trainer / pi_sampler over the sampled tokens: its mean and the fraction outside
    [0.9, 1.1] (TRL's measure of the sampler mismatch, issue 6789); (None, None) without a token."""
    ratio = (trainer.double() - sampler.double()).exp()[mask]
    if ratio.numel() == 0:
        return None, None
    return float(ratio.mean()), float(((ratio < 0.9) | (ratio > 1.1)).double().mean())


def sampler_correction(run, batch: Batch, groups: GroupSignals, trainer: Tensor | None, update: Update) -> dict:
    """The groups' loss keyword arguments, with the sampler/trainer mismatch of a vLLM rollout measured
    (`update.rollout_logp_diff`) and, with `tis_cap`, corrected: each token's loss weighted by the truncated
    importance ratio min(pi_trainer / pi_sampler, tis_cap) (TIS; `tis_mode` and `tis_min` choose TRL's other levels
    and kinds); the loss's off-policy sequence mask, when set, gets the sampler's log-probs. `trainer`: the log-probs
    [N, T] of the policy before this batch's update (the PPO epochs' old log-probs, else the first pass's own, from its
    hidden states); None when the rollout has no sampler log-probs (HF generate samples from the trainer's own
    forward)."""
    kwargs = groups.loss_kwargs()
    if batch.sampler_logp is None:
        return kwargs
    sampler = batch.sampler_logp.to(trainer.device)
    update.rollout_logp_diff = float(logp_mismatch(trainer, sampler, batch.completion_mask))
    update.rollout_ratio_mean, update.rollout_ratio_outside = ratio_stats(trainer, sampler, batch.completion_mask)
    if run.loss_cfg.off_policy_mask_threshold is not None:
        kwargs["sampler_logp"] = sampler
    if run.tis_cap:
        if run.tis_mode == "token_truncate" and not run.tis_min:  # TIS, as the committed runs computed it
            w = truncated_importance_weights(trainer, sampler, batch.completion_mask, run.tis_cap)
        else:
            w = sampler_importance_weights(trainer, sampler, batch.completion_mask, run.tis_mode, clip_max=run.tis_cap,
                                           clip_min=run.tis_min or None)  # fmt: skip
        tw = kwargs["token_weights"]
        if run.loss_cfg.conflict_count_norm and kwargs["conflict_counts"] is None:  # counted from the conflict
            ones = torch.ones_like(w) if tw is None else tw.detach()  # weights alone (!= 1), before TIS joins them
            kwargs["conflict_counts"] = (batch.completion_mask & (ones != 1)).sum(dim=1)
        kwargs["token_weights"] = w if tw is None else tw * w
    return kwargs


def loss_function(run, batch: Batch, groups: GroupSignals, check: Callable[[], bool | None], update: Update):
    """The batch's loss as a function of the current weights, `forward_loss(check_targets) -> (loss, metrics)`. What
    does not change between passes is computed here once: the targets, the features' loss inputs (old-policy
    log-probs), the reference's log-probs (KL presets) and this rank's loss scale; the sampler correction of a vLLM
    rollout is computed once too, by the first pass, from the policy's log-probs before the update (the PPO epochs'
    old log-probs, else the first pass's own, handed over by the loss's op call: no extra forward, no second LM
    head)."""
    targets = completion_targets(batch)
    support = run.sampling.support()  # the sampler's top_k / top_p / min_p: log-probs of what it sampled from
    inputs = run.features.loss_inputs(batch, check)  # e.g. old_logp of the behaviour policy (PPO epochs)
    if run.loss_cfg.needs_ref:  # the frozen reference, or with LoRA the policy with its adapters disabled
        g = run.sampling.group_size
        inputs["ref_logp"] = reference_logprobs(
            run.model, run.ref_model, batch, run.sampling.temperature, run.backend, g, check(), support
        )
    scale = rank_loss_scale(run.dist, run.loss_cfg.loss_agg, batch.completion_mask)
    # the policy before the update, when something needs it: PPO epochs' old log-probs, else the first pass's own
    update.old_logp = inputs.get("old_logp")
    wants_old = run.features.wants_old_logp or batch.sampler_logp is not None
    group_kwargs: dict | None = None  # the first pass fills it in

    def forward_loss(check_targets: bool | None) -> tuple[Tensor, dict[str, Tensor]]:
        nonlocal group_kwargs
        # [N, T, D]: the policy forward never makes logits (run.policy: DDP-wrapped under torchrun)
        hidden = run.policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)

        def first_pass(logp: Tensor) -> dict:  # the policy before the update: this pass's own log-probs (no 2nd head)
            nonlocal group_kwargs
            if wants_old and update.old_logp is None:
                update.old_logp = logp
            group_kwargs = sampler_correction(run, batch, groups, update.old_logp, update)
            return group_kwargs

        head = lm_head(run.model)
        loss, metrics = sgrpo_loss(
            hidden,
            head.weight,
            targets,
            groups.advantages,
            batch.completion_mask,
            run.loss_cfg,
            temperature=run.sampling.temperature,
            **inputs,
            **(group_kwargs or {}),  # token_weights (x the TIS weights), conflict_counts, rewards, group_size
            on_logp=first_pass if group_kwargs is None else None,  # the first pass computes them from its log-probs
            compute_entropy=True,
            backend=run.backend,
            check_targets=check_targets,
            **head.options(),  # bias, logit scale, softcap of this model's head
            **support,
        )
        if scale is not None:  # this rank's share of the global batch's loss (the record logs the global loss)
            loss = loss * scale
            metrics = {**metrics, "loss": metrics["loss"] * scale}
        return loss, metrics

    return forward_loss
