"""One training step, top to bottom: rollout -> rewards -> advantages -> loss (the ops) -> backward -> optimizer
step -> record. Every line is a named call; what each feature adds happens in its hooks (train/features/)."""

from __future__ import annotations

import time

from sgrpo_kernels.rl import GroupSignals, prepare_groups

from .record import step_record
from .rollout import Batch, rollout
from .update import Update, policy_update


def step_problems(run) -> list:
    """The step's problems (the same draw on every rank of a torchrun job), and of them this rank's whole groups."""
    problems = run.task.sample(run.prompts_per_step, run.task_rng)
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
