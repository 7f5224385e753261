"""The driver's side: verl's synchronous v1 PPO trainer (``PPOTrainerSync``) with the group signals of an sgrpo_kernels
preset, registered as ``trainer.v1.trainer_mode=sgrpo``.

Why a trainer subclass: the group-level parts (advantages, GTPO conflict weights, the completion-entropy filter) need
each group's rewards, response tokens and stored entropies together, and verl's driver is the only place that has
them (a registered advantage estimator sees no response tokens, a policy loss sees one micro-batch that need not hold
whole groups). Three methods change, nothing else:

- ``__init__``: builds the LossConfig from ``actor.policy_loss``, refuses verl settings that would double-count or
  that the loss does not serve (a critic among them), turns ``calculate_entropy`` on when the preset needs entropies,
  and runs as verl's ``sync`` mode (its replay buffer and options).
- ``_setup``: after verl built the workers, installs the engine-level loss (:func:`.loss.sgrpo_ppo_loss`) on the actor
  workers with ``set_loss_fn`` (with ``policy_loss.trust_region``, the cap on the actor's steps: :mod:`.trust_region`).
- ``_compute_advantage``: after verl's own step (rewards, rollout correction), replaces ``advantages`` / ``returns``
  with the preset's and adds the per-token weights and conflict counts (:func:`.signals.driver_signals`).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from sgrpo_kernels.integrations.verl.config import TARGET, check_loss_keys, loss_config, sgrpo_loss_override
from sgrpo_kernels.integrations.verl.loss import make_loss_fn
from sgrpo_kernels.integrations.verl.registry import TRAINER_MODE
from sgrpo_kernels.integrations.verl.signals import driver_signals, loss_side_config
from sgrpo_kernels.integrations.verl.trust_region import check_trust_region
from sgrpo_kernels.rl import LossConfig

# the override that keeps the bundled trainer's filter (with our policy-loss dataclass), as a shell takes it
QUANTILE_HINT = (f"{sgrpo_loss_override('entropy_filter=quantile:0.75')} "
                 f"'++actor_rollout_ref.actor.policy_loss._target_={TARGET}'")

__all__ = ["TRAINER_MODE", "SGRPOTrainer", "check_critic_free", "check_verl_config"]


NO_STD_DIVISION = ("dr_grpo", "rloo")  # the advantage methods that divide by no standard deviation


def check_verl_config(config, cfg: LossConfig) -> None:
    """ValueError for verl settings the sgrpo loss does not serve or would ignore (:func:`.config.check_loss_keys`), or
    a critic (:func:`check_critic_free`), naming the key, its value and what to set."""
    actor = config.actor_rollout_ref.actor
    refused = [
        ("algorithm.use_kl_in_reward", config.algorithm.get("use_kl_in_reward", False), False,
         "the presets are reference-free; rewards must be the task's"),
        ("actor_rollout_ref.actor.use_kl_loss", actor.get("use_kl_loss", False), False,
         "the sgrpo loss replaces verl's ppo_loss, KL included"),
        ("actor_rollout_ref.actor.entropy_coeff", actor.get("entropy_coeff", 0.0), 0.0,
         "entropy terms come from the preset: '+actor_rollout_ref.actor.policy_loss.sgrpo_loss=\"entropy_coef=...\"' "
         f"with '++actor_rollout_ref.actor.policy_loss._target_={TARGET}'"),
    ]  # fmt: skip
    for key, value, expected, why in refused:
        if value != expected:
            raise ValueError(f"{key}={value!r} with loss_mode={cfg.name!r}: expected {expected!r} ({why})")
    norm = config.algorithm.get("norm_adv_by_std_in_grpo", True)
    if norm is not True and cfg.advantage_method not in NO_STD_DIVISION:  # (it was accepted and ignored)
        raise ValueError(
            f"algorithm.norm_adv_by_std_in_grpo={norm!r} with loss_mode={cfg.name!r}: the preset's advantages replace "
            f"verl's, and its advantage_method={cfg.advantage_method!r} divides by the group's std; for mean-centred "
            "advantages set +actor_rollout_ref.actor.policy_loss.sgrpo_loss=\"advantage_method=dr_grpo\" (and leave "
            "norm_adv_by_std_in_grpo at True)"
        )
    if cfg.beta != 0:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.sgrpo_loss sets beta={cfg.beta}: KL to a reference is not supported "
            "by the verl plugin yet; expected beta=0"
        )
    policy_loss = actor.get("policy_loss") or {}
    ours = [k for k in ("sgrpo_loss", "trust_region") if k in policy_loss]
    if ours and policy_loss.get("_target_", TARGET) != TARGET:  # verl's dataclass would refuse the key in a worker
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.{ours[0]} with policy_loss._target_="
            f"{policy_loss.get('_target_')!r}: that dataclass has no {ours[0]}; add "
            f"'++actor_rollout_ref.actor.policy_loss._target_={TARGET}'"
        )
    check_critic_free(config, cfg)
    check_loss_keys(actor, cfg)
    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"actor_rollout_ref.rollout.n={n!r}: expected an int >= 2 (group-relative losses need n >= 2 "
                         "completions per prompt)")


def check_critic_free(config, cfg: LossConfig) -> None:
    """ValueError when verl would build and train a critic (its own ``need_critic``: ``critic.enable``, or by default
    ``algorithm.adv_estimator=gae``, verl's default), or compute GAE without one: the presets are critic-free, the
    trainer replaces ``advantages`` and ``returns`` with the preset's group advantages, and a critic would be trained on
    those and its values thrown away (in the actor's process, under the actor's trust region as well)."""
    from verl.trainer.ppo.utils import need_critic

    algorithm, critic = config.algorithm, config.get("critic") or {}
    estimator = algorithm.get("adv_estimator", "gae")
    estimator = getattr(estimator, "value", estimator)  # verl's AdvantageEstimator enum or its string
    enable = critic.get("enable", None)
    with warnings.catch_warnings():  # need_critic warns that the critic is off when the estimator is not gae
        warnings.simplefilter("ignore")
        wants_critic = need_critic(config) if "critic" in config else estimator == "gae"
    if not wants_critic and estimator != "gae":
        return
    said = f"algorithm.adv_estimator={estimator!r}, critic.enable={enable!r} with loss_mode={cfg.name!r}"
    why = ("verl would build and train a critic" if wants_critic else
           "verl would compute GAE advantages, which need a critic's values")  # fmt: skip
    raise ValueError(
        f"{said}: {why}, but the sgrpo presets are critic-free (the sgrpo trainer replaces advantages and returns "
        "with the preset's group advantages, so a critic's values would be thrown away); set "
        "algorithm.adv_estimator=grpo and leave critic.enable unset (null) or false"
    )


@register_trainer(TRAINER_MODE)
class SGRPOTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with an sgrpo_kernels preset (module docstring)."""

    def __init__(self, config):
        cfg = loss_config(config.actor_rollout_ref.actor.policy_loss)
        check_verl_config(config, cfg)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # the replay buffer and options of verl's sync mode
            if cfg.needs_entropy:
                config.actor_rollout_ref.actor.calculate_entropy = True
        self.sgrpo_config = cfg
        self.sgrpo_trust_region = check_trust_region(config.actor_rollout_ref.actor.policy_loss.get("trust_region"))
        super().__init__(config)

    def _setup(self):
        super()._setup()
        self.actor_rollout_wg.set_loss_fn(make_loss_fn(loss_side_config(self.sgrpo_config), self.sgrpo_trust_region))

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics=metrics)
        fields = ["uid", "responses", "response_mask", "rm_scores"]
        if self.sgrpo_config.entropy_filter is not None:
            fields.append("entropy")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        uid = np.array(data.batch.pop("uid").tolist(), dtype=object)
        mask = data.batch["response_mask"]
        signals = driver_signals(
            self.sgrpo_config,
            data.batch["rm_scores"].sum(dim=-1).float(),  # one reward per response, as verl's GRPO estimator
            data.batch["responses"],
            mask,
            uid,
            self.config.actor_rollout_ref.rollout.n,
            entropy=data.batch["entropy"] if "entropy" in data.batch.keys() else None,
            vocab_size=len(self.tokenizer),
        )
        m = mask.to(torch.float32)
        per_token = {
            "advantages": signals.advantages.unsqueeze(1) * m,
            "returns": signals.advantages.unsqueeze(1) * m,
            "sgrpo_token_weights": signals.token_weights,
            "sgrpo_conflict_counts": signals.conflict_counts.unsqueeze(1) * m,
        }
        out = TensorDict({k: response_to_nested(v, nested_mask) for k, v in per_token.items()}, batch_size=len(batch))
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
        metrics.update({f"sgrpo/{k}": v for k, v in signals.stats.items()})
        if signals.stats.get("filtered_frac", 0.0) >= 1.0:
            self._sgrpo_all_filtered = getattr(self, "_sgrpo_all_filtered", 0) + 1
            if self._sgrpo_all_filtered in (1, 10, 100):
                warnings.warn(
                    f"sgrpo trainer: the entropy filter ({self.sgrpo_config.entropy_filter!r}) removed every "
                    f"completion of the batch ({self._sgrpo_all_filtered} time(s) so far): no policy gradient. On a "
                    f"fresh model ln 2 removes nearly all of them; try {QUANTILE_HINT} (docs/verl.md)",
                    stacklevel=2,
                )
        return batch
