"""PPO epochs (`--ppo-epochs K`, K > 1): K optimizer passes over each rollout batch. The ratio of the later passes
needs the behaviour policy's log-probs, taken once per step before the first pass with the forward-only op."""

from __future__ import annotations

from ..features.base import Feature
from ..policy import token_logprobs


class PPOEpochs(Feature):
    name = "ppo_epochs"

    def __init__(self, epochs: int, model, temperature: float, backend: str | None, group_size: int,
                 support: dict | None = None):  # fmt: skip
        self.epochs = epochs
        self.model, self.temperature, self.backend, self.group_size = model, temperature, backend, group_size
        self.support = support  # the sampler's top_k / top_p / min_p (Sampling.support())

    def loss_inputs(self, batch, check_targets) -> dict:
        old = token_logprobs(self.model, batch, self.temperature, self.backend, self.group_size, check_targets(),
                             self.support)  # fmt: skip
        return {"old_logp": old}


def from_run(cfg, run) -> PPOEpochs | None:
    if cfg.ppo_epochs <= 1:
        return None
    return PPOEpochs(cfg.ppo_epochs, run.model, cfg.temperature, cfg.backend, cfg.group_size, run.sampling.support())
