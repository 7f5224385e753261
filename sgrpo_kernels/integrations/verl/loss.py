"""The workers' side: the engine-level loss (verl's ``ppo_loss`` contract) that runs ``sgrpo_kernels.rl.policy_loss``
on each micro-batch, and the policy-loss names registered in verl's registry.

The engine-level loss gets the current policy's per-token log-probs *and* entropies (both differentiable), the old
log-probs, and the driver's per-token advantages, weights and conflict counts (:mod:`.signals`). The loss of a
micro-batch is ``policy_loss`` on it, scaled to its share of the mini-batch across data-parallel ranks, as verl's
``agg_loss`` normalizes (the engine sums micro-batches and FSDP averages ranks):

- ``token-mean``: x (micro-batch tokens x dp / mini-batch tokens); ``seq-mean-*``: x (micro-batch completions x dp /
  mini-batch completions); ``seq-sum-token-mean`` and ``token-sum``: x dp. The policy term and the entropy bonus are
  then exactly the RL layer's on the whole mini-batch, however verl splits it into micro-batches and ranks.
- The entropy floor / ceiling (``max(0, H_min - Hbar)``) is a function of the micro-batch's mean entropy, not a sum
  over tokens: it is computed per micro-batch and scaled like the rest, the same approximation the bundled trainer and
  the TRL integration make under DDP / gradient accumulation (exact when a micro-batch is the mini-batch).

The registered policy-loss functions only run when verl's own ``ppo_loss`` is in place, i.e. the ``sgrpo`` trainer
did not install this loss: they raise with what to set, so a half-configured job fails on its first update instead of
training something else."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from sgrpo_kernels.rl import LossConfig, metrics_to_floats, policy_loss

__all__ = ["TOKEN_FIELDS", "make_loss_fn", "missing_trainer_loss", "sgrpo_ppo_loss"]

# per-token fields the driver adds to the batch (nested like verl's `advantages`)
TOKEN_FIELDS = ("sgrpo_token_weights", "sgrpo_conflict_counts")


def _first_valid(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T] -> [B]: the value at each row's first valid token (the driver broadcasts per-completion values)."""
    return x.gather(1, mask.to(torch.int8).argmax(dim=1, keepdim=True)).squeeze(1)


def _meta(data, key: str):
    """A number the engine put in the micro-batch (None when absent: a forward-only call, a hand-built batch)."""
    try:
        return data[key] if key in data.keys() else None
    except (KeyError, TypeError):
        return None


def _share(config: LossConfig, mask: Tensor, data) -> Tensor | float:
    """This micro-batch's share of the mini-batch loss (module docstring); 1 outside a training step."""
    dp, n_tokens, n_seqs = (_meta(data, k) for k in ("dp_size", "batch_num_tokens", "global_batch_size"))
    dp = dp or 1
    agg = config.loss_agg
    if agg in ("seq-sum-token-mean", "token-sum"):  # sums: DDP / FSDP average the ranks
        return float(dp)
    if agg == "token-mean":
        return mask.sum() * dp / n_tokens if n_tokens else 1.0
    if not n_seqs:
        return 1.0
    rows = mask.shape[0] if agg == "seq-mean-token-sum-norm" else (mask.sum(dim=1) > 0).sum()
    return rows * dp / n_seqs


