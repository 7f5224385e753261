"""The feature interface: the hooks a training step calls (`Feature`), and `Features`, the ones a run has, in
registration order, called together.

A feature is one plug-in of the step (dynamic sampling, trust region, gradient penalty, ...). It overrides only the
hooks it needs; the base class does nothing in each. Built once per run by its factory (`from_run`) from the trainer's
configuration and the run's objects, it keeps only what it needs. What it must carry across a resume (a random
generator, a history) it returns from `state_dict`; the checkpoint saves that for every feature and rank, and
`load_state_dict` puts it back. The order of the hooks within one step:

    rescore        after each rollout's rewards (every rollout of the step: the first and any resampled one)
    after_rollout  the batch to train on (may roll out more problems)
    before_update  once per step, before the first optimizer pass: reset per-step numbers
    loss_inputs    extra arguments of the loss (e.g. old-policy log-probs), once per step
    after_backward the gradient of each pass is in `.grad` (may replace it)
    before_optimizer_step / after_optimizer_step   around each optimizer step (may undo it: return why)
    undo_step      an exception cut the optimizer step short: put the weights back if it can
    after_update   once per step, after the last optimizer pass (gradients freed, before the schedule's step)
    record         fields of the step's metrics record
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from ..errors import Refused, TrainError


class Feature:
    name = "feature"  # the key of its state in a checkpoint; unique among the registered features
    epochs = 1  # optimizer passes over each rollout batch that it asks for (the step makes the largest)
    wants_old_logp = False  # the step keeps the policy's log-probs before the update (`Update.old_logp`) for it

    def rescore(self, batch, problems: list):
        return batch

    def after_rollout(self, batch, roll: Callable):
        return batch

    def before_update(self) -> None:
        pass

    def loss_inputs(self, batch, check_targets: Callable[[], bool | None]) -> dict:
        """`check_targets()`: the `check_targets` argument of this feature's next op call (the first op call of a
        step checks the targets' range, the others skip that host sync)."""
        return {}

    def after_backward(self, backward_at: Callable[[], None]) -> None:
        pass

    def before_optimizer_step(self) -> None:
        pass

    def after_optimizer_step(self, which: str) -> str | None:
        """None, or why the step was undone (the update counts it as skipped)."""
        return None

    def undo_step(self, first: bool) -> bool:
        """An exception cut the optimizer step short (`first`: no earlier step of this batch was applied): True when
        the weights and optimizer state are back to what they were before the batch."""
        return False

    def after_update(self, batch, update) -> None:
        pass

    def record(self, record: dict) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Features:
    """The run's features, called in registration order. A hook that returns a value chains (rescore,
    after_rollout) or merges (loss_inputs, record) over them."""

    def __init__(self, features: list[Feature]):
        names = [f.name for f in features]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            classes = [type(f).__qualname__ for f in features if f.name in twice]
            raise ValueError(f"feature names must be unique: {twice} named by {classes} (set each class's `name`; "
                             "it keys the feature's state in a checkpoint)")  # fmt: skip
        self.items = list(features)

    def __iter__(self):
        return iter(self.items)

    @property
    def epochs(self) -> int:
        return max([f.epochs for f in self.items], default=1)

    def rescore(self, batch, problems: list):
        for f in self.items:
            with _named(f, "rescore"):
                batch = f.rescore(batch, problems)
        return batch

    def after_rollout(self, batch, roll: Callable):
        for f in self.items:
            with _named(f, "after_rollout"):
                batch = f.after_rollout(batch, roll)
        return batch

    def before_update(self) -> None:
        for f in self.items:
            with _named(f, "before_update"):
                f.before_update()

    def loss_inputs(self, batch, check_targets) -> dict:
        out: dict = {}
        for f in self.items:
            with _named(f, "loss_inputs"):
                out |= f.loss_inputs(batch, check_targets)
        return out

    def after_backward(self, backward_at: Callable[[], None]) -> None:
        for f in self.items:
            with _named(f, "after_backward"):
                f.after_backward(backward_at)

    def before_optimizer_step(self) -> None:
        for f in self.items:
            with _named(f, "before_optimizer_step"):
                f.before_optimizer_step()

    def after_optimizer_step(self, which: str) -> str | None:
        for f in self.items:
            with _named(f, "after_optimizer_step"):
                undone = f.after_optimizer_step(which)
            if undone is not None:
                return undone
        return None

    def undo_step(self, first: bool) -> bool:
        return any([f.undo_step(first) for f in self.items])

    def after_update(self, batch, update) -> None:
        for f in self.items:
            with _named(f, "after_update"):
                f.after_update(batch, update)

    @property
    def wants_old_logp(self) -> bool:
        return any(f.wants_old_logp for f in self.items)

    def record(self, record: dict) -> dict:
        """The record with each feature's fields added; a field the record already has (the trainer's, an earlier
        feature's) is refused: it would replace that number in metrics.jsonl without a word."""
        for f in self.items:
            with _named(f, "record"):
                fields = f.record(record)
            if not isinstance(fields, dict):
                raise TrainError(f"feature {f.name!r}: record() returned {type(fields).__name__}; expected a dict of "
                                 "the fields it adds to the step's record")  # fmt: skip
            clash = sorted(set(fields) & set(record))
            if clash:
                raise TrainError(f"feature {f.name!r}: record() returned {clash}, fields the step's record already has "
                                 f"(the trainer's or an earlier feature's); give its own fields other names, e.g. "
                                 f"{f.name + '_' + str(clash[0])!r}")  # fmt: skip
            record = record | fields
        return record

    def state_dict(self) -> dict:
        states = {f.name: f.state_dict() for f in self.items}
        return {name: state for name, state in states.items() if state}

    def load_state_dict(self, states: dict) -> None:
        """Each feature's saved state. Refused (exit 2) when the features differ from the resumed run's: a state saved
        for a feature this run does not have, or a feature with a state that the checkpoint does not hold (added
        since: it would start from scratch mid-run, its counts wrong)."""
        unknown = sorted(set(states) - {f.name for f in self.items})
        if unknown:
            raise Refused(f"--resume: the checkpoint holds the state of feature(s) {unknown}, which this run does not "
                          "have; register them as the resumed run did")  # fmt: skip
        added = sorted(f.name for f in self.items if f.name not in states and f.state_dict())
        if added:
            raise Refused(f"--resume: this run has feature(s) {added}, which the resumed run did not have (its "
                          "checkpoint holds no state of them); a resume continues the same run: start a new run "
                          "(another --output-dir) to add them")  # fmt: skip
        for f in self.items:
            if f.name in states:
                f.load_state_dict(states[f.name])


@contextlib.contextmanager
def _named(feature: Feature, hook: str):
    """An exception from a feature's hook carries a note naming the feature (shown under its traceback)."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"(raised in the feature {feature.name!r}: {type(feature).__qualname__}.{hook})")
        raise


def global_norm(tensors: Iterable[Tensor]) -> float:
    """The L2 norm of tensors taken together as one vector, accumulated in float64."""
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


@torch.no_grad()
def snapshot(params: Iterable[Tensor]) -> list[Tensor]:
    """A copy of `params` (theta_old), to measure a step against."""
    return [p.detach().clone() for p in params]


@torch.no_grad()
def step_norm(params: Iterable[Tensor], old: Iterable[Tensor]) -> float:
    """||params - old|| of all tensors taken together as one vector, accumulated in float64."""
    return global_norm(p - o for p, o in zip(params, old))
