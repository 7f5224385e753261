"""The verl config of our policy losses: which ``loss_mode`` names exist, the policy-loss dataclass that carries their
overrides, and the :class:`~sgrpo_kernels.rl.LossConfig` a verl actor config asks for (driver and workers build the
same one from the same keys)."""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config import PolicyLossConfig

from sgrpo_kernels.rl import LossConfig, preset_with

__all__ = ["POLICY_LOSSES", "SGRPOPolicyLossConfig", "loss_config", "uses_sgrpo"]

# The presets verl users reach by `policy_loss.loss_mode`: S-GRPO, GTPO (paper and official code) and S-GRPO's
# ablations. Not registered: grpo / dapo / gspo / dr_grpo / lite_ppo, which verl has natively (and `gspo` is one of
# verl's own loss modes).
POLICY_LOSSES = ("s_grpo", "gtpo", "gtpo_official", "s_grpo_afn", "grpo_ef", "grpo_tc")

TARGET = "sgrpo_kernels.integrations.verl.SGRPOPolicyLossConfig"


@dataclass
class SGRPOPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus ``sgrpo_loss``: LossConfig overrides on the preset that ``loss_mode`` names,
    ``"field=value,..."`` as the bundled trainer's ``--loss`` and the TRL integration's ``sgrpo_loss``. Select it with
    ``actor_rollout_ref.actor.policy_loss._target_=sgrpo_kernels.integrations.verl.SGRPOPolicyLossConfig`` (verl
    refuses keys its own dataclass does not have); without overrides the stock dataclass is enough.

    ``trust_region``: a cap on each optimizer step of the actor, ``||theta - theta_old|| <= trust_region`` over the
    whole model (FSDP2 shards summed; :mod:`.trust_region`); inf only measures; None (default) is off."""

    sgrpo_loss: str = ""
    trust_region: float | None = None


def uses_sgrpo(policy_loss) -> bool:
    """Whether a verl ``policy_loss`` config (dataclass or DictConfig) selects one of our loss modes."""
    return policy_loss is not None and policy_loss.get("loss_mode", "vanilla") in POLICY_LOSSES


def loss_config(policy_loss) -> LossConfig:
    """The LossConfig of a verl ``actor.policy_loss`` config: the preset named by ``loss_mode`` with ``sgrpo_loss``
    applied; ValueError naming the key, the value and what is expected."""
    mode = policy_loss.get("loss_mode", "vanilla")
    overrides = policy_loss.get("sgrpo_loss", "") or ""
    if mode not in POLICY_LOSSES:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r} is not an sgrpo_kernels loss; expected one of "
            f"{POLICY_LOSSES}"
        )
    try:
        cfg = preset_with(mode, overrides)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss: loss_mode={mode!r}, sgrpo_loss={overrides!r}: {exc}"
        ) from None
    if cfg.loss_agg == "seq-mean-token-sum-norm" and cfg.max_completion_length is None:
        raise ValueError(
            "actor_rollout_ref.actor.policy_loss.sgrpo_loss: loss_agg='seq-mean-token-sum-norm' needs "
            "max_completion_length=<data.max_response_length> (verl pads each micro-batch to its own length, so the "
            "batch's T is not a constant)"
        )
    return cfg
