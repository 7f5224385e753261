"""The RL layer: group advantages, GTPO conflict weights, entropy control, the loss config, the GRPO-family policy
loss and the field's other policy terms, presets and per-batch orchestration (``algorithm``), the fused
``sgrpo_loss`` (hidden states -> loss without logits), sampler-mismatch importance weights, and the trust region on
parameters (``TrustRegion``: a cap on each optimizer step's size).
Pure PyTorch on small [B, T] tensors, any device. Reference: docs/rl.md; the design: docs/design.md."""

from sgrpo_kernels.rl.advantages import ADVANTAGE_METHODS, group_advantages
from sgrpo_kernels.rl.algorithm import (
    FIELD_PRESETS,
    PRESETS,
    GroupSignals,
    parse_overrides,
    prepare_groups,
    preset,
    preset_with,
)
from sgrpo_kernels.rl.config import IMPORTANCE_LEVELS, LOSS_AGGS, POLICY_TERMS, LossConfig
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
from sgrpo_kernels.rl.sampler_is import SAMPLER_IS_MODES, off_policy_sequence_mask, sampler_importance_weights
from sgrpo_kernels.rl.trust_region import TrustRegion, TrustRegionStep, project_step, step_norm

__all__ = [
    "ADVANTAGE_METHODS",
    "COMBINE_MODES",
    "FIELD_PRESETS",
    "CONFLICT_DETECTS",
    "CONFLICT_STRATEGIES",
    "IMPORTANCE_LEVELS",
    "LN2",
    "LOSS_AGGS",
    "POLICY_TERMS",
    "PRESETS",
    "SAMPLER_IS_MODES",
    "GroupSignals",
    "LossConfig",
    "TrustRegion",
    "TrustRegionStep",
    "adaptive_entropy_threshold",
    "completion_entropy",
    "coverage_entropy_threshold",
    "conflict_weights",
    "entropy_threshold",
    "group_advantages",
    "logp_mismatch",
    "metrics_to_floats",
    "off_policy_sequence_mask",
    "parse_overrides",
    "policy_loss",
    "prepare_groups",
    "project_step",
    "preset",
    "preset_with",
    "sampler_importance_weights",
    "sgrpo_loss",
    "step_norm",
    "top_entropy_mask",
    "truncated_importance_weights",
]
