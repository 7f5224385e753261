"""Dense reward from the ground-truth likelihood (`--dense-reward gt_likelihood`): after each rollout, a wrong
completion's correctness reward 0 becomes P(ground-truth answer | prompt, its own reasoning), computed with the
forward-only op on the policy's hidden states (train/gt_likelihood.py: no logits, no gradient). A correct completion
keeps 1, a format reward is still added, and `correct` is unchanged, so accuracy stays accuracy."""

from __future__ import annotations

import dataclasses

import torch

from ..errors import Refused
from ..features.base import Feature
from ..gt_likelihood import gt_likelihood
from ..rewards import CodeTests, RowAnswer
from ..rollout import Batch, chat_prompts


class DenseReward(Feature):
    name = "dense_reward"

    def __init__(self, model, tok, system_prompt: str | None, group_size: int, backend: str | None):
        self.model, self.tok, self.system_prompt = model, tok, system_prompt
        self.group_size, self.backend = group_size, backend

    def rescore(self, batch: Batch, problems: list) -> Batch:
        g = self.group_size
        wrong = (~batch.correct).nonzero().flatten().tolist()
        likelihood = torch.zeros(len(batch.texts), dtype=torch.float64)
        if wrong:
            prompts = chat_prompts(self.tok, problems, self.system_prompt)
            likelihood[wrong] = gt_likelihood(
                self.model,
                self.tok,
                [prompts[i // g] for i in wrong],
                [batch.texts[i] for i in wrong],
                [str(problems[i // g].answer) for i in wrong],
                backend=self.backend,
            )
        # the likelihood takes the place of the correctness term, which is 0 on exactly these rows
        return dataclasses.replace(batch, rewards=batch.rewards + likelihood.to(batch.rewards.dtype))


def _not_answer_text(run) -> str | None:
    """Why the task's problems have no answer text for the likelihood to score, with what to do (None when they all
    have one): code graded by its tests (a `CodeTests`'s text is the problem's name, "HumanEval/0"), or JSONL rows
    without an answer (a `RowAnswer` graded by --reward, whose text is "")."""
    task = run.task
    for p in [*run.heldout, *getattr(task, "train", ()), *getattr(task, "test", ())]:
        if isinstance(p.answer, CodeTests):
            return f"its problems are code graded by tests (the text it would score is the name {p.answer!r}): use"
        if isinstance(p.answer, RowAnswer) and p.answer.grader is not None:
            where = next(iter(getattr(task, "unanswered", ())), "a row")
            return f"{where} has no answer (answer/solution), only --reward to grade it: give every row one, or use"
    return None


def from_run(cfg, run) -> DenseReward | None:
    if cfg.dense_reward != "gt_likelihood":
        return None
    why = _not_answer_text(run)
    if why is not None:  # the likelihood of a non-answer would be the reward of every wrong completion
        raise Refused(
            f"--dense-reward gt_likelihood with --task {cfg.task}: the dense reward is the likelihood of the "
            f"ground-truth answer's text, and {why} --dense-reward none with this task"
        )
    return DenseReward(run.model, run.tok, run.system_prompt, cfg.group_size, cfg.backend)
