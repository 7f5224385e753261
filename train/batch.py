"""The data of one training step, at the bottom of the trainer (it imports nothing of it): how the rollouts sample
(`Sampling`), the rollout batch (`Batch`, with `completion_mask`), and what the optimizer passes of the batch left
(`Update`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How the training rollouts sample (`rollout`'s keyword arguments; the loss uses the same temperature)."""

    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    system_prompt: str | None
    format_weight: float
    top_k: int = 0
    min_p: float = 0.0

    @classmethod
    def of(cls, cfg, system_prompt: str | None, group_size: int | None = None, format_weight: float = 0.0):
        """The sampling of a trainer configuration (`cfg.group_size` unless `group_size` is given)."""
        n = cfg.group_size if group_size is None else group_size
        return cls(n, cfg.max_new_tokens, cfg.temperature, cfg.top_p, system_prompt, format_weight, cfg.top_k,
                   cfg.min_p)  # fmt: skip

    def kwargs(self) -> dict:
        """`rollout`'s keyword arguments."""
        return dataclasses.asdict(self)

    def support(self) -> dict:
        """The sampler's support as the ops' keyword arguments (`linear_logprobs`, `sgrpo_loss`): only the options that
        truncate, so that a run without them calls the ops exactly as before."""
        out: dict = {}
        if self.top_k:
            out["top_k"] = self.top_k
        if self.top_p < 1:
            out["top_p"] = self.top_p
        if self.min_p:
            out["min_p"] = self.min_p
        return out


@dataclass
class Batch:
    """B * G completions; rows g*G .. g*G+G-1 belong to prompt g (the RL layer's group layout)."""

    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded; the first EOS is kept (the policy learns to stop)
    completion_mask: Tensor  # (N, T) bool
    texts: list[str]
    rewards: Tensor  # (N,) float32
    correct: Tensor  # (N,) bool
    sampler_logp: Tensor | None = None  # (N, T) float32 the sampler's log-probs of completion_ids (vLLM, or HF under
    # --mixed-precision); None: HF generate, whose forward is the trainer's


def completion_mask(ids: Tensor, eos_ids: set[int]) -> Tensor:
    """Valid tokens: everything up to and including the first EOS of each row."""
    is_eos = torch.zeros_like(ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= ids == e
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    return ~after


@dataclass
class Update:
    """What the optimizer passes of one batch left."""

    metrics: dict[str, Tensor] | None = None  # sgrpo_loss metrics of the last pass (also a skipped one)
    grad_norm: float = math.nan  # pre-clip norm of the last pass that got a gradient; nan when none did
    skipped: int = 0  # passes whose update was dropped (non-finite loss, gradient, or weights after the step)
    rollout_logp_diff: float | None = None  # mean |sampler - trainer| log-prob of the sampled tokens; None: no
    # sampler log-probs (HF generate samples from the trainer's own forward)
    rollout_ratio_mean: float | None = None  # mean pi_trainer / pi_sampler of the sampled tokens (None: as above)
    rollout_ratio_outside: float | None = None  # fraction of them with that ratio outside [0.9, 1.1]
    notes: list[str] = field(default_factory=list)  # what was skipped and why, for the log
    applied: bool = False  # an optimizer step of this batch changed the weights (and was not undone)
    # the policy's log-probs [N, T] before the update (detached): the PPO epochs' old log-probs, else the first pass's
    # own; set when the sampler correction (a vLLM rollout) or a feature (`Feature.wants_old_logp`) needs them
    old_logp: Tensor | None = None

    def skip(self, note: str) -> None:
        self.skipped += 1
        self.notes.append(note)
