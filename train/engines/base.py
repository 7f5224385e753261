"""The rollout-engine interface: what the trainer asks of whatever samples its completions (HF generate, vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass
class Generated:
    """The completions of `len(prompts) * n` rows, prompt-major (rows i*n .. i*n+n-1 belong to prompt i)."""

    completion_ids: Tensor  # (N, T) right-padded with the pad id; tokens after the first EOS are padding
    logprobs: Tensor | None  # (N, T) float32 the sampler's log-probs of those tokens (at the sampling temperature);
    # None when the engine does not return them (HF generate: the trainer's own forward is the sampler)


class RolloutEngine(Protocol):
    """Samples completions for the trainer and follows its weights."""

    name: str  # "hf" or "vllm": the step records' `rollout_engine`

    def generate(
        self,
        prompts: list[str],
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool = False,
        *,
        top_k: int = 0,
        min_p: float = 0.0,
    ) -> Generated:
        """`n` completions of each prompt (chat-formatted text), sampled at `temperature` / `top_p` (and `top_k`,
        `min_p`: 0 = off), or greedy."""
        ...

    def sync(self, model) -> None:
        """Take the trainer's current weights (after every optimizer step; a no-op for an engine that samples from the
        trainer's own model)."""
        ...
