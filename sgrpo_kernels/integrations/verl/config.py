"""The verl config of our policy losses: which ``loss_mode`` names exist, the policy-loss dataclass that carries their
overrides, and the :class:`~sgrpo_kernels.rl.LossConfig` a verl actor config asks for (driver and workers build the
same one from the same keys)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from verl.workers.config import ActorConfig, PolicyLossConfig

from sgrpo_kernels.integrations.verl.registry import POLICY_LOSSES
from sgrpo_kernels.rl import LossConfig, preset_with

__all__ = ["POLICY_LOSSES", "SGRPOPolicyLossConfig", "check_loss_keys", "loss_config", "uses_sgrpo"]

TARGET = "sgrpo_kernels.integrations.verl.SGRPOPolicyLossConfig"


def sgrpo_loss_override(setting: str, where: str = "actor_rollout_ref.actor") -> str:
    """The command-line override that sets `sgrpo_loss` to `setting`, quoted for a shell: the value holds `=`, which
    Hydra reads only inside quotes, and the shell must leave those quotes to Hydra."""
    return f"'+{where}.policy_loss.sgrpo_loss=\"{setting}\"'"


@dataclass
class SGRPOPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus ``sgrpo_loss``: LossConfig overrides on the preset that ``loss_mode`` names,
    ``"field=value,..."`` as the bundled trainer's ``--loss`` and the TRL integration's ``sgrpo_loss``. Select it with
    ``++actor_rollout_ref.actor.policy_loss._target_=sgrpo_kernels.integrations.verl.SGRPOPolicyLossConfig`` (verl
    refuses keys its own dataclass does not have; ``++``: verl's config has a ``_target_`` of its own); without
    overrides the stock dataclass is enough.

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


# verl's keys of its own policy losses -> the LossConfig fields that play their part in ours (None: by policy_term)
ACTOR_LOSS_KEYS = {
    "clip_ratio": ("epsilon_low", "epsilon_high"),
    "clip_ratio_low": ("epsilon_low",),
    "clip_ratio_high": ("epsilon_high",),
    "clip_ratio_c": None,
    "loss_agg_mode": ("loss_agg",),
    "loss_scale_factor": ("max_completion_length",),
    "tau_pos": ("sapo_tau_pos",),
    "tau_neg": ("sapo_tau_neg",),
}
POLICY_LOSS_KEYS = {
    "clip_cov_ratio": ("cov_ratio",),
    "clip_cov_lb": ("clip_cov_lb",),
    "clip_cov_ub": ("clip_cov_ub",),
    "kl_cov_ratio": ("cov_ratio",),
    "ppo_kl_coef": ("kl_cov_coef",),
    "dro_beta": (),
}


def _fields(cfg: LossConfig, key: str, fields: tuple[str, ...] | None) -> tuple[str, ...]:
    if fields is not None:
        return fields
    if cfg.policy_term in ("dppo_tv", "dppo_kl"):  # clip_ratio_c: DPPO's ratio cap, or PPO's dual clip
        return ("dppo_ratio_cap",)
    return ("dual_clip",) if cfg.policy_term == "ppo" else ()


def check_loss_keys(actor, cfg: LossConfig) -> None:
    """ValueError for a verl policy-loss setting (clip ratios, ``loss_agg_mode``, ...) that our loss would not read:
    one that is neither verl's default (which stands for "not set": the preset's value is used) nor the value of the
    LossConfig field that plays its part, naming the key and the ``sgrpo_loss`` override that sets it on our side."""
    where = "actor_rollout_ref.actor"
    nodes = ((actor, ACTOR_LOSS_KEYS, ActorConfig, where),
             (actor.get("policy_loss") or {}, POLICY_LOSS_KEYS, PolicyLossConfig, f"{where}.policy_loss"))  # fmt: skip
    for node, keys, cls, prefix in nodes:
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        for key, fields in keys.items():
            value = node.get(key, dataclasses.MISSING)
            if key not in defaults or value is dataclasses.MISSING or value == defaults[key]:
                continue
            if value is None and key in ("clip_ratio_low", "clip_ratio_high"):
                continue  # verl falls back to clip_ratio, checked itself
            fields = _fields(cfg, key, fields)
            if fields and all(getattr(cfg, f) == value for f in fields):
                continue
            said = f"{prefix}.{key}={value!r} with loss_mode={cfg.name!r}"
            if not fields:
                raise ValueError(f"{said}: the sgrpo loss (policy_term={cfg.policy_term!r}) has no such setting and "
                                 f"would ignore it; expected verl's default {defaults[key]!r}")  # fmt: skip
            used = ", ".join(f"{f}={getattr(cfg, f)!r}" for f in fields)
            setting = ",".join(f"{f}={value}" for f in fields)
            raise ValueError(
                f"{said}: the sgrpo loss would ignore it (it uses {used}); set it on our side, "
                f"{sgrpo_loss_override(setting, where)} (with '++{where}.policy_loss._target_={TARGET}'), or leave "
                f"{key} at verl's default {defaults[key]!r}"
            )
