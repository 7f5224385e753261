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

import dataclasses
import math
import re
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.integrations.trl_support import check_backend, sampler_support, support_logps
from sgrpo_kernels.rl import (
    LossConfig,
    TrustRegion,
    parse_overrides,
    prepare_groups,
    preset,
    preset_with,
    sampler_importance_weights,
    sgrpo_loss,
)
from sgrpo_kernels.rl.sampler_is import check_is_bounds
from sgrpo_kernels.rl.trust_region import check_max_norm

__all__ = ["SGRPOConfig", "SGRPOTrainer", "loss_config"]

_UNSUPPORTED_INPUTS = (
    "pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "num_tiles", "image_sizes",
    "token_type_ids", "mm_token_type_ids", "image_position_ids", "num_images",
)  # fmt: skip


TRL_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL 1.16's


@dataclass
class SGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the algorithm: an sgrpo_kernels preset and its LossConfig overrides, and the trust region.
    TRL's own loss fields (`loss_type`, `epsilon`, `scale_rewards`, `top_entropy_quantile`, ...) are not used for the
    loss unless `sgrpo_preset=None`; `beta` must equal the loss's (the preset's, or `sgrpo_loss="beta=..."`: TRL
    computes the reference log-probs only when beta != 0); `max_completion_length` is the Dr. GRPO normalizer."""

    sgrpo_preset: str | None = field(
        default="s_grpo",
        metadata={"help": "sgrpo_kernels.rl preset (s_grpo, gtpo, grpo, cispo, dppo_tv, ...); None: TRL's own loss"},
    )
    sgrpo_loss: str = field(default="", metadata={"help": 'LossConfig overrides on the preset, "field=value,..."'})
    trust_region: float | None = field(
        default=None,
        metadata={"help": "cap on each optimizer step, ||theta - theta_old|| <= trust_region (inf: only measure); "
                  "None: off"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trust_region is not None:
            try:
                check_max_norm(self.trust_region, "trust_region")
            except (TypeError, ValueError) as exc:
                raise ValueError(f"SGRPOConfig(trust_region={self.trust_region!r}): {exc}") from None
        _check_trl_is_fields(self)
        sampler_support(self)  # a bad top_k / top_p / min_p is refused here
        loss_config(self)  # a bad preset or override is refused here, not when the trainer is built


def _check_trl_is_fields(args: SGRPOConfig) -> None:
    """TRL's sampler-mismatch fields, refused by name when they make no sense (TRL itself checks some of them only
    at the first generation)."""
    mode = args.vllm_importance_sampling_mode
    if mode not in TRL_IS_MODES:
        raise ValueError(f"SGRPOConfig(vllm_importance_sampling_mode={mode!r}): expected one of {TRL_IS_MODES}")
    try:
        check_is_bounds(mode, args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min,
                        where="vllm_importance_sampling_")  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SGRPOConfig: {exc}") from None
    thr = args.off_policy_mask_threshold
    if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float)) or not math.isfinite(thr)
                            or thr < 0):  # fmt: skip
        raise ValueError(f"SGRPOConfig(off_policy_mask_threshold={thr!r}): expected None or a finite number >= 0 "
                         "(the mean log-prob drift, in nats, above which a negative-advantage completion is dropped)")


def _bounds(base: LossConfig, name: str) -> str | None:
    """What a numeric LossConfig field accepts, in LossConfig's own words ("a finite number >= 0.0 and < 1.0"), found
    by building it with a huge negative and a huge positive value; None when the field takes no number."""
    found = []
    for probe in (-1e300, 1e300):
        try:
            dataclasses.replace(base, **{name: probe})
        except TypeError:
            return None  # not a number field
        except ValueError as exc:
            found += re.findall(rf"LossConfig\.{re.escape(name)} must be ([<>]=? [^,\s]+), got", str(exc))
    return "a finite number" + (" " + " and ".join(found) if found else "")


def _refusal(args: SGRPOConfig, exc: Exception) -> str:
    """`exc` of building the LossConfig, said with the SGRPOConfig field, the value given and what is accepted."""
    where = f"SGRPOConfig(sgrpo_preset={args.sgrpo_preset!r}, sgrpo_loss={args.sgrpo_loss!r})"
    named = re.match(r"LossConfig\.(\w+) must be", str(exc))
    try:
        given = parse_overrides(args.sgrpo_loss)
        base = preset(args.sgrpo_preset)
    except (TypeError, ValueError):
        return f"{where}: {exc}"
    if named is None or named.group(1) not in given:
        return f"{where}: {exc}"
    name = named.group(1)
    expected = _bounds(base, name)
    if expected is None:
        return f"{where}: sgrpo_loss {name}={given[name]!r} refused: {exc}"
    return f"{where}: sgrpo_loss {name}={given[name]!r} refused: expected {expected}"


def loss_config(args: SGRPOConfig) -> LossConfig | None:
    """The LossConfig an SGRPOConfig asks for (None: TRL's own loss); a clear error for what TRL cannot serve."""
    if not isinstance(args.sgrpo_loss, str):
        raise ValueError(f"SGRPOConfig(sgrpo_loss={args.sgrpo_loss!r}): expected a string of LossConfig overrides "
                         "'field=value,...' ('' for the preset as it is)")
    if args.sgrpo_preset is None:
        if args.sgrpo_loss:
            raise ValueError(f"SGRPOConfig(sgrpo_preset=None, sgrpo_loss={args.sgrpo_loss!r}): overrides need a "
                             "preset; set sgrpo_preset (e.g. 's_grpo') or sgrpo_loss=''")
        return None
    try:
        cfg = preset_with(args.sgrpo_preset, args.sgrpo_loss)
    except (TypeError, ValueError) as exc:
        raise ValueError(_refusal(args, exc)) from None
    if cfg.entropy_filter in ("adaptive", "coverage"):  # per-group thresholds from the group's rewards
        raise ValueError(
            f"SGRPOConfig: entropy_filter={cfg.entropy_filter!r} needs each training micro-batch to hold whole groups "
            f"with their rewards; TRL shuffles and splits the groups. Use entropy_filter='ln2', a number or "
            f"'quantile:q' (preset {cfg.name!r})"
        )
    _check_beta(args, cfg)
    cfg = _with_completion_length(args, cfg)
    thr = args.off_policy_mask_threshold
    if thr is not None:
        if cfg.off_policy_mask_threshold is not None and cfg.off_policy_mask_threshold != thr:
            raise ValueError(
                f"SGRPOConfig: off_policy_mask_threshold={thr!r} and sgrpo_loss off_policy_mask_threshold="
                f"{cfg.off_policy_mask_threshold!r} differ; set one of them"
            )
        cfg = dataclasses.replace(cfg, off_policy_mask_threshold=float(thr))
    return cfg


def _check_beta(args: SGRPOConfig, cfg: LossConfig) -> None:
    """TRL's `beta` (the KL coefficient; TRL loads the reference model only when it is != 0) must be the loss's."""
    if args.beta == cfg.beta:
        return
    if "beta" in parse_overrides(args.sgrpo_loss):
        raise ValueError(f"SGRPOConfig: beta={args.beta!r} and sgrpo_loss beta={cfg.beta!r} differ; set both to the "
                         "KL coefficient you want")
    mine = ",".join(filter(None, (args.sgrpo_loss.strip(), f"beta={args.beta!r}")))
    raise ValueError(
        f"SGRPOConfig: beta={args.beta!r} (TRL's KL coefficient) differs from the preset {cfg.name!r}, beta="
        f"{cfg.beta!r}; to use yours, set sgrpo_loss={mine!r} too; for the preset's, set beta={cfg.beta!r} (TRL loads "
        "the reference model and computes its log-probs only when beta != 0)"
    )


def _with_completion_length(args: SGRPOConfig, cfg: LossConfig) -> LossConfig:
    """loss_agg='seq-mean-token-sum-norm' (dr_grpo) divides by B x max_completion_length, as TRL's loss_type='dr_grpo':
    TRL's `max_completion_length`, not each micro-batch's padded length."""
    mcl = args.max_completion_length
    if cfg.loss_agg != "seq-mean-token-sum-norm" or mcl is None or cfg.max_completion_length == mcl:
        return cfg
    if cfg.max_completion_length is not None:
        raise ValueError(
            f"SGRPOConfig: max_completion_length={mcl!r} and sgrpo_loss max_completion_length="
            f"{cfg.max_completion_length!r} differ (loss_agg='seq-mean-token-sum-norm' divides by it); set one of them"
        )
    try:
        return dataclasses.replace(cfg, max_completion_length=mcl)
    except (TypeError, ValueError):
        raise ValueError(f"SGRPOConfig(max_completion_length={mcl!r}): expected an int >= 1") from None


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
            out = model(
                input_ids=torch.cat([prompt_ids, ids], dim=1),
                attention_mask=torch.cat([prompt_mask, inputs["completion_mask"]], dim=1),
                output_hidden_states=True,
                logits_to_keep=1,  # the [B, T, V] logits are never made
                use_cache=False,
            )
        hidden = out.hidden_states[-1][:, -t - 1 : -1]  # final (normed) hidden states predicting each completion token
        head = lm_head(model)
        if hidden.dtype != head.weight.dtype:
            hidden = hidden.to(head.weight.dtype)
        cfg = self.sgrpo_config
        weights = inputs.get("sgrpo_token_weights")
        old, sampled = inputs.get("old_per_token_logps"), inputs.get("sampling_per_token_logps")
        if self.use_vllm and self.vllm_importance_sampling_correction and old is not None and sampled is not None:
            is_w = sampler_importance_weights(old, sampled, mask, self.vllm_importance_sampling_mode,
                                              clip_max=self.vllm_importance_sampling_clip_max,
                                              clip_min=self.vllm_importance_sampling_clip_min)  # fmt: skip
            weights = is_w if weights is None else weights * is_w.to(weights.dtype)
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
            token_weights=weights,
            conflict_counts=inputs.get("sgrpo_conflict_counts"),
            sampler_logp=sampled if sampled is not None else old,  # TRL's off-policy mask reads the sampler's
            compute_entropy=True,
            **self.sgrpo_support,  # top_k / top_p / min_p when they truncate: the log-probs of the sampled support
        )
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            loss = loss * self._window_scale(mask, inputs.get("num_items_in_batch"))
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
