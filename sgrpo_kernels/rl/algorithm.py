"""The algorithm level of the RL layer: named presets (a :class:`LossConfig` per GRPO-family algorithm) and the
per-batch orchestration preset -> advantages -> conflict weights -> loss.

A trainer runs one step as::

    cfg = rl.preset("s_grpo")
    groups = rl.prepare_groups(cfg, rewards, completion_ids, completion_mask, G)      # advantages, conflict weights
    loss, metrics = sgrpo_loss(hidden, weight, completion_ids, groups.advantages, completion_mask, cfg,
                               **groups.loss_kwargs())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from sgrpo_kernels.rl.config import LossConfig

__all__ = ["FIELD_PRESETS", "PRESETS", "GroupSignals", "parse_overrides", "prepare_groups", "preset", "preset_with"]


# ------------------------------------------------------------------------------------------------ orchestration


@dataclass(frozen=True)
class GroupSignals:
    """What the algorithm derives from whole groups before the loss (groups are contiguous: rows g*G .. g*G+G-1).

    advantages: ``[B]``; token_weights / conflict_counts: ``[B, T]`` / ``[B]`` GTPO conflict weights and counts, None
    without a conflict strategy; stats: the advantage statistics as 0-d tensors (``group_advantages(...,
    return_stats=True)``); rewards and group_size: kept for the losses that need them (the adaptive and coverage
    entropy filters).
    """

    advantages: Tensor
    token_weights: Tensor | None
    conflict_counts: Tensor | None
    stats: dict[str, Tensor]
    rewards: Tensor
    group_size: int

    def loss_kwargs(self) -> dict:
        """The keyword arguments of :func:`~sgrpo_kernels.rl.policy_loss` / ``sgrpo_loss`` that come from the groups."""
        return dict(token_weights=self.token_weights, conflict_counts=self.conflict_counts, rewards=self.rewards,
                    group_size=self.group_size)


def prepare_groups(
    config: LossConfig, rewards: Tensor, completion_ids: Tensor, completion_mask: Tensor, group_size: int
) -> GroupSignals:
    """Advantages (``config.advantage_method``) and conflict weights (``config.conflict_strategy``) of a batch of whole
    groups, in one call: the trainer passes rewards and the group size once."""
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig (see sgrpo_kernels.rl.preset), got {type(config).__name__}")
    for name, x in (("completion_ids", completion_ids), ("completion_mask", completion_mask)):
        if not isinstance(x, Tensor) or x.dim() != 2:
            got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"prepare_groups: {name} must be a [B, T] tensor, got {got}")
    if isinstance(rewards, Tensor) and rewards.dim() == 1 and rewards.shape[0] != completion_ids.shape[0]:
        raise ValueError(f"prepare_groups: rewards has shape {tuple(rewards.shape)}, expected "
                         f"({completion_ids.shape[0]},) (one reward per completion: B from completion_ids)")
    adv, stats = config.advantages(rewards, group_size, return_stats=True)
    weights, counts = config.conflict_weights(completion_ids, completion_mask, adv, group_size)
    if not rewards.is_floating_point():  # int / bool rewards (accepted above) as the loss's filters take them
        rewards = rewards.to(adv.dtype)
    return GroupSignals(adv, weights, counts, stats, rewards, group_size)


# ------------------------------------------------------------------------------------------------------ presets

# GTPO's conflict rule (paper and official code): tokens shared at the same position by completions of opposite
# advantage sign, on prefix and suffix runs; lambda 2 on the positive side, 0 on the negative side, prefix x suffix.
_GTPO_CONFLICTS = dict(conflict_strategy="gtpo", conflict_w_pos=2.0, conflict_w_neg=0.0, conflict_combine="product")
# S-GRPO's reading (seed): the same rule, positive side kept at 1 ("reduce gradient on conflicts"), negative masked.
_SGRPO_CONFLICTS = {**_GTPO_CONFLICTS, "conflict_w_pos": 1.0}


def _grpo() -> LossConfig:
    # DeepSeekMath (arXiv 2402.03300); TRL GRPOTrainer (beta 0.04 was TRL's default until v0.18, epsilon 0.2).
    return LossConfig(
        name="grpo",
        advantage_method="grpo",
        beta=0.04,
        epsilon_low=0.2,
        epsilon_high=0.2,
        loss_agg="seq-mean-token-mean",
    )


def _dr_grpo() -> LossConfig:
    # Dr. GRPO, "Understanding R1-Zero-Like Training" (arXiv 2503.20783): no std division, no length normalization:
    # sum / (B * max_completion_length) (TRL loss_type="dr_grpo"; T of the batch when max_completion_length is None).
    return LossConfig(name="dr_grpo", advantage_method="dr_grpo", beta=0.0, loss_agg="seq-mean-token-sum-norm")


def _dapo() -> LossConfig:
    # DAPO (arXiv 2503.14476): clip-higher 0.2 / 0.28, token-level loss, no KL. Dynamic sampling and overlong reward
    # shaping are trainer-side (rollout filtering / reward), not part of the loss.
    return LossConfig(
        name="dapo", advantage_method="grpo", beta=0.0, epsilon_low=0.2, epsilon_high=0.28, loss_agg="token-mean"
    )


def _gspo() -> LossConfig:
    # GSPO (arXiv 2507.18071): sequence-level geometric-mean ratio, clip 3e-4 / 4e-4, no KL.
    return LossConfig(
        name="gspo",
        advantage_method="grpo",
        beta=0.0,
        importance_level="sequence",
        epsilon_low=3e-4,
        epsilon_high=4e-4,
        loss_agg="seq-mean-token-mean",
    )


def _gtpo() -> LossConfig:
    # GTPO as written in the paper (arXiv 2508.03772): GRPO advantages, conflict tokens get lambda 2 (positive) / 0
    # (negative) on prefix and suffix runs, completions with <H>_i > ln 2 filtered, entropy regularization
    # gamma * <H>_i (gamma = 0.1) as a differentiable loss term, no KL, no reference model.
    return LossConfig(
        name="gtpo",
        advantage_method="grpo",
        **_GTPO_CONFLICTS,
        beta=0.0,
        loss_agg="seq-mean-token-mean",
        entropy_filter="ln2",
        entropy_coef=-0.1,
    )


def _gtpo_official() -> LossConfig:
    # The official GTPO code (github.com/winstonsmith1897/GTPO): A = r - mean (std division commented out), entropy as
    # a detached advantage shift A - 0.1 * <H>_i applied where <H>_i <= 0.7 (else A = 0), per-completion loss divided
    # by max(1, n_conflict_i), summed over completions, on-policy ratio, beta = 0.
    return LossConfig(
        name="gtpo_official",
        advantage_method="dr_grpo",
        **_GTPO_CONFLICTS,
        conflict_count_norm=True,
        beta=0.0,
        loss_agg="seq-sum-token-mean",
        entropy_filter=0.7,
        entropy_advantage_shift=0.1,
    )


def _s_grpo() -> LossConfig:
    # S-GRPO as its design notes define it: GRPO advantages, high-entropy completions filtered (ln 2), conflict
    # tokens of negative completions masked and positive ones kept at 1 ("reduce gradient on conflicts";
    # set conflict_w_pos=2.0 for GTPO's amplification), optional positive_only (off), entropy floor
    # lambda_H * max(0, H_min - H) with H_min = 0.3 nats, lambda_H = 0.1 (project defaults), no reference model.
    return LossConfig(
        name="s_grpo",
        advantage_method="grpo",
        **_SGRPO_CONFLICTS,
        beta=0.0,
        entropy_filter="ln2",
        entropy_floor=0.3,
        entropy_penalty_coef=0.1,
        positive_only=False,
    )


def _s_grpo_afn() -> LossConfig:
    # S-GRPO (as s_grpo) + the negative advantage for all-fail groups proposed in the S-GRPO design notes:
    # groups whose rewards are all <= r_min (0) get A = -c instead of 0, so consistently failing modes are pushed down
    # (an exploration driver where GRPO has no gradient; NGRPO is the related published method). c = 1: one group
    # standard deviation, the scale of a GRPO advantage in a mixed group. Mixed groups keep GRPO advantages.
    return dataclasses.replace(_s_grpo(), name="s_grpo_afn", advantage_method="all_fail_negative", all_fail_c=1.0)


def _grpo_ef() -> LossConfig:
    # S-GRPO ablation (seed): reference-free GRPO + entropy floor only.
    return LossConfig(name="grpo_ef", advantage_method="grpo", beta=0.0, entropy_floor=0.3, entropy_penalty_coef=0.1)


def _grpo_tc() -> LossConfig:
    # S-GRPO ablation (seed): reference-free GRPO + token-conflict handling only (same conflict settings as s_grpo).
    return LossConfig(
        name="grpo_tc",
        advantage_method="grpo",
        beta=0.0,
        **_SGRPO_CONFLICTS,
    )


def _lite_ppo() -> LossConfig:
    # Lite PPO, "Tricks or Traps? A Deep Dive into RL for LLM Reasoning" (arXiv 2508.08221): group-mean / batch-std
    # advantages and token-level loss aggregation, vanilla PPO clip 0.2, no KL.
    return LossConfig(name="lite_ppo", advantage_method="lite_ppo", beta=0.0, loss_agg="token-mean")


def _field(name: str, **fields) -> Callable[[], LossConfig]:
    """A preset of the field's losses (:mod:`sgrpo_kernels.rl.field_losses`): GRPO advantages, no KL, and verl
    0.9.1's defaults for its loss mode (``ActorConfig``: clip_ratio 0.2, clip_ratio_c 3.0, tau_pos 1.0, tau_neg 1.05,
    loss_agg_mode token-mean; ``PolicyLossConfig``: clip_cov_ratio / kl_cov_ratio 2e-4, clip_cov_lb 1, clip_cov_ub
    5, ppo_kl_coef 0.1). Where the papers or TRL differ: docs/rl.md, "The field's losses"."""

    def make() -> LossConfig:
        return LossConfig(name=name, advantage_method="grpo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                          **fields)  # fmt: skip

    make.__name__ = f"_{name}"
    return make


# Kept apart from PRESETS (the GRPO family, whose losses make no host sync): Clip-Cov and KL-Cov choose tokens by a
# data-dependent count, which reads the batch on the host. preset() and preset_with() take names from both.
FIELD_PRESETS: dict[str, Callable[[], LossConfig]] = {
    # DPPO (arXiv 2602.04879), verl dppo_tv / dppo_kl: epsilon = the divergence thresholds, C = clip_ratio_c
    "dppo_tv": _field("dppo_tv", policy_term="dppo_tv", dppo_ratio_cap=3.0, loss_agg="token-mean"),
    "dppo_kl": _field("dppo_kl", policy_term="dppo_kl", dppo_ratio_cap=3.0, loss_agg="token-mean"),
    # CISPO (MiniMax-M1, arXiv 2506.13585), verl cispo: the weight clipped to [1 - 0.2, 1 + 0.2]
    "cispo": _field("cispo", policy_term="cispo", loss_agg="token-mean"),
    # SAPO (arXiv 2511.20347), verl sapo: always seq-mean-token-mean in verl
    "sapo": _field("sapo", policy_term="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05, loss_agg="seq-mean-token-mean"),
    # GMPO (arXiv 2507.20673), verl geo_mean: a mean over completions of the sequence term
    "gmpo": _field("gmpo", policy_term="gmpo", loss_agg="seq-mean-token-mean"),
    # Clip-Cov / KL-Cov (arXiv 2505.22617), verl clip_cov / kl_cov
    "clip_cov": _field("clip_cov", policy_term="clip_cov", cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
                       loss_agg="token-mean"),
    "kl_cov": _field("kl_cov", policy_term="kl_cov", cov_ratio=2e-4, kl_cov_coef=0.1, loss_agg="token-mean"),
}


PRESETS: dict[str, Callable[[], LossConfig]] = {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "dapo": _dapo,
    "gspo": _gspo,
    "gtpo": _gtpo,
    "gtpo_official": _gtpo_official,
    "s_grpo": _s_grpo,
    "s_grpo_afn": _s_grpo_afn,
    "grpo_ef": _grpo_ef,
    "grpo_tc": _grpo_tc,
    "lite_ppo": _lite_ppo,
}


def parse_value(text: str):
    """One override value: JSON when it parses (numbers, true/false), none/null -> None, a float spelling (nan,
    inf) -> that float, else the string itself."""
    import json

    if text.strip().lower() in ("none", "null"):
        return None
    if text.strip() in ("True", "False"):  # Python's spelling of JSON's true / false
        return text.strip() == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:  # nan, inf, -inf: a number that the field's own check then refuses by its value, not as text
        return float(text)
    except ValueError:
        text = text.strip()
        return text[1:-1] if len(text) > 1 and text[0] == text[-1] == "'" else text  # 'ln2' as ln2


def _items(text: str) -> list[str]:
    """`text` split at its top-level commas: not inside {...} / [...] or a "string" (a JSON value may hold commas)."""
    items, start, depth, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "{[":
            depth += 1
        elif not quoted and ch in "}]":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            items.append(text[start:i])
            start = i + 1
    return [*items, text[start:]]


def parse_overrides(text: str) -> dict:
    """``"field=value,..."`` (the bundled trainer's ``--loss`` and the TRL integration's ``sgrpo_loss``) -> a dict of
    LossConfig changes. Field names are checked by :func:`preset_with`, values by ``LossConfig`` itself."""
    if not isinstance(text, str):
        raise TypeError(f"overrides must be a 'field=value,...' string, got {type(text).__name__} {text!r}")
    out = {}
    for item in filter(None, (x.strip() for x in _items(text))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{item!r} is not field=value")
        if key.strip() in out:
            raise ValueError(f"{key.strip()!r} is given twice in {text!r}: give each field once")
        out[key.strip()] = parse_value(value.strip())
    return out


def preset_with(name: str, overrides: str | dict = "") -> LossConfig:
    """The preset `name` with `overrides` (a ``"field=value,..."`` string or a dict) applied and validated."""
    if not isinstance(overrides, str | dict):
        raise TypeError(f"overrides must be a 'field=value,...' string or a dict, got {type(overrides).__name__} "
                        f"{overrides!r}")  # fmt: skip
    changes = parse_overrides(overrides) if isinstance(overrides, str) else dict(overrides)
    known = {f.name for f in dataclasses.fields(LossConfig)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ValueError(f"unknown LossConfig field(s) {unknown}; expected names from {sorted(known)}")
    return dataclasses.replace(preset(name), **changes)


def preset(name: str) -> LossConfig:
    """The :class:`LossConfig` of a named algorithm: one of :data:`PRESETS` (``grpo``, ``dr_grpo``, ``dapo``, ``gspo``,
    ``gtpo`` (paper), ``gtpo_official`` (official code), ``s_grpo``, ``s_grpo_afn`` (S-GRPO + negative advantage for
    all-fail groups), ``grpo_ef``, ``grpo_tc``, ``lite_ppo``, and the field's losses ``dppo_tv``, ``dppo_kl``,
    ``cispo``, ``sapo``, ``gmpo``, ``clip_cov``, ``kl_cov``)."""
    if not isinstance(name, str):
        raise TypeError(f"preset name must be a string, got {type(name).__name__}")
    make = PRESETS.get(name) or FIELD_PRESETS.get(name)
    if make is None:
        raise ValueError(f"unknown preset {name!r}; expected one of {tuple(PRESETS) + tuple(FIELD_PRESETS)}")
    return make()
