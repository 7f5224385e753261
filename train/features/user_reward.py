"""Reward functions from the user's modules (`--reward module:function[=weight],...`): after each rollout the training
reward becomes their weighted sum (train/rewards.py, `RewardFunctions`: TRL's reward_funcs convention), plus the
format reward when --format-reward-weight is set. Each function is called once on a real problem before training, so a
wrong signature or return value is refused then; a non-finite reward during training stops the run, naming it.

`correct` (accuracy) stays the task's correctness; rows of `--task jsonl` without an answer count as correct when
their reward is > 0 (train/tasks/jsonl.py)."""

from __future__ import annotations

import dataclasses

import torch

from ..errors import Refused
from ..features.base import Feature
from ..rewards import RewardError, RewardFunctions, RowAnswer, format_reward
from ..rollout import Batch


def problem_fields(problem) -> dict:
    """What a reward function receives of a problem: a JSONL row's fields, or a built-in task's question and answer."""
    if isinstance(problem.answer, RowAnswer):
        return problem.answer.fields
    return {"question": problem.question, "answer": problem.answer}


class UserReward(Feature):
    name = "user_reward"

    def __init__(self, functions: RewardFunctions, group_size: int, format_weight: float):
        self.functions, self.group_size, self.format_weight = functions, group_size, format_weight

    def rescore(self, batch: Batch, problems: list) -> Batch:
        g = self.group_size
        rows = [problem_fields(problems[i // g]) for i in range(len(batch.texts))]
        prompts = [problems[i // g].prompt for i in range(len(batch.texts))]
        truths = [problems[i // g].answer for i in range(len(batch.texts))]
        rewards = torch.tensor(self.functions(batch.texts, prompts, rows, truths), dtype=torch.float64)
        if self.format_weight:
            rewards += self.format_weight * torch.tensor([format_reward(t) for t in batch.texts], dtype=torch.float64)
        return dataclasses.replace(batch, rewards=rewards.to(batch.rewards.dtype))


def checked_rewards(cfg, task, heldout: list) -> RewardFunctions | None:
    """--reward's functions, each called once on a real problem (the first held-out one) so that a wrong signature or
    return value is refused before training (setup calls this before the model loads); None without --reward."""
    if not cfg.reward:
        return None
    grader = getattr(task, "grader", None)  # --task jsonl built one already: the same functions, called once
    functions = grader if isinstance(grader, RewardFunctions) else RewardFunctions(cfg.reward)
    first = heldout[0]  # a real problem (the held-out set is never empty)
    try:
        functions.check(first.prompt, problem_fields(first), first.answer)
    except RewardError as exc:
        raise Refused(f"--reward: {exc}") from None
    return functions


def from_run(cfg, run) -> UserReward | None:
    if not cfg.reward:
        return None
    functions = getattr(run, "reward_functions", None)  # setup checked them before the model loaded
    if functions is None:
        functions = checked_rewards(cfg, run.task, run.heldout)
    return UserReward(functions, cfg.group_size, cfg.format_reward_weight)