def sgrpo_ppo_loss(model_output, data, dp_group=None, *, loss_config: LossConfig, trust_region: float | None = None):
    """verl's engine-level loss for an sgrpo_kernels preset: ``loss_fn(model_output=, data=, dp_group=)`` ->
    ``(loss, metrics)``. ``loss_config`` is the loss-side config (entropy filter applied on the driver);
    ``trust_region`` caps the actor's optimizer steps from then on (:mod:`.trust_region`), and the metrics report the
    previous step's norm before and after the projection."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    from sgrpo_kernels.integrations.verl.trust_region import install_trust_region, last_step

    if trust_region is not None:
        install_trust_region(trust_region)

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    elif loss_config.needs_entropy:
        raise ValueError(
            f"sgrpo_kernels loss {loss_config.name!r} needs the current policy's entropy: the micro-batch has none "
            "(calculate_entropy is off; the sgrpo trainer turns it on, a hand-built batch must set it)"
        )
    fields = ["response_mask", "old_log_probs", "advantages", *TOKEN_FIELDS]
    fields += [k for k in ("rollout_is_weights", "ref_log_prob") if k in data.keys()]
    missing = [k for k in TOKEN_FIELDS if k not in data.keys()]
    if missing:
        raise ValueError(
            f"sgrpo_kernels loss {loss_config.name!r}: the batch has no {missing}: the driver computes them (run "
            "with trainer.v1.trainer_mode=sgrpo)"
        )
    td = data.select(*fields).to_padded_tensor()
    mask = td["response_mask"].to(torch.bool)
    share = _share(loss_config, mask, data)
    # verl's rollout correction: per-token importance weights >= 0, on the policy term alone (as verl's own loss: its
    # KL loss is not weighted)
    is_w = td["rollout_is_weights"].to(log_prob.dtype) if "rollout_is_weights" in td.keys() else None
    loss, metrics = policy_loss(
        log_prob,
        _first_valid(td["advantages"], mask),
        mask,
        loss_config,
        entropy=entropy,
        old_logp=td["old_log_probs"],
        ref_logp=td["ref_log_prob"] if loss_config.needs_ref else None,
        token_weights=td["sgrpo_token_weights"].to(log_prob.dtype),
        policy_weights=is_w,
        conflict_counts=_first_valid(td["sgrpo_conflict_counts"], mask),
    )
    loss = loss * share
    share_t = torch.as_tensor(share, device=loss.device)
    floats = metrics_to_floats({**{k: metrics[k] for k in _LOGGED}, "share": share_t})
    share = floats.pop("share")
    out = {f"actor/sgrpo/{k}": v for k, v in floats.items() if k not in ("loss", "pg_loss")}
    out["actor/pg_clipfrac"] = floats["clip_frac_high"]
    out["actor/pg_clipfrac_lower"] = floats["clip_frac_low"]
    if trust_region is not None and last_step() is not None:
        out["actor/sgrpo/trust_region_step_norm"] = last_step().norm
        out["actor/sgrpo/trust_region_step_norm_after"] = last_step().norm_after
    out = Metric.from_dict(out, aggregation=AggregationType.MEAN)
    # scaled like verl's: summed over micro-batches (and averaged over ranks) they give the mini-batch's value
    out["actor/pg_loss"] = Metric(value=floats["pg_loss"] * share, aggregation=AggregationType.SUM)
    out["actor/sgrpo/loss"] = Metric(value=floats["loss"] * share, aggregation=AggregationType.SUM)
    return loss, out


_LOGGED = ("loss", "pg_loss", "entropy_loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "entropy_mean",
           "zero_weight_frac", "adv_mean")  # fmt: skip


def make_loss_fn(loss_config: LossConfig, trust_region: float | None = None):
    """The picklable engine-level loss the driver sends to the actor workers (``set_loss_fn``), with the actor's trust
    region (``policy_loss.trust_region``) when set."""
    return partial(sgrpo_ppo_loss, loss_config=loss_config, trust_region=trust_region)


def missing_trainer_loss(name: str):
    """The function registered under `name` in verl's policy-loss registry (module docstring)."""

    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):  # fmt: skip
        raise RuntimeError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={name!r} is an sgrpo_kernels loss: it needs the sgrpo "
            "trainer, which computes the group signals on the driver and installs the loss on the workers. Add "
            "trainer.v1.trainer_mode=sgrpo (docs/verl.md); verl's own ppo_loss was called instead"
        )

    loss.__name__ = f"sgrpo_{name}_needs_trainer"
    return loss
