"""The ``verl.plugins`` entry point: verl imports this module on ``import verl`` in every process (driver, task runner,
workers), and importing it registers our names in verl's registries:

- the policy-loss names of :data:`.config.POLICY_LOSSES` (``s_grpo``, ``gtpo``, ...) in ``core_algos``'s registry, so
  ``actor_rollout_ref.actor.policy_loss.loss_mode=s_grpo`` is accepted everywhere;
- the trainer mode ``sgrpo`` in the v1 trainer registry (when verl's v1 trainer can be imported: it needs the
  ``transferqueue`` package, as verl's own default trainer does).

verl logs a plugin's import errors at debug level only. So that a broken install cannot fail silently (and train with
something else), a failed registration logs a warning and still registers each of our loss names as a function that
raises the original error on first use."""

from __future__ import annotations

import importlib.util
import logging

__all__ = ["REGISTERED"]

logger = logging.getLogger("sgrpo_kernels.integrations.verl")
REGISTERED: dict[str, object] = {}  # what this process registered: loss names -> functions, "trainer" -> class


def _register() -> None:
    from verl.trainer.ppo.core_algos import register_policy_loss

    from sgrpo_kernels.integrations.verl import POLICY_LOSSES
    from sgrpo_kernels.integrations.verl.loss import missing_trainer_loss

    for name in POLICY_LOSSES:
        REGISTERED[name] = register_policy_loss(name)(missing_trainer_loss(name))
    if importlib.util.find_spec("transfer_queue") is not None:
        from sgrpo_kernels.integrations.verl.trainer import SGRPOTrainer

        REGISTERED["trainer"] = SGRPOTrainer


def _register_broken(exc: BaseException) -> None:
    """Our loss names, each raising `exc` (why the plugin failed) on first use."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    from sgrpo_kernels.integrations.verl.config import POLICY_LOSSES

    def broken(*args, **kwargs):
        raise RuntimeError(f"sgrpo_kernels' verl plugin failed to load: {exc!r}") from exc

    for name in POLICY_LOSSES:
        REGISTERED[name] = register_policy_loss(name)(broken)


try:
    _register()
except Exception as _exc:
    logger.warning("sgrpo_kernels' verl plugin failed to register s_grpo / gtpo: %r", _exc)
    try:
        _register_broken(_exc)
    except Exception:  # verl itself is unusable here; its own error will show
        pass
    raise
