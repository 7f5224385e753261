"""One training step, top to bottom: rollout -> rewards -> advantages -> loss (the ops) -> backward -> optimizer
step -> record. Every line is a named call; what each feature adds happens in its hooks (train/features/)."""

from __future__ import annotations

import itertools
import math
import time
import warnings

import torch

from sgrpo_kernels.rl import GroupSignals, prepare_groups

from .batch import Batch, Update
from .loss import loss_function
from .record import step_record
from .rollout import rollout
from .run.signals import STOP
from .tasks.base import sample_checked


def step_problems(run) -> list:
    """The step's problems (the same draw on every rank of a torchrun job), and of them this rank's whole groups."""
    problems = sample_checked(run.task, run.prompts_per_step, run.task_rng)
    if run.dist.enabled:
        share = run.prompts_per_step // run.dist.world
        problems = problems[run.dist.rank * share : (run.dist.rank + 1) * share]
    return problems


def roll(run, problems: list) -> Batch:
    """`group_size` sampled completions of each problem (HF generate, or the vLLM engine), scored, then rescored by
    the features (a dense reward)."""
    batch = rollout(run.model, run.tok, problems, **run.sampling.kwargs(), engine=run.engine)
    return run.features.rescore(batch, problems)


def advantages(run, batch: Batch) -> GroupSignals:
    """Group-relative advantages and the conflict weights of the loss preset, once per batch."""
    rewards = batch.rewards.to(run.device)
    return prepare_groups(run.loss_cfg, rewards, batch.completion_ids, batch.completion_mask, run.sampling.group_size)


def train_step(run, step: int, update: Update) -> dict:
    """Step `step` up to its record; `update` is filled in as the optimizer passes go (the loop reads it when the
    step fails). Signals are held from the first optimizer step on; the loop commits the step and releases them."""
    t0 = time.time()
    problems = step_problems(run)
    batch = roll(run, problems)  # rollout -> rewards
    batch = run.features.after_rollout(batch, lambda more: roll(run, more))  # e.g. dynamic sampling
    t_gen = time.time() - t0
    groups = advantages(run, batch)
    policy_update(run, batch, groups, update, step)  # loss -> backward -> optimizer step, per pass
    return step_record(run, step, batch, groups, update, t0, t_gen)


def optimizer_step(run, update: Update, which: str, where: str) -> None:
    """The optimizer step with the features around it (step guard, trust region). An exception inside it undoes it
    when a feature can (the step guard, for the batch's first step); an undone step counts as skipped."""
    first = not update.applied
    run.features.before_optimizer_step()
    update.applied = True
    try:
        run.optimizer.step()
        undone = run.features.after_optimizer_step(where)
    except BaseException:
        if run.features.undo_step(first):
            update.applied = False
        raise
    if undone is not None:
        update.applied = not first
        update.skip(f"{which}: {undone}")


def optimizer_pass(run, forward_loss, update: Update, check, which: str, where: str) -> None:
    """One pass: loss -> backward -> (features) -> clip -> optimizer step, unless the loss or gradient is
    non-finite (on any rank: every rank skips, so they stay in step)."""
    run.optimizer.zero_grad(set_to_none=True)
    loss, update.metrics = forward_loss(check())
    if run.dist.any(not bool(torch.isfinite(loss))):
        return update.skip(f"{which}: loss {float(loss.detach())}: no backward, no optimizer step")
    loss.backward()
    run.features.after_backward(lambda: forward_loss(False)[0].backward())  # e.g. the gradient penalty
    update.grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, run.max_grad_norm))
    if not math.isfinite(update.grad_norm):
        run.optimizer.zero_grad(set_to_none=True)
        return update.skip(f"{which}: gradient norm {update.grad_norm}: no optimizer step")
    STOP.hold()  # from the first optimizer step to the step's commit, a Ctrl-C / SIGTERM waits
    optimizer_step(run, update, which, where)


def policy_update(run, batch: Batch, groups: GroupSignals, update: Update, step: int) -> Update:
    """Every optimizer pass over one rollout batch (`run.features.epochs` of them), then the schedule's step.
    `update` is filled in as it goes: after an exception, `update.applied` says whether the weights moved."""
    check = itertools.chain([None], itertools.repeat(False)).__next__  # None: env SGRPO_CHECK_TARGETS (default on)
    run.features.before_update()
    forward_loss = loss_function(run, batch, groups, check, update)
    run.model.train()
    epochs = run.features.epochs
    for epoch in range(epochs):
        which = f"epoch {epoch + 1}/{epochs}"
        optimizer_pass(run, forward_loss, update, check, which, f"step {step} ({which})")
    run.optimizer.zero_grad(set_to_none=True)
    run.features.after_update(batch, update)  # e.g. --log-mechanism: the whole step's update and what it did
    with warnings.catch_warnings():  # a skipped (non-finite) update still advances the schedule
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        run.scheduler.step()
    STOP.hold()  # until the step's commit (also when every pass was skipped)
    return update
