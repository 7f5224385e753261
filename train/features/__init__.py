"""The training step's plug-ins: one file each, registered here in the order their hooks run (train/features/base.py
says which hook runs when). A factory `from_run(cfg, run)` builds a feature from the trainer's configuration and the
run's objects, or returns None when the feature is off.

Adding one: a file with a `Feature` subclass and its factory, and a `register_feature(factory)` (docs/design.md, "Adding
a feature")."""

from __future__ import annotations

from collections.abc import Callable

from ..features import (
    collapse,
    dense_reward,
    dynamic_sampling,
    grad_penalty,
    mechanism,
    ppo_epochs,
    step_guard,
    trust_region,
    user_reward,
)
from ..features.base import Feature, Features

__all__ = ["Feature", "Features", "build_features", "register_feature", "unregister_feature", "FACTORIES"]

Factory = Callable[[object, object], Feature | None]

# Hook order: rewards are rescored before dynamic sampling judges them; the trust region projects a step before the
# step guard checks it; the collapse flag reads the finished record. The mechanism log is first: its fields come first
# in the record.
FACTORIES: list[Factory] = [
    mechanism.from_run,  # --log-mechanism: measures only (no other feature reads it)
    user_reward.from_run,  # --reward: the training reward is the user's functions' (before anything reads it)
    dense_reward.from_run,
    dynamic_sampling.from_run,
    ppo_epochs.from_run,
    trust_region.from_run,
    grad_penalty.from_run,
    step_guard.from_run,
    collapse.from_run,
]


def register_feature(factory: Factory, *, before: Factory | None = None) -> Factory:
    """Add a feature's factory, last or just before `before` (a registered factory). Returns the factory, so it can
    be used as a decorator."""
    if isinstance(factory, type) or not callable(factory):  # (a class or a name failed later, in the run's setup)
        what = f"the class {factory.__qualname__}" if isinstance(factory, type) else f"{factory!r}"
        raise TypeError(f"register_feature takes a factory from_run(cfg, run) -> Feature | None, got {what}; e.g. "
                        "register_feature(lambda cfg, run: MyFeature())")  # fmt: skip
    if factory in FACTORIES:
        raise ValueError(f"feature factory {factory.__qualname__} is already registered")
    FACTORIES.insert(FACTORIES.index(before) if before is not None else len(FACTORIES), factory)
    return factory


def unregister_feature(factory: Factory) -> None:
    FACTORIES.remove(factory)


def build_features(cfg, run) -> Features:
    """The run's features: every registered factory's, in order, skipping those that are off."""
    return Features([f for make in FACTORIES if (f := make(cfg, run)) is not None])
