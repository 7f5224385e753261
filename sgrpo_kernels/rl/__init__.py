"""The RL layer: group advantages, GTPO conflict weights, entropy control, the loss config, the GRPO-family policy
loss, presets and per-batch orchestration (``algorithm``), and the fused ``sgrpo_loss`` (hidden states -> loss without
logits). Pure PyTorch on small [B, T] tensors, any device. Reference: docs/rl.md; the design: docs/design.md."""

from sgrpo_kernels.rl.advantages import ADVANTAGE_METHODS, group_advantages
from sgrpo_kernels.rl.algorithm import PRESETS, GroupSignals, parse_overrides, prepare_groups, preset, preset_with
from sgrpo_kernels.rl.config import IMPORTANCE_LEVELS, LOSS_AGGS, LossConfig
from sgrpo_kernels.rl.conflicts import COMBINE_MODES, CONFLICT_DETECTS, CONFLICT_STRATEGIES, conflict_weights
from sgrpo_kernels.rl.entropy import (
    LN2,
    adaptive_entropy_threshold,
    completion_entropy,
    coverage_entropy_threshold,
    entropy_threshold,
    top_entropy_mask,
)
from sgrpo_kernels.rl.fused import sgrpo_loss
from sgrpo_kernels.rl.loss import metrics_to_floats, policy_loss
from sgrpo_kernels.rl.mismatch import logp_mismatch, truncated_importance_weights

__all__ = [
    "ADVANTAGE_METHODS",
    "COMBINE_MODES",
    "CONFLICT_DETECTS",
    "CONFLICT_STRATEGIES",
    "IMPORTANCE_LEVELS",
    "LN2",
    "LOSS_AGGS",
    "PRESETS",
    "GroupSignals",
    "LossConfig",
    "adaptive_entropy_threshold",
    "completion_entropy",
    "coverage_entropy_threshold",
    "conflict_weights",
    "entropy_threshold",
    "group_advantages",
    "logp_mismatch",
    "metrics_to_floats",
    "parse_overrides",
    "policy_loss",
    "prepare_groups",
    "preset",
    "preset_with",
    "sgrpo_loss",
    "top_entropy_mask",
    "truncated_importance_weights",
]
