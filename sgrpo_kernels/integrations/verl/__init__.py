"""S-GRPO, GTPO and S-GRPO's ablations for verl users, by config keys (docs/verl.md).

``pip install 'sgrpo-kernels[verl]'`` installs a ``verl.plugins`` entry point (:mod:`.plugin`): on ``import verl``
the loss names (``s_grpo``, ``gtpo``, ``gtpo_official``, ``s_grpo_afn``, ``grpo_ef``, ``grpo_tc``) and the trainer mode
``sgrpo`` are registered. A verl GRPO job switches with::

    trainer.v1.trainer_mode=sgrpo actor_rollout_ref.actor.policy_loss.loss_mode=s_grpo

What runs where: the group-level parts (advantages, conflict weights, entropy filter) on the driver
(:mod:`.signals`, :mod:`.trainer`), the loss with gradient (policy term, entropy bonus / floor) on the actor workers
(:mod:`.loss`), both from ``sgrpo_kernels.rl``. Supported verl versions: :mod:`._compat` (checked on import).
"""

from sgrpo_kernels.integrations.verl._compat import VERL_MAX, VERL_MIN, check_verl_version

check_verl_version()

from sgrpo_kernels.integrations.verl.config import (  # noqa: E402
    POLICY_LOSSES,
    SGRPOPolicyLossConfig,
    loss_config,
    uses_sgrpo,
)
from sgrpo_kernels.integrations.verl.loss import make_loss_fn, sgrpo_ppo_loss  # noqa: E402
from sgrpo_kernels.integrations.verl.signals import DriverSignals, driver_signals, loss_side_config  # noqa: E402

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
