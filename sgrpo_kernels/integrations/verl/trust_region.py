"""The trust region on parameters inside verl's actor workers (``actor_rollout_ref.actor.policy_loss.trust_region``):
after each optimizer step of the actor, the step of the whole model is projected onto ``||theta - theta_old|| <=
delta`` by :class:`sgrpo_kernels.rl.TrustRegion` (docs/verl.md).

verl builds the optimizer inside its engine, out of the plugin's reach; what the plugin does run in the worker process
is the engine-level loss (:mod:`.loss`). Its first call installs torch's process-wide optimizer step hooks, and they
attach a ``TrustRegion`` to the optimizer that steps (the actor's: in a GRPO worker no other optimizer steps). With
``strategy=fsdp2`` the parameters are DTensor shards and the norm is that of the whole model, summed over the shards;
other plain-tensor shards (FSDP1 on more than one rank) are refused, since their norm would be a shard's.
"""

from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from sgrpo_kernels.rl import TrustRegion, TrustRegionStep
from sgrpo_kernels.rl.trust_region import check_max_norm

__all__ = ["check_trust_region", "install_trust_region", "last_step", "uninstall_trust_region"]

_STATE: dict = {"max_norm": None, "handles": None, "last": None}
_REGIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
KEY = "actor_rollout_ref.actor.policy_loss.trust_region"


def check_trust_region(value) -> float | None:
    """The config key's value: None (off), a number > 0, or inf (measure only); ValueError naming the key."""
    if value is None:
        return None
    try:
        return check_max_norm(float(value) if isinstance(value, str) else value, KEY)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{KEY}={value!r}: {exc}") from None


def install_trust_region(max_norm: float) -> None:
    """Cap every optimizer step of this process at ``max_norm`` (idempotent; a new value replaces the old one)."""
    max_norm = check_trust_region(max_norm)
    if _STATE["max_norm"] != max_norm:
        _REGIONS.clear()
    _STATE["max_norm"] = max_norm
    if _STATE["handles"] is None:
        _STATE["handles"] = (register_optimizer_step_pre_hook(_pre), register_optimizer_step_post_hook(_post))


def uninstall_trust_region() -> None:
    """Remove the hooks (tests; a process that changes its mind)."""
    for h in _STATE["handles"] or ():
        h.remove()
    _STATE.update(max_norm=None, handles=None, last=None)
    _REGIONS.clear()


def last_step() -> TrustRegionStep | None:
    """The last optimizer step as the trust region saw it in this process (None before the first)."""
    return _STATE["last"]


def _region(opt: torch.optim.Optimizer) -> TrustRegion:
    tr = _REGIONS.get(opt)
    if tr is None:
        params = [p for g in opt.param_groups for p in g["params"]]
        sharded = [type(p).__name__ == "DTensor" for p in params]
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world > 1 and not all(sharded):
            raise NotImplementedError(
                f"{KEY}: the actor's parameters are not DTensors (FSDP1) on {world} ranks, so a rank would measure its "
                "shard only; use actor_rollout_ref.actor.strategy=fsdp2"
            )
        tr = TrustRegion(opt, _STATE["max_norm"], params=params, attach=False)
        _REGIONS[opt] = tr
    return tr


def _pre(opt, args, kwargs) -> None:
    if _STATE["max_norm"] is not None:
        _region(opt).snapshot()


def _post(opt, args, kwargs) -> None:
    if _STATE["max_norm"] is not None:
        tr = _region(opt)
        if tr.old is not None:
            _STATE["last"] = tr.project()
