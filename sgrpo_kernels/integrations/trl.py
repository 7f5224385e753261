"""S-GRPO, GTPO and the other presets inside Hugging Face TRL's `GRPOTrainer` (TRL >= 1.15, < 2).

Switch a TRL script over in five lines::

    from sgrpo_kernels.integrations.trl import SGRPOConfig, SGRPOTrainer

    args = SGRPOConfig(output_dir="out", sgrpo_preset="s_grpo", sgrpo_loss="entropy_filter=quantile:0.75", ...)
    trainer = SGRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=args, train_dataset=ds)
    trainer.train()

What changes against `GRPOTrainer` (README, "Use with TRL"):
- Advantages, and GTPO's conflict weights, come from the preset, computed where the groups are still whole: right
  after TRL scored the completions, on the whole generation batch gathered from every process, before TRL shuffles
  and splits it. Each process keeps its slice, and its rows travel with TRL's shuffle.
- The loss is `sgrpo_loss` on the policy's final hidden states: the model runs through the wrapped (DDP / accelerate)
  module with `logits_to_keep=1`, so no [B, T, V] logits are made and gradient synchronization happens as usual; the
  LM head's log-probs and entropies come from the fused op, which skips rows with zero gradient.
- Each micro-batch's loss is scaled so that, once the micro-batches are summed and DDP averages the processes, the
  update is the one of a single process on the whole batch: 1 / accumulation steps for per-completion means, the
  micro-batch's share of the batch's tokens for token-mean (TRL's `dapo` normalizer), the process count for
  seq-sum-token-mean.
- TRL's own sampling, rewards, reference model (`beta`), old log-probs (`num_iterations > 1`), gradient accumulation,
  PEFT and logging stay as they are; the RL layer's metrics are added to TRL's logs under `sgrpo/`.
- TRL's sampler-mismatch correction (`vllm_importance_sampling_correction` / `_mode` / `_clip_max` / `_clip_min`) and
  off-policy sequence mask (`off_policy_mask_threshold`) are read from TRL's own fields and computed by the RL layer
  (`sampler_importance_weights`, `off_policy_sequence_mask`).
- `trust_region=delta` caps each optimizer step: ||theta - theta_old|| <= delta over every trained weight
  (`sgrpo_kernels.rl.TrustRegion` on the optimizer; FSDP2 shards are measured as one model), logged as
  `trust_region/step_norm` (before), `trust_region/step_norm_after` and `trust_region/projected` (fraction of steps).
  With `sgrpo_preset=None` the loss and advantages are TRL's own (`loss_type`): the cap on plain GRPO.
- TRL's sampler settings `top_k`, `top_p`, `min_p` (or their `generation_kwargs` overrides) give the sampler's
  support to the loss's log-probs and to TRL's old and reference log-probs (and to TRL's own loss with
  `sgrpo_preset=None`): those of the truncated, renormalized distribution the completions were drawn from
  (`trl_support`). With none of them set every call is TRL's and the loss's as without.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.integrations.trl_config import check_trl_is_fields, loss_config
from sgrpo_kernels.integrations.trl_support import check_backend, final_hidden, sampler_support, support_logps
from sgrpo_kernels.rl import (
    TrustRegion,
    prepare_groups,
    sampler_importance_weights,
    sgrpo_loss,
)
from sgrpo_kernels.rl.trust_region import check_max_norm

__all__ = ["SGRPOConfig", "SGRPOTrainer", "loss_config"]

_UNSUPPORTED_INPUTS = (
    "pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "num_tiles", "image_sizes",
    "token_type_ids", "mm_token_type_ids", "image_position_ids", "num_images",
)  # fmt: skip


@dataclass
class SGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the algorithm: an sgrpo_kernels preset and its LossConfig overrides, and the trust region.
    TRL's own loss fields (`loss_type`, `epsilon`, `scale_rewards`, `top_entropy_quantile`, `use_bias_correction_kl`)
    are not used for the loss unless `sgrpo_preset=None`, and those that would change TRL's objective from its default
    (`entropy_coef`, `delta`, ...: trl_config.IGNORED_UNDER_A_PRESET) are refused under a preset; `beta` must equal
    the loss's (the preset's, or `sgrpo_loss="beta=..."`: TRL computes the reference log-probs only when beta != 0);
    `max_completion_length` is the Dr. GRPO normalizer."""

    sgrpo_preset: str | None = field(
        default="s_grpo",
        metadata={"help": "sgrpo_kernels.rl preset (s_grpo, gtpo, grpo, cispo, dppo_tv, ...); None (on a command "
                          "line: None or none): TRL's own loss"},
    )
    sgrpo_loss: str = field(default="", metadata={"help": 'LossConfig overrides on the preset, "field=value,..."'})
    trust_region: float | None = field(
        default=None,
        metadata={"help": "cap on each optimizer step, ||theta - theta_old|| <= trust_region (inf: only measure); "
                  "None: off"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sgrpo_preset, str) and self.sgrpo_preset.strip().lower() == "none":
            self.sgrpo_preset = None  # `--sgrpo_preset None` on a command line: the parser passes the text
        if self.trust_region is not None:
            try:
                check_max_norm(self.trust_region, "trust_region")
            except (TypeError, ValueError) as exc:
                raise ValueError(f"SGRPOConfig(trust_region={self.trust_region!r}): {exc}") from None
        check_trl_is_fields(self)
        sampler_support(self)  # a bad top_k / top_p / min_p is refused here
        loss_config(self)  # a bad preset or override is refused here, not when the trainer is built


def _relog_advantages(logged, advantages: Tensor) -> None:
    """Put the preset's advantages (every process's, in TRL's order) where TRL just logged its own for the completions
    table (`log_completions`, the dashboards), so that the table shows those the loss uses."""
    if logged is None:
        return
    for _ in range(min(advantages.numel(), len(logged))):
        logged.pop()
    logged.extend(advantages.tolist())


class SGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with sgrpo_kernels' advantages, conflict weights and fused loss (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SGRPOConfig):
            raise TypeError(f"SGRPOTrainer needs an SGRPOConfig as args, got {type(self.args).__name__}")
        self.sgrpo_config = loss_config(self.args)
        self.sgrpo_support = sampler_support(self.args)  # {} with TRL's defaults: every call as without
        check_backend(self.sgrpo_support, self.accelerator.device)
        self._sgrpo_rewards_per_func: Tensor | None = None
        self._aux_loss = bool(getattr(self, "aux_loss_enabled", False))  # TRL's: an MoE whose router loss it adds
        self._sgrpo_all_filtered = 0
        self.trust_region: TrustRegion | None = None
        if self.args.trust_region is not None and self.is_deepspeed_enabled:
            raise NotImplementedError("SGRPOConfig(trust_region=...) with DeepSpeed: its optimizer steps on flat "
                                      "partitions the cap cannot see yet; use DDP or FSDP2 (fsdp_version 2)")
        if self.args.trust_region is not None and self.is_fsdp_enabled and _fsdp_version(self.accelerator) != 2:
            raise NotImplementedError("SGRPOConfig(trust_region=...) with FSDP1: use FSDP2 (fsdp_version 2), whose "
                                      "DTensor shards the cap measures as one model")

    # ------------------------------------------------------------------------------------------ the trust region

    def create_optimizer(self, *args, **kwargs):
        opt = super().create_optimizer(*args, **kwargs)
        if self.args.trust_region is not None and self.trust_region is None:
            self.trust_region = TrustRegion(self.optimizer, self.args.trust_region)
            self.optimizer.register_step_post_hook(self._log_trust_region)  # after the projection's own hook
        return opt

    def _log_trust_region(self, *_) -> None:
        last = self.trust_region.last
        metrics = self._metrics["train"]
        metrics["trust_region/step_norm"].append(last.norm)
        metrics["trust_region/step_norm_after"].append(last.norm_after)
        metrics["trust_region/projected"].append(float(last.projected))

    # ------------------------------------------------------------------------------------------ advantages, groups

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._sgrpo_rewards_per_func = out  # [global N, reward funcs], gathered from every process
        return out

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.sgrpo_config is None:  # TRL's own advantages
            return output
        per_func = self._sgrpo_rewards_per_func
        self._sgrpo_rewards_per_func = None
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan  # unscorable: left out of the group statistics
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        ids, mask = output["completion_ids"], output["completion_mask"]
        all_ids, all_mask = self._gather_rows(ids, mask)
        groups = prepare_groups(self.sgrpo_config, rewards, all_ids, all_mask, group)
        n, t = ids.shape
        rows = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
        output["advantages"] = groups.advantages[rows].to(output["advantages"].dtype)
        _relog_advantages(getattr(self, "_logs", {}).get("advantages"), groups.advantages)
        if groups.token_weights is not None:
            output["sgrpo_token_weights"] = groups.token_weights[rows, :t]
            output["sgrpo_conflict_counts"] = groups.conflict_counts[rows]
        zero_var = groups.stats.get("zero_variance_frac") if groups.stats else None
        if zero_var is not None:
            self._metrics[mode]["sgrpo/zero_variance_frac"].append(float(zero_var))
        return output

    def _gather_rows(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Every process's completion ids and masks, right-padded to the longest, in process order (the order of
        TRL's gathered rewards)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return ids, mask.bool()
        ids = acc.pad_across_processes(ids, dim=1, pad_index=0)  # (padding is masked out)
        mask = acc.pad_across_processes(mask, dim=1, pad_index=0)
        return acc.gather(ids), acc.gather(mask).bool()

    # ---------------------------------------------------------------------------- TRL's log-probs, over the support

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):  # fmt: skip
        """TRL's old and reference log-probs (and its own loss's, with sgrpo_preset=None): over the sampler's support
        when top_k / top_p / min_p truncate, else TRL's own computation."""
        support = getattr(self, "sgrpo_support", None)
        if not support:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal,
            )  # fmt: skip
        extra = sorted(k for k, v in multimodal.items() if v is not None)
        if extra:
            raise NotImplementedError(f"SGRPOTrainer: multimodal inputs ({', '.join(extra)}) with the sampler's "
                                      "support (top_k / top_p / min_p) are not supported yet")  # fmt: skip
        if compute_aux_loss:
            raise NotImplementedError("SGRPOTrainer: the MoE router loss (output_router_logits) with the sampler's "
                                      "support (top_k / top_p / min_p) is not supported yet")  # fmt: skip
        logps, entropies = support_logps(model, input_ids, attention_mask, logits_to_keep, support=support,
                                         temperature=self.temperature, autocast=self.accelerator.autocast,
                                         batch_size=batch_size, compute_entropy=compute_entropy)  # fmt: skip
        return logps, entropies, None

    # ------------------------------------------------------------------------------------------------- the loss

    def _compute_loss(self, model, inputs):
        if self.sgrpo_config is None:  # TRL's own loss
            return super()._compute_loss(model, inputs)
        extra = [k for k in _UNSUPPORTED_INPUTS if inputs.get(k) is not None]
        if extra:
            raise NotImplementedError(f"SGRPOTrainer: multimodal inputs are not supported yet ({', '.join(extra)})")
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        t = ids.size(1)
        with self.accelerator.autocast():  # through the wrapped model: DDP / FSDP synchronize as in TRL
            input_ids = torch.cat([prompt_ids, ids], dim=1)
            out = model(
                input_ids=input_ids,
                attention_mask=torch.cat([prompt_mask, inputs["completion_mask"]], dim=1),
                output_hidden_states=True,
                logits_to_keep=1,  # the [B, T, V] logits are never made
                use_cache=False,
                **({"output_router_logits": True} if self._aux_loss else {}),  # an MoE's load-balancing loss
            )
        head = lm_head(model)
        hidden = final_hidden(out, model, input_ids, t, head.weight.dtype)  # (B, T, D): predicting each token
        cfg = self.sgrpo_config
        old, sampled = inputs.get("old_per_token_logps"), inputs.get("sampling_per_token_logps")
        is_w = None  # TRL's sampler correction: on the policy term alone (the KL term, beta, is added after it)
        if self.use_vllm and self.vllm_importance_sampling_correction and old is not None and sampled is not None:
            is_w = sampler_importance_weights(old, sampled, mask, self.vllm_importance_sampling_mode,
                                              clip_max=self.vllm_importance_sampling_clip_max,
                                              clip_min=self.vllm_importance_sampling_clip_min)  # fmt: skip
        loss, metrics = sgrpo_loss(
            hidden,
            head.weight,
            ids,
            inputs["advantages"],
            mask,
            cfg,
            temperature=self.temperature,
            **head.options(),  # bias, logit scale, softcap: applied in the model's order, before the temperature
            old_logp=inputs.get("old_per_token_logps"),
            ref_logp=inputs.get("ref_per_token_logps") if cfg.needs_ref else None,
            token_weights=inputs.get("sgrpo_token_weights"),
            policy_weights=is_w,
            conflict_counts=inputs.get("sgrpo_conflict_counts"),
            sampler_logp=sampled if sampled is not None else old,  # TRL's off-policy mask reads the sampler's
            compute_entropy=True,
            **self.sgrpo_support,  # top_k / top_p / min_p when they truncate: the log-probs of the sampled support
        )
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            loss = loss * self._window_scale(mask, inputs.get("num_items_in_batch"))
        if self._aux_loss:  # TRL's term and scaling: coef x the router loss / accumulation steps
            loss = loss + self.router_aux_loss_coef * out.aux_loss / (
                self.current_gradient_accumulation_steps if mode == "train" else 1.0
            )
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(out.aux_loss).mean().item())
        self._log_sgrpo(mode, metrics)
        return loss

    def _window_scale(self, mask: Tensor, num_items: Tensor | None) -> Tensor | float:
        """The factor that makes this micro-batch's loss its share of the loss of the optimizer step's whole batch
        (every micro-batch on every process), given that the backward sums the micro-batches and DDP averages the
        processes. The micro-batches hold equal numbers of completions (TRL splits evenly), so a mean over completions
        needs 1 / accumulation steps; a token mean needs the tokens of the whole batch, a sum over completions the
        process count. The entropy band penalty (a function of the micro-batch's mean entropy, not a sum over its
        tokens) is scaled with the rest."""
        agg, steps = self.sgrpo_config.loss_agg, self.current_gradient_accumulation_steps
        procs = self.accelerator.num_processes
        if agg == "token-mean" and num_items is not None:
            # num_items_in_batch: loss-mask tokens of the generation batch on every process, which spans
            # steps_per_generation micro-batches (TRL's dapo normalizer)
            batch_tokens = num_items.clamp(min=1) * steps / self.args.steps_per_generation
            return mask.sum() * procs / batch_tokens
        if agg in ("seq-sum-token-mean", "token-sum"):
            return float(procs)
        return 1.0 / steps

    def _log_sgrpo(self, mode: str, metrics: dict[str, Tensor]) -> None:
        names = {"entropy": "entropy_mean", "sgrpo/masked_frac": "zero_weight_frac", "sgrpo/filtered_frac":
                 "filtered_frac", "clip_ratio/low_mean": "clip_frac_low", "clip_ratio/high_mean": "clip_frac_high",
                 "sgrpo/policy_loss": "pg_loss", "kl": "kl"}  # fmt: skip
        keys = [k for k, m in names.items() if m in metrics and (k != "kl" or self.sgrpo_config.needs_ref)]
        values = torch.stack([metrics[names[k]].detach().float() for k in keys])
        values = self.accelerator.gather(values.unsqueeze(0)).nanmean(dim=0).tolist()
        for k, v in zip(keys, values):
            self._metrics[mode][k].append(v)
        if "sgrpo/filtered_frac" in keys and values[keys.index("sgrpo/filtered_frac")] >= 1.0:
            self._sgrpo_all_filtered += 1
            if self._sgrpo_all_filtered in (1, 10, 100):
                warnings.warn(
                    f"SGRPOTrainer: the entropy filter ({self.sgrpo_config.entropy_filter!r}) removed every completion "
                    f"of the batch ({self._sgrpo_all_filtered} time(s) so far): the loss has no policy gradient. On a "
                    "fresh model the ln 2 filter removes nearly all of them; try sgrpo_loss='entropy_filter="
                    "quantile:0.75'",
                    stacklevel=2,
                )


def _fsdp_version(accelerator) -> int:
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return int(getattr(plugin, "fsdp_version", 1) or 1) if plugin is not None else 1
