"""The RL layer: group advantages, GTPO conflict weights, entropy control, GRPO-family policy losses, presets, and the
fused ``sgrpo_loss`` (hidden states -> loss without logits). Pure PyTorch on small [B, T] tensors, any device."""

from sgrpo_kernels.rl.advantages import ADVANTAGE_METHODS, group_advantages
from sgrpo_kernels.rl.conflicts import COMBINE_MODES, CONFLICT_STRATEGIES, conflict_weights
from sgrpo_kernels.rl.entropy import (
    LN2,
    adaptive_entropy_threshold,
    completion_entropy,
    entropy_threshold,
    top_entropy_mask,
)
from sgrpo_kernels.rl.fused import sgrpo_loss
from sgrpo_kernels.rl.loss import IMPORTANCE_LEVELS, LOSS_AGGS, LossConfig, policy_loss
from sgrpo_kernels.rl.presets import PRESETS, preset

__all__ = [
    "ADVANTAGE_METHODS",
    "COMBINE_MODES",
    "CONFLICT_STRATEGIES",
    "IMPORTANCE_LEVELS",
    "LN2",
    "LOSS_AGGS",
    "PRESETS",
    "LossConfig",
    "adaptive_entropy_threshold",
    "completion_entropy",
    "conflict_weights",
    "entropy_threshold",
    "group_advantages",
    "policy_loss",
    "preset",
    "sgrpo_loss",
    "top_entropy_mask",
]
