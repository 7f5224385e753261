"""S-GRPO, GTPO and S-GRPO's ablations for verl users, by config keys (docs/verl.md).

``pip install 'sgrpo-kernels[verl]'`` installs a ``verl.plugins`` entry point (:mod:`.plugin`): on ``import verl``
the loss names (``s_grpo``, ``gtpo``, ``gtpo_official``, ``s_grpo_afn``, ``grpo_ef``, ``grpo_tc``) and the trainer mode
``sgrpo`` are registered (importing this package registers them too, whether or not verl was imported first:
:mod:`.plugin`). A verl GRPO job switches with::

    trainer.v1.trainer_mode=sgrpo actor_rollout_ref.actor.policy_loss.loss_mode=s_grpo

What runs where: the group-level parts (advantages, conflict weights, entropy filter) on the driver
(:mod:`.signals`, :mod:`.trainer`), the loss with gradient (policy term, entropy bonus / floor) on the actor workers
(:mod:`.loss`), both from ``sgrpo_kernels.rl``. Supported verl versions: :mod:`._compat` (checked on import).
"""

import sys

from sgrpo_kernels.integrations.verl import registry as _registry
from sgrpo_kernels.integrations.verl._compat import VERL_MAX, VERL_MIN, check_verl_version

try:
    check_verl_version()
    from sgrpo_kernels.integrations.verl.config import SGRPOPolicyLossConfig, loss_config, uses_sgrpo
    from sgrpo_kernels.integrations.verl.loss import make_loss_fn, sgrpo_ppo_loss
    from sgrpo_kernels.integrations.verl.signals import DriverSignals, driver_signals, loss_side_config
except Exception as _exc:
    if "verl" in sys.modules:  # verl is (being) imported: our loss names raise this error instead of being unknown
        _registry.register_broken(_exc)
    raise

POLICY_LOSSES = _registry.POLICY_LOSSES

# Last: the package is whole, so everything can be registered, the trainer mode included (when this package was
# imported before verl, verl's plugin loading ran while the package was partly initialized: .registry).
_INITIALIZED = True
_registry.register()

__all__ = [
    "POLICY_LOSSES",
    "VERL_MAX",
    "VERL_MIN",
    "DriverSignals",
    "SGRPOPolicyLossConfig",
    "check_verl_version",
    "driver_signals",
    "loss_config",
    "loss_side_config",
    "make_loss_fn",
    "sgrpo_ppo_loss",
    "uses_sgrpo",
]
