"""The ``verl.plugins`` entry point: verl imports this module on ``import verl`` in every process (driver, task runner,
workers), and importing it registers our names in verl's registries (:mod:`.registry`):

- the policy-loss names of :data:`.registry.POLICY_LOSSES` (``s_grpo``, ``gtpo``, ...) in ``core_algos``'s registry,
  so ``actor_rollout_ref.actor.policy_loss.loss_mode=s_grpo`` is accepted everywhere;
- the trainer mode ``sgrpo`` in the v1 trainer registry (when verl's v1 trainer can be imported: it needs the
  ``transferqueue`` package, as verl's own default trainer does).

The package registers the same on its own import, so the order of ``import verl`` and
``import sgrpo_kernels.integrations.verl`` does not matter. verl logs a plugin's import errors at debug level only. So
that a broken install cannot fail silently (and train with something else), a failed registration logs a warning and
still registers each of our loss names as a function that raises the original error on first use; this module then
raises that error too."""

from __future__ import annotations

from sgrpo_kernels.integrations.verl.registry import REGISTERED, register

__all__ = ["REGISTERED", "register"]

_error = register()
if _error is not None:
    raise _error  # verl logs it (at debug level) and goes on
