"""What the plugin registers in verl, and the registering, in a module that imports nothing at import time (neither
verl nor the package's other modules), so that it works while verl or the package is still importing itself.

Whichever is imported first, verl or ``sgrpo_kernels.integrations.verl``, ends with everything registered:

- verl first: ``import verl`` loads the entry point (:mod:`.plugin`), which imports the package (whole: its
  ``verl.workers.config`` import finds verl already importing), and the package calls :func:`register` at its end.
- the package first: its :mod:`.config` imports verl, whose plugin loading imports :mod:`.plugin` while the package is
  only partly initialized. :func:`register` then registers the loss names (:mod:`.loss` does not import verl at
  import time) and leaves the trainer mode, which needs the whole package, to the package's own call at its end.

:func:`register` is idempotent. A failed registration (this module's, the plugin's, or the package's own import)
logs a warning and registers each of our loss names as a function that raises the original error on first use
(:func:`register_broken`), since verl logs a plugin's import errors at debug level only."""

from __future__ import annotations

import importlib.util
import logging
import sys

__all__ = ["FAILED", "POLICY_LOSSES", "REGISTERED", "TRAINER_MODE", "register", "register_broken"]

# The presets verl users reach by `policy_loss.loss_mode`: S-GRPO, GTPO (paper and official code) and S-GRPO's
# ablations. Not registered: grpo / dapo / gspo / dr_grpo / lite_ppo, which verl has natively (and `gspo` is one of
# verl's own loss modes).
POLICY_LOSSES = ("s_grpo", "gtpo", "gtpo_official", "s_grpo_afn", "grpo_ef", "grpo_tc")
TRAINER_MODE = "sgrpo"  # trainer.v1.trainer_mode=sgrpo

logger = logging.getLogger("sgrpo_kernels.integrations.verl")
REGISTERED: dict[str, object] = {}  # what this process registered: loss names -> functions, "trainer" -> class
FAILED: list[BaseException] = []  # the first registration error of this process (then only the broken names stay)
PACKAGE = "sgrpo_kernels.integrations.verl"


def _package_ready() -> bool:
    """Whether ``sgrpo_kernels.integrations.verl`` has finished its own import (it sets ``_INITIALIZED`` last)."""
    return getattr(sys.modules.get(PACKAGE), "_INITIALIZED", False) is True


def _register() -> None:
    from verl.trainer.ppo.core_algos import register_policy_loss

    from sgrpo_kernels.integrations.verl.loss import missing_trainer_loss

    for name in POLICY_LOSSES:
        if name not in REGISTERED:
            REGISTERED[name] = register_policy_loss(name)(missing_trainer_loss(name))
    if "trainer" in REGISTERED or not _package_ready() or importlib.util.find_spec("transfer_queue") is None:
        return  # while the package is partly initialized, its own call (at its end) registers the trainer
    from sgrpo_kernels.integrations.verl.trainer import SGRPOTrainer

    REGISTERED["trainer"] = SGRPOTrainer


def register() -> BaseException | None:
    """Register our loss names and (once the package is whole, with ``transferqueue``) the trainer mode in verl's
    registries; idempotent. Returns None, or the error of a failed registration (after :func:`register_broken`)."""
    if FAILED:
        return FAILED[0]
    try:
        _register()
    except Exception as exc:
        register_broken(exc)
        return exc
    return None


def register_broken(exc: BaseException) -> None:
    """After a failed registration: a warning, and our loss names, each raising `exc` (why) on first use, in place of
    whatever was registered. Only the first error of a process counts. Needs nothing of ours, only verl's registry."""
    if FAILED:
        return
    FAILED.append(exc)
    logger.warning("sgrpo_kernels' verl plugin failed to register s_grpo / gtpo: %r", exc)

    def broken(*args, **kwargs):
        raise RuntimeError(f"sgrpo_kernels' verl plugin failed to load: {exc!r}") from exc

    try:
        from verl.trainer.ppo.core_algos import register_policy_loss

        for name in POLICY_LOSSES:
            REGISTERED[name] = register_policy_loss(name)(broken)
    except Exception:  # verl itself is unusable here; its own error will show
        pass
